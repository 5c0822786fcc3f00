"""Load and validate build.yaml in one place: the frozen :mod:`imageforge.manifest.model` comes out.

Three passes, each reporting every problem it finds:

1. safe YAML load with positions (:mod:`imageforge.manifest.yamldoc`);
2. JSON Schema ``build.schema.json`` (top-level ``schema/``, package data in the wheel; strict: unknown
   keys -> "did you mean");
3. semantic checks: default target/profile exist, step ids unique, sources exist,
   destinations stay inside their root, ``extends`` resolves without cycles,
   a patch's ``old`` differs from ``new``, a step's ``requires:`` names only EARLIER step ids
   (so the requirement graph has no cycles), the ``equiv:`` block is consistent.

Patch anchors are not checked here: that needs the real image (build, check-patches).
Nothing here imports docker or needs a daemon.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import settings
from ..errors import ConfigError, ErrorCollector
from ..steps import kind
from ..steps.schema import manifest_schema
from .model import (
    DEFAULT_MANIFEST,
    BaseSpec,
    Manifest,
    PackageSpec,
    Profile,
    ReplaySettings,
    RunOptions,
    ServingSpec,
    SmokeSettings,
    Step,
    StepKindName,
    Target,
    VerifySpec,
    Volume,
    frozen_map,
    normalise_image_path,
    package_relative,
)
from .tolerances import equiv_settings
from .yaml_messages import did_you_mean
from .yaml_schema import validate_schema
from .yamldoc import YamlDocument, load_yaml_c

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class _Builder:
    def __init__(self, doc: YamlDocument) -> None:
        self.doc = doc
        self.root = doc.path.resolve().parent
        self.errors = ErrorCollector()

    def problem(self, key_path: tuple[str | int, ...], message: str, **kw: str | None) -> None:
        self.errors.add(self.doc.problem(key_path, message, **kw))

    # -- sources --------------------------------------------------------------

    def check_source(self, kp: tuple[str | int, ...], source: str) -> Path:
        path = (self.root / source).resolve()
        if not path.exists():
            self.problem(
                kp,
                "source file does not exist",
                expected=f"a file at {self.root / source}",
                found="nothing there",
                hint="paths are relative to the manifest's directory",
            )
        elif not path.is_file():
            self.problem(kp, "source is not a regular file", found=str(path))
        else:
            try:
                path.relative_to(self.root)
            except ValueError:
                self.problem(
                    kp,
                    "source escapes the manifest's directory",
                    expected=f"a file under {self.root}",
                    found=str(path),
                    hint="keep overlays and scripts inside the repository (symlinks are resolved)",
                )
        return path

    def env(self, kp: tuple[str | int, ...], raw: Mapping[str, Any] | None) -> Mapping[str, str]:
        """Environment values as the file spells them: ``true`` stays ``true``, ``010`` stays ``010``."""
        out: dict[str, str] = {}
        for name, value in (raw or {}).items():
            written = None if isinstance(value, str) else self.doc.written((*kp, name))
            out[name] = value if isinstance(value, str) else (written if written is not None else str(value))
        return frozen_map(out)

    def check_dest(
        self, kp: tuple[str | int, ...], dest: str, package: PackageSpec, source: str | None = None
    ) -> str:
        if dest.endswith("/"):
            key = str(kp[-1])
            example = f"{dest}{posixpath.basename(source)}" if source else f"{dest}NAME.py"
            self.problem(
                kp,
                f"{key} names a file; add the file name",
                expected=f"a file path, e.g. {example!r}",
                found=f"{dest!r} (a directory)",
                hint="imageforge writes exactly the path given; it never guesses a name inside a directory",
            )
            return dest
        norm = normalise_image_path(dest)
        if norm is None:
            self.problem(
                kp,
                "destination escapes its root",
                expected="a path without '..' (relative to the package's site directory, or absolute)",
                found=repr(dest),
            )
            return dest
        if package_relative(norm):
            top = norm.split("/", 1)[0]
            if top != package.import_name:
                self.problem(
                    kp,
                    "relative destination is outside the package",
                    expected=f"a path starting with '{package.import_name}/' (or an absolute path)",
                    found=repr(dest),
                    hint=f"relative paths live in the site directory that holds '{package.import_name}/'",
                )
        return norm

    # -- steps ----------------------------------------------------------------

    def step(
        self, kp: tuple[str | int, ...], raw: Mapping[str, Any], package: PackageSpec, profile: str | None
    ) -> Step:
        name: StepKindName = raw["kind"]  # one of the registry's (the schema's enum is made from it)
        spec: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("id", "kind", "why", "requires", "required")}
        source_path: Path | None = None
        if "source" in raw:
            source_path = self.check_source((*kp, "source"), raw["source"])
            spec["source"] = posixpath.normpath(raw["source"])
        loaded = kind(name).load(raw, spec, _StepChecks(self, kp, package))  # the kind's own fields and defaults
        return Step(
            id=raw["id"],
            kind=name,
            why=raw.get("why"),
            location=self.doc.location(kp),
            key_path=".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in kp).replace(".[", "["),
            profile=profile,
            spec=loaded.spec,
            source_path=source_path,
            field_locations=frozen_map({k: self.doc.location((*kp, k)) for k in raw}),
            requires=tuple(raw.get("requires", ())),
            required=bool(raw.get("required", False)),
            directory_env=loaded.directory_env,
            directory_path=loaded.directory_path,
            load_hint=raw.get("load_hint"),
            touches=tuple(posixpath.normpath(str(t)) for t in raw.get("touches", ())),
        )

    def check_directory(self, kp: tuple[str | int, ...], directory: str) -> tuple[str | None, Path | None]:
        """(variable name, None) for a whole ``${VAR}``; (None, absolute path) for a checked host directory."""
        m = _ENV_REF.match(directory)
        if m:
            return m.group(1), None
        if "$" in directory:
            self.problem(kp, "only a whole '${VAR}' may be used here", expected="a directory path or '${VAR}'",
                         found=repr(directory))
            return None, None
        path = (self.root / directory).resolve()
        if not path.is_dir():
            self.problem(kp, "directory does not exist", expected=f"a directory at {self.root / directory}",
                         found="nothing there" if not path.exists() else "not a directory",
                         hint="paths are relative to the manifest's directory; or use '${VAR}'")
        return None, path

    # -- target ---------------------------------------------------------------

    def target(self, name: str, raw: Mapping[str, Any]) -> Target:
        kp: tuple[str | int, ...] = ("targets", name)
        b = raw["base"]
        image = b.get("image")
        image_env = None
        if image is not None:
            m = _ENV_REF.match(image)
            if m:
                image_env = m.group(1)
                image = None
            elif "$" in image:
                self.problem((*kp, "base", "image"), "only a whole '${VAR}' may be used here",
                             expected="an image reference or '${VAR}'", found=repr(b["image"]))
        recipe = None
        if "recipe" in b:
            recipe = (self.root / b["recipe"]).resolve()
            if not recipe.is_dir():
                self.problem((*kp, "base", "recipe"), "recipe directory does not exist",
                             expected=f"a directory at {recipe}", found="nothing there")
        base = BaseSpec(image=image, image_env=image_env, image_id=b.get("image_id"), recipe=recipe,
                        load_hint=b.get("load_hint"))
        p = raw["package"]
        package = PackageSpec(import_name=p["import"], distribution=p["distribution"], version=str(p["version"]),
                              flags="off" if p.get("flags") is False else p.get("flags"))

        r = raw.get("run", {})
        ulimits: dict[str, tuple[int, int]] = {}
        for uname, uvalue in r.get("ulimits", {}).items():
            ulimits[uname] = (uvalue, uvalue) if isinstance(uvalue, int) else (uvalue["soft"], uvalue["hard"])
        run = RunOptions(
            shm_size=r.get("shm_size"),
            ipc=r.get("ipc"),
            gpus=r.get("gpus"),
            devices=tuple(r.get("devices", ())),
            privileged=bool(r.get("privileged", False)),
            volumes=tuple(
                Volume(source=v["source"], target=v["target"], read_only=bool(v.get("read_only", True)),
                       type=v.get("type", "bind"))
                for v in r.get("volumes", ())
            ),
            ulimits=frozen_map(ulimits),
            env=self.env((*kp, "run", "env"), r.get("env")),
            port=int(r.get("port", 8000)),
        )

        steps = tuple(
            self.step((*kp, "steps", i), s, package, None) for i, s in enumerate(raw.get("steps", ()))
        )
        s = raw["serving"]
        serving = ServingSpec(
            config_path=s["config_path"],
            command=tuple(s.get("command", ("vllm", "serve"))),
            args=frozen_map(s["args"]),
            env=self.env((*kp, "serving", "env"), s.get("env")),
            reasons=frozen_map(s.get("reasons", {})),
            style=s.get("style", "config"),
            flag_names=frozen_map(s.get("flag_names", {})),
            negatable=frozenset(s.get("negatable", ())),
        )
        profiles: dict[str, Profile] = {}
        for pname, praw in raw.get("profiles", {}).items():
            pkp = (*kp, "profiles", pname)
            profiles[pname] = Profile(
                name=pname,
                extends=praw.get("extends"),
                why=praw.get("why"),
                args=frozen_map(praw.get("args", {})),
                env=self.env((*pkp, "env"), praw.get("env")),
                reasons=frozen_map(praw.get("reasons", {})),
                steps=tuple(
                    self.step((*pkp, "steps", i), st, package, pname) for i, st in enumerate(praw.get("steps", ()))
                ),
                location=self.doc.location(pkp),
            )
        self.check_profiles(kp, profiles, raw.get("default_profile"))
        self.check_step_ids(kp, steps, profiles)
        self.check_requires(steps, profiles)
        self.check_equiv((*kp, "equiv"), raw.get("equiv"))
        v = raw.get("verify", {})
        verify = VerifySpec(
            imports=tuple(v.get("imports", ())),
            import_env=self.env((*kp, "verify", "import_env"), v.get("import_env")),
        )
        sm = raw.get("smoke", {})
        suite = None
        if "suite" in sm:
            suite = self.check_source((*kp, "smoke", "suite"), sm["suite"])
        smoke = SmokeSettings(
            suite=suite,
            tags=tuple(sm.get("tags", ())),
            startup_timeout=float(sm.get("startup_timeout", 300)),
        )
        return Target(
            name=name,
            description=raw.get("description"),
            base=base,
            package=package,
            image=raw.get("image", f"imageforge/{name}"),
            run=run,
            steps=steps,
            verify=verify,
            serving=serving,
            profiles=frozen_map(profiles),
            default_profile=raw.get("default_profile"),
            smoke=smoke,
            equiv=equiv_settings(raw.get("equiv")),
            replay=ReplaySettings(
                time_cap=None if raw.get("replay", {}).get("time_cap") is None
                else float(raw["replay"]["time_cap"]),
                gate=tuple(raw.get("replay", {}).get("gate", ())),
            ),
        )

    def check_profiles(self, kp: tuple[str | int, ...], profiles: Mapping[str, Profile], default: str | None) -> None:
        for name, profile in profiles.items():
            if profile.extends is not None and profile.extends not in profiles:
                self.problem(
                    (*kp, "profiles", name, "extends"),
                    f"profile {name!r} extends an unknown profile",
                    expected="one of " + ", ".join(repr(p) for p in profiles),
                    found=repr(profile.extends),
                    hint=did_you_mean(profile.extends, profiles),
                )
        for name in profiles:
            seen = [name]
            current = profiles[name].extends
            while current is not None and current in profiles:
                if current in seen:
                    self.problem(
                        (*kp, "profiles", name, "extends"),
                        "profile 'extends' forms a cycle",
                        found=" -> ".join([*seen, current]),
                        hint="one profile in the chain must not extend anything",
                    )
                    break
                seen.append(current)
                current = profiles[current].extends
        if default is not None and default not in profiles:
            self.problem(
                (*kp, "default_profile"),
                "default_profile names an unknown profile",
                expected="one of " + ", ".join(repr(p) for p in profiles) if profiles else "a profile (none defined)",
                found=repr(default),
                hint=did_you_mean(default, profiles),
            )

    def check_step_ids(
        self, kp: tuple[str | int, ...], steps: tuple[Step, ...], profiles: Mapping[str, Profile]
    ) -> None:
        shared = self._unique_ids(steps, {}, "unique ids within a target")
        for profile in profiles.values():
            self._unique_ids(profile.steps, shared, "unique ids within a target (shared and profile steps)")

    def check_requires(self, steps: tuple[Step, ...], profiles: Mapping[str, Profile]) -> None:
        """Each ``requires:`` id names an EARLIER step of the same chain (shared steps, then the profile's).

        Earlier-only makes the requirement graph acyclic by construction; a self-reference (the
        one cycle a single step can form) and a later id are reported as such.
        """
        chains = [steps] + [steps + p.steps for p in profiles.values()]
        reported: set[tuple[str, str]] = set()
        for chain in chains:
            position = {s.id: i for i, s in enumerate(chain)}
            for i, step in enumerate(chain):
                for j, needed in enumerate(step.requires):
                    if (step.key_path, needed) in reported:
                        continue
                    where = (*self._kp_of(step)[:-1], "requires", j)
                    message = None
                    if needed == step.id:
                        message, found = "a step cannot require itself", f"{needed!r} (a cycle)"
                    elif needed not in position:
                        message, found = "requires an unknown step id", repr(needed)
                    elif position[needed] > i:
                        message = "requires a LATER step"
                        found = f"{needed!r} at line {chain[position[needed]].location.line} (a cycle or a wrong order)"
                    if message is None:
                        continue
                    reported.add((step.key_path, needed))
                    earlier = [s.id for s in chain[:i]]
                    self.errors.add(self.doc.problem(
                        where, message,
                        expected="the id of an earlier step" + (f": one of {', '.join(earlier)}" if earlier else
                                                                 " (this is the first step)"),
                        found=found,
                        hint=did_you_mean(needed, earlier) or "requires names steps that come before this one",
                    ))
        # A profile's requirement is checked against its own chain: a profile step never serves a shared one.

    def check_equiv(self, kp: tuple[str | int, ...], raw: Mapping[str, Any] | None) -> None:
        """The bf16 gate never uses the max; every dtype block keeps at least one gate."""
        tolerances = (raw or {}).get("tolerances") or {}
        bf16 = tolerances.get("bfloat16") or {}
        if bf16.get("max_abs") is not None:
            self.problem(
                (*kp, "tolerances", "bfloat16", "max_abs"),
                "bfloat16 is never gated on the max |delta logprob|",
                expected="mean_abs, p95_abs, top1_min or kl_max (or max_abs: null)",
                found=f"max_abs: {bf16['max_abs']}",
                hint="one bf16 rounding flip moves a logprob by ~0.5 nat without a bug; gate float32 on the max",
            )
        settings = equiv_settings(raw)
        for dtype, tolerance in settings.tolerances.items():
            if dtype in tolerances and not tolerance.gates():
                self.problem((*kp, "tolerances", dtype), f"the {dtype} gate has no limit left",
                             expected="at least one of max_abs, mean_abs, p95_abs, top1_min, kl_max",
                             found="every limit null")

    def _unique_ids(self, steps: tuple[Step, ...], known: Mapping[str, Step], expected: str) -> dict[str, Step]:
        """Report each step whose id is already in ``known`` or earlier in ``steps``; return all ids seen."""
        seen = dict(known)
        for step in steps:
            if step.id in seen:
                self.errors.add(
                    self.doc.problem(
                        self._kp_of(step),
                        f"duplicate step id {step.id!r}",
                        expected=expected,
                        found=f"{step.id!r} also at line {seen[step.id].location.line}",
                    )
                )
            seen[step.id] = step
        return seen

    @staticmethod
    def _kp_of(step: Step) -> tuple[str | int, ...]:
        out: list[str | int] = []
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", step.key_path):
            out.append(int(part[1:-1]) if part.startswith("[") else part)
        return (*out, "id")


class _StepChecks:
    """The loader's checks for one step at ``kp`` of a target with ``package`` (a kind's :meth:`StepKind.load`)."""

    def __init__(self, builder: _Builder, kp: tuple[str | int, ...], package: PackageSpec) -> None:
        self.builder, self.kp, self.package = builder, kp, package

    def problem(self, key: str, message: str, **kw: str | None) -> None:
        self.builder.problem((*self.kp, key), message, **kw)

    def dest(self, key: str, dest: str, source: str | None = None) -> str:
        return self.builder.check_dest((*self.kp, key), dest, self.package, source)

    def directory(self, key: str, directory: str) -> tuple[str | None, Path | None]:
        return self.builder.check_directory((*self.kp, key), directory)

    def env(self, key: str, raw: Mapping[str, Any] | None) -> Mapping[str, str]:
        return self.builder.env((*self.kp, key), raw)


def load_manifest(path: Path | str = DEFAULT_MANIFEST) -> Manifest:
    """Load, schema-check and semantically check a manifest. Raises ConfigError listing all problems."""
    path = Path(path)
    doc = load_yaml_c(path, what="manifest")  # libyaml; any problem is re-read by the position loader
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "manifest must be a mapping",
            location=doc.location(()),
            expected="keys version, default_target, targets",
            found=type(doc.data).__name__,
        )
    validate_schema(doc, manifest_schema(), what="manifest")  # the shipped schema, its step kinds the registry's
    builder = _Builder(doc)
    targets = {name: builder.target(name, raw) for name, raw in doc.data["targets"].items()}
    default = doc.data["default_target"]
    if default not in targets:
        builder.problem(
            ("default_target",),
            "default_target names an unknown target",
            expected="one of " + ", ".join(repr(t) for t in targets),
            found=repr(default),
            hint=did_you_mean(default, targets),
        )
    builder.errors.raise_if_any(f"{path} has problems")
    return Manifest(
        path=path,
        root=builder.root,
        digest=hashlib.sha256(doc.raw).hexdigest(),
        default_target=default,
        targets=frozen_map(targets),
        document=doc,
    )


def manifest_path(explicit: str | None = None) -> Path:
    """``--manifest``, ``$IMAGEFORGE_MANIFEST`` or ./build.yaml (:mod:`imageforge.settings`).

    For smoke and bench, which load their manifest themselves until they take a Settings object.
    """
    return settings.manifest_path(explicit, os.environ)
