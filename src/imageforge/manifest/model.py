"""The build manifest as frozen dataclasses: what build.yaml says, handed downstream.

:func:`imageforge.manifest.load.load_manifest` reads and checks build.yaml and builds these; nothing downstream
sees the YAML. The in-image path rules (package-relative destinations, no ``..``) are here too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from .. import settings
from ..errors import ConfigError, Location
from .tolerances import EquivSettings
from .yaml_messages import did_you_mean
from .yamldoc import YamlDocument

DEFAULT_MANIFEST = settings.DEFAULT_MANIFEST
#: A step kind's name: a key of the registry in :mod:`imageforge.steps` (each kind's class, registered by name).
#: A plain str on purpose: the names are the registry's, checked when build.yaml is loaded (the schema's kind
#: enum is made from the registry), so adding a kind edits no list of names here.
StepKindName = str


def frozen_map(data: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(data or {}))


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class BaseSpec:
    """Where the target's base image comes from: a reference (maybe ``${VAR}``) or a recipe."""

    image: str | None
    image_env: str | None
    image_id: str | None
    recipe: Path | None
    load_hint: str | None

    def reference(self, environ: Mapping[str, str]) -> str | None:
        """The image reference, with ``${VAR}`` read from ``environ`` (None when unset)."""
        if self.image_env is not None:
            value = environ.get(self.image_env, "").strip()
            return value or None
        return self.image


@dataclass(frozen=True)
class PackageSpec:
    import_name: str
    distribution: str
    version: str
    flags: str | None = None  # introspect | static | off; None: by the base (imageforge.flags.images.flag_method)


@dataclass(frozen=True)
class Volume:
    """A run volume: a host path bound into the container (``bind``), or a named Docker volume (``volume``: the
    daemon makes it on first use and keeps it between containers; in place, where there is no Docker, it is not
    mounted and the process uses its own filesystem)."""

    source: str
    target: str
    read_only: bool
    type: Literal["bind", "volume"] = "bind"

    @property
    def named(self) -> bool:
        return self.type == "volume"


@dataclass(frozen=True)
class RunOptions:
    shm_size: str | None = None
    ipc: str | None = None
    gpus: str | int | None = None
    devices: tuple[str, ...] = ()
    privileged: bool = False
    volumes: tuple[Volume, ...] = ()
    ulimits: Mapping[str, tuple[int, int]] = field(default_factory=lambda: frozen_map({}))
    env: Mapping[str, str] = field(default_factory=lambda: frozen_map({}))
    port: int = 8000


SpecT = TypeVar("SpecT", bound="StepSpec")


