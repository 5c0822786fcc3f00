"""Which image a target builds on, and what is installed in it.

* :func:`base_reference`: the target's base as (reference, image ID) -- a recipe base (made when
  asked), a pinned reference or one from ``${VAR}``; every missing piece is an InfraError (exit 5)
  with the hint to load or make it.
* :class:`DaemonProbe`: the :class:`imageforge.plan.CacheProbe` backed by the daemon (base image IDs,
  cache keys); :func:`daemon_probe` gives one only when a daemon answers.
* :func:`discover_package`: the site directory and version of the target's package in the base
  image, read once by the image's own python3 and cached per image ID.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from imageforge.docker_engine import client, endpoint
from imageforge.errors import BuildError, InfraError
from imageforge.labels import L_KEY, L_KIND, TOOL
from imageforge.settings import cache_dir

from .images import base_image_status, ensure_cpu_base
from .model import ensure_model
from .recipe import Recipe, load_recipe

if TYPE_CHECKING:
    from imageforge.docker_engine.containers import Containers
    from imageforge.manifest.model import Target
    from imageforge.manifest.resolve import Resolved
    from imageforge.plan import CacheProbe

Log = Callable[[str], None]


class BaseIdentity(NamedTuple):
    """The base image a build starts from: how it is named and what it is."""

    ref: str
    image_id: str


# --------------------------------------------------------------------------- the target's base image


def missing_variable_error(target: Target) -> InfraError:
    """The base comes from ``${VAR}`` and VAR is not set: say so before touching Docker."""
    return InfraError(
        f"the base image of target {target.name!r} comes from ${target.base.image_env}, which is not set",
        key_path=f"targets.{target.name}.base.image",
        hint=target.base.load_hint or f"export {target.base.image_env}=<image reference>",
    )


def base_reference(resolved: Resolved, environ: Mapping[str, str], log: Log, *, make: bool) -> BaseIdentity:
    """(reference, image id) of the target's base; makes recipe bases when ``make``."""
    target = resolved.target
    if target.base.recipe is not None:
        if make:
            recipe = load_recipe(target.base.recipe)  # read once, handed to both
            made = ensure_cpu_base(recipe, log=log)
            ensure_target_model(resolved, log, recipe=recipe)
            return BaseIdentity(made.ref, made.image_id)
        recipe_ref = base_image_status(target.base.recipe).ref
        recipe_id = recipe_image_id(recipe_ref)
        if recipe_id is None:
            raise InfraError(f"the base image of target {target.name!r} is not built yet",
                             found=f"no image {recipe_ref}", hint=f"run `invoke base --target {target.name}`")
        return BaseIdentity(recipe_ref, recipe_id)
    ref = target.base.reference(environ)
    if ref is None:
        raise missing_variable_error(target)
    import docker.errors

    try:
        image = client().images.get(ref)
    except docker.errors.ImageNotFound:
        raise InfraError(
            f"base image {ref!r} is not on the Docker daemon",
            hint=target.base.load_hint or f"load it first: docker load -i <file>.tar (then docker images {ref})",
        ) from None
    if target.base.image_id and image.id != target.base.image_id:
        raise InfraError(
            f"base image {ref!r} is not the pinned image",
            key_path=f"targets.{target.name}.base.image_id",
            expected=target.base.image_id,
            found=image.id,
            hint="load the pinned image, or update image_id after checking the new one",
        )
    return BaseIdentity(ref, str(image.id))