@dataclass(frozen=True)
class StepSpec:
    """A step kind's fields, typed: each kind's frozen subclass (``steps/<kind>.py``) names them with their defaults.

    What the manifest set or the kind defaulted is the step's definition (its cache key); a field left None is
    one the manifest left out (no kind's field takes None as a value).
    """

    @property
    def host_file(self) -> str | None:
        """The host file the step reads (``source``, relative to the manifest, normalised): a cache-key input."""
        return None

    @property
    def host_directory(self) -> str | None:
        """The host folder the step copies (``directory`` as written: a path or a whole ``${VAR}``)."""
        return None

    def definition(self) -> dict[str, Any]:
        """The fields that are set, by name, as JSON values (tuples as lists, mappings as dicts)."""
        out: dict[str, Any] = {}
        for name in sorted(f.name for f in fields(self)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[name] = value
        return out

    @classmethod
    def of(cls: type[SpecT], step: Step) -> SpecT:
        """``step``'s spec as this kind's class (a ConfigError when the step is of another kind)."""
        if not isinstance(step.spec, cls):
            raise ConfigError(f"step {step.id!r} (kind {step.kind}) has no {cls.__name__}",
                              location=step.location, key_path=step.key_path)
        return step.spec


@dataclass(frozen=True)
class Step:
    """One ordered build step. ``spec`` holds the kind's fields (already validated), typed by the kind."""

    id: str
    kind: StepKindName
    why: str | None
    location: Location
    key_path: str
    profile: str | None
    spec: StepSpec
    source_path: Path | None = None  # absolute host path of an overlay/script source
    field_locations: Mapping[str, Location] = field(default_factory=lambda: frozen_map({}))
    # Forensics metadata (bisect/ablate): not in ``spec``, so not in the cache key -- they change no image.
    requires: tuple[str, ...] = ()  # ids of earlier steps this one needs
    required: bool = False  # the image is wrong without it: ablate never removes it
    # script steps with a `directory`: a whole ${VAR} (read at plan/build time) or a host path
    directory_env: str | None = None
    directory_path: Path | None = None
    load_hint: str | None = None
    # script steps: what the script may change (`apply --in-place` copies these before it runs, diffs after);
    # image paths, relative ones under the package's site directory. Not in ``spec``: no image changes with it.
    touches: tuple[str, ...] = ()

    def directory(self, environ: Mapping[str, str]) -> Path | None:
        """The host directory of a directory script step (None when its ${VAR} is unset)."""
        if self.directory_env is not None:
            value = environ.get(self.directory_env, "").strip()
            return Path(value).resolve() if value else None
        return self.directory_path

    def where(self, key: str) -> Location:
        """Location of one of the step's keys (the step itself when unknown)."""
        return self.field_locations.get(key, self.location)

    @property
    def source(self) -> Path:
        if self.source_path is None:
            raise AttributeError(f"step {self.id!r} ({self.kind}) has no source file")
        return self.source_path

    def definition(self) -> dict[str, Any]:
        """Canonical definition (what enters the cache key): no locations, no host paths."""
        return {"id": self.id, "kind": self.kind, **self.spec.definition()}


ServingStyle = Literal["config", "argv"]


@dataclass(frozen=True)
class ServingSpec:
    config_path: str
    command: tuple[str, ...]
    args: Mapping[str, Any]
    env: Mapping[str, str]
    reasons: Mapping[str, str]
    # "argv": CMD is command + every flag (computility-run.yaml's list); "config": command --config FILE
    style: ServingStyle = "config"
    flag_names: Mapping[str, str] = field(default_factory=lambda: frozen_map({}))
    negatable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Profile:
    name: str
    extends: str | None
    why: str | None
    args: Mapping[str, Any]
    env: Mapping[str, str]
    reasons: Mapping[str, str]
    steps: tuple[Step, ...]
    location: Location


@dataclass(frozen=True)
class VerifySpec:
    imports: tuple[str, ...]
    import_env: Mapping[str, str]


@dataclass(frozen=True)
class ReplaySettings:
    """How ``bench --replay`` treats a target: the evaluator's time cap (seconds from the first request sent;
    None: the bench's --duration) and the redline sources that exit 4 (``competition``, ``harness``)."""

    time_cap: float | None = None
    gate: tuple[str, ...] = ()


@dataclass(frozen=True)
class SmokeSettings:
    suite: Path | None
    tags: tuple[str, ...]
    startup_timeout: float


@dataclass(frozen=True)
class Target:
    name: str
    description: str | None
    base: BaseSpec
    package: PackageSpec
    image: str
    run: RunOptions
    steps: tuple[Step, ...]
    verify: VerifySpec
    serving: ServingSpec
    profiles: Mapping[str, Profile]
    default_profile: str | None
    smoke: SmokeSettings
    equiv: EquivSettings = field(default_factory=EquivSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)

    def profile_chain(self, name: str) -> tuple[Profile, ...]:
        """``name`` and its ``extends`` ancestors, root first."""
        chain: list[Profile] = []
        current: str | None = name
        while current is not None:
            profile = self.profiles[current]
            chain.append(profile)
            current = profile.extends
        return tuple(reversed(chain))


@dataclass(frozen=True)
class Manifest:
    path: Path
    root: Path
    digest: str
    default_target: str
    targets: Mapping[str, Target]
    document: YamlDocument = field(repr=False, compare=False)

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    def target(self, name: str | None) -> Target:
        name = name or self.default_target
        if name not in self.targets:
            raise ConfigError(
                f"unknown target {name!r}",
                location=self.document.location(("targets",)),
                key_path="targets",
                expected="one of " + ", ".join(repr(t) for t in self.targets),
                found=repr(name),
                hint=did_you_mean(name, self.targets) or "list targets with `invoke validate`",
            )
        return self.targets[name]


# --------------------------------------------------------------------------- path checks


def package_relative(dest: str) -> bool:
    return not dest.startswith("/")


def normalise_image_path(dest: str) -> str | None:
    """Normalise a path inside the image; None when it escapes its root (``..``)."""
    if "\\" in dest or "\x00" in dest:
        return None
    absolute = dest.startswith("/")
    parts: list[str] = []
    for part in dest.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(part)
    if not parts:
        return None
    joined = "/".join(parts)
    # Any '..' at all in a destination is refused: it is never needed and hides intent.
    if ".." in dest.split("/"):
        return None
    return "/" + joined if absolute else joined


def resolve_image_path(path: str, site_dir: str) -> str:
    """Absolute in-image path of a step path (relative paths live under the package's site dir)."""
    if path.startswith("/"):
        return posixpath.normpath(path)
    return posixpath.normpath(posixpath.join(site_dir, path))