def recipe_image_id(ref: str) -> str | None:
    import docker.errors

    try:
        return str(client().images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def ensure_target_model(resolved: Resolved, log: Log, *, recipe: Recipe | None = None) -> None:
    """Recipe targets may ship a model directory that run options mount (cpu: the tiny model).

    ``recipe``: the target's recipe when the caller has loaded it already (else it is read here, once)."""
    recipe_dir = resolved.target.base.recipe
    if recipe_dir is None:
        return
    for volume in resolved.run.volumes:
        source = volume.source
        if source.startswith(".imageforge/models/"):
            recipe = recipe or load_recipe(recipe_dir)
            ensure_model(recipe, resolved.manifest.root / source, log=log)


# --------------------------------------------------------------------------- cache probes


class DaemonProbe:
    """CacheProbe backed by the daemon; never builds anything."""

    def __init__(self) -> None:
        self._client = client()
        self._keys: dict[str, list[str]] | None = None
        self._committed: set[str] | None = None

    def base_image_id(self, reference: str) -> str | None:
        import docker.errors

        if reference.startswith("recipe:"):
            return recipe_image_id(base_image_status(Path(reference[len("recipe:"):])).ref)
        try:
            return str(self._client.images.get(reference).id)
        except docker.errors.ImageNotFound:
            return None

    def lookup(self, key: str) -> str | None:
        # One listing of every image with a cache key, not one daemon query per step (~15 ms each).
        # all=True: intermediate layers are parents of later ones and hidden from a plain list.
        if self._keys is None:
            self._keys = {}
            for raw in self._client.api.images(all=True, filters={"label": L_KEY}):
                found = (raw.get("Labels") or {}).get(L_KEY)
                if found:
                    self._keys.setdefault(found, []).append(str(raw["Id"]))
        # An image built FROM one of ours (a Dockerfile, someone's `docker commit`) inherits every label, the
        # cache key too, and the daemon lists it first: only the image imageforge committed for this step is the
        # layer. Its commit message and author say so; a derived image has its own (a build leaves them empty).
        for image_id in self._keys.get(key, []):
            if self._committed_by_imageforge(image_id):
                return image_id
        return None

    def _committed_by_imageforge(self, image_id: str) -> bool:
        """Author and commit message say imageforge; remembered on the host per image ID.

        An image ID is the digest of its config, author and comment included, so the answer for an ID never
        changes: a no-op build reads one small file instead of one inspect per step (~5-15 ms each).
        """
        import docker.errors

        if self._committed is None:
            try:
                self._committed = set(committed_ids_file().read_text().split())
            except OSError:
                self._committed = set()
        if image_id in self._committed:
            return True
        try:
            attrs = self._client.api.inspect_image(image_id)
        except docker.errors.NotFound:
            return False
        ours = bool(attrs.get("Author") == TOOL and str(attrs.get("Comment") or "").startswith(f"{TOOL} "))
        if ours:
            self._committed.add(image_id)
            with contextlib.suppress(OSError):
                committed_ids_file().parent.mkdir(parents=True, exist_ok=True)
                with committed_ids_file().open("a") as f:  # one short line per ID: concurrent builds append whole lines
                    f.write(image_id + "\n")
        return ours


def committed_ids_file() -> Path:
    """The host file of image IDs known to be imageforge commits (see DaemonProbe._committed_by_imageforge)."""
    return discovery_cache_dir() / "committed-image-ids.txt"


class FixedBase:
    """A probe whose base image ID is already known (the build resolved it)."""

    def __init__(self, probe: CacheProbe, base_id: str) -> None:
        self._probe = probe
        self._base_id = base_id

    def base_image_id(self, reference: str) -> str | None:
        return self._base_id

    def lookup(self, key: str) -> str | None:
        return self._probe.lookup(key)


def daemon_probe() -> CacheProbe | None:
    """A probe when a daemon answers quickly, else None (plan then says UNKNOWN)."""
    try:
        ep = endpoint()
    except InfraError:  # an unreadable docker context: plan says UNKNOWN
        return None
    if ep.default_socket and not Path("/var/run/docker.sock").exists():
        return None
    try:
        probe = DaemonProbe()
        probe._client.ping()
        return probe
    except Exception:
        return None


# --------------------------------------------------------------------------- package discovery

DISCOVER = r"""
import importlib.metadata as m, json, os, sys
dist, imp = sys.argv[1], sys.argv[2]
try:
    d = m.distribution(dist)
except m.PackageNotFoundError:
    print(json.dumps({"error": "distribution %s is not installed" % dist, "python": sys.executable})); sys.exit(0)
site = os.path.realpath(str(d.locate_file("")))
pkg = os.path.join(site, imp)
print(json.dumps({"version": d.version, "site": site, "package_dir": pkg, "exists": os.path.isdir(pkg),
                  "python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
                  "cache_tag": sys.implementation.cache_tag, "dist_info": str(getattr(d, "_path", ""))}))
"""


@dataclass(frozen=True)
class PackageInfo:
    version: str
    site: str
    package_dir: str
    python: str
    python_version: str


def discovery_cache_dir() -> Path:
    return cache_dir() / "discovery"


def discover_package(image_id: str, target: Target, scope: Containers, log: Log, *,
                     check_version: bool = True) -> PackageInfo:
    """Site directory and version of the target's package in the image (cached per image ID).

    ``check_version``: a version other than the manifest's is a BuildError (else the caller judges).
    """
    pkg = target.package
    cache_file = discovery_cache_dir() / f"{image_id.split(':')[-1]}-{pkg.distribution}-{pkg.import_name}.json"
    data: dict[str, Any] | None = None
    if cache_file.exists():
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(cache_file.read_text())
    if data is None:
        t0 = time.monotonic()
        container = scope.create(image_id, entrypoint=["python3"], command=["-c", DISCOVER, pkg.distribution,
                                 pkg.import_name], labels={L_KIND: "discover"})
        container.start()
        status = container.wait(timeout=120)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        scope.remove(container)
        lines = [ln for ln in output.splitlines() if ln.startswith("{")]
        if status.get("StatusCode") != 0 or not lines:
            raise BuildError(
                f"could not read the installed {pkg.distribution} with the image's python3",
                found=f"exit code {status.get('StatusCode')}",
                hint="the base image needs python3 on PATH with the package installed",
                log_tail=output.splitlines()[-20:],
            )
        data = json.loads(lines[-1])
        log(f"  discovered {pkg.distribution} in the base image ({time.monotonic() - t0:.1f}s)")
        if "error" not in data and data.get("exists"):
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(data))
    if "error" in data:
        raise BuildError(data["error"] + f" in the base image (python {data.get('python')})",
                         hint=f"is targets.{target.name}.package.distribution right?")
    if not data.get("exists"):
        raise BuildError(f"package directory {data['package_dir']} does not exist in the base image",
                         hint=f"is targets.{target.name}.package.import right?")
    if check_version and pkg.version != "*" and data["version"] != pkg.version:
        raise BuildError(
            f"{pkg.distribution} version in the base image differs from the manifest",
            key_path=f"targets.{target.name}.package.version",
            expected=pkg.version,
            found=data["version"],
            hint="the patches were written for the manifest's version; update the manifest after check-patches",
        )
    return PackageInfo(data["version"], data["site"], data["package_dir"], data["python"], data["python_version"])
