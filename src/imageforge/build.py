"""The build engine: one cached layer per step, through the docker SDK.

Stack for ``<target>:<profile>``::

    base image -> shared steps -> profile steps -> verify -> serving config + CMD

* File steps (overlay, patch, symlink) never start a process: a container is *created*
  from the parent image, files are read with ``get_archive``, changed on the host, written
  back with ``put_archive`` and the container is committed.
* Script steps start one container and ``exec`` the script, so their environment never
  enters the container config, the image config or the history.
* Every layer is labelled with its chained cache key (see :mod:`imageforge.plan`); an image
  with the key is reused without doing anything.
* Each commit passes the parent's ENTRYPOINT/CMD/ENV/WORKDIR/USER back explicitly, so the
  base image's config survives; only the final layer changes CMD (and adds serving ENV).
* Tags move only after verification passed, under a per-image file lock.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import fcntl
import fnmatch
import io
import json
import os
import posixpath
import secrets
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BuildError, ConfigError, ImageforgeError, InfraError
from .labels import (
    L_BASE,
    L_CREATED,
    L_FINAL,
    L_KEY,
    L_KIND,
    L_MANIFEST,
    L_PROFILE,
    L_REVISION,
    L_RUN,
    L_STEP,
    L_TARGET,
    L_TOOL,
    L_VERIFIED,
    LABEL,
    TOOL,
)
from .manifest import Step, Target, resolve_image_path
from .patching import apply_patch, describe
from .plan import CacheProbe, Plan, PlannedStep, canonical, fit_argv, fit_command, make_plan, serving_argv
from .resolve import Resolved

Log = Callable[[str], None]

FIXED_MTIME = 1577836800  # 2020-01-01: written files get a fixed mtime (reproducible layers)
S_IFLNK_GO = 1 << 27  # Go's os.ModeSymlink in the archive stat header
S_IFDIR_GO = 1 << 31


def new_run_id() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def git_revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------- daemon access


@contextlib.contextmanager
def daemon_errors(what: str) -> Iterator[None]:
    """Map SDK/connection failures to InfraError (exit 5), never a traceback."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError, ConnectionError) as exc:
        raise InfraError(f"lost the Docker daemon while {what}", found=(str(exc).splitlines() or [""])[0][:200],
                         hint="is dockerd still running? `docker info` tells") from None
    except docker.errors.ImageNotFound as exc:
        raise InfraError(f"an image disappeared from the Docker daemon while {what}",
                         found=str(getattr(exc, "explanation", None) or exc)[:300],
                         hint="was it removed meanwhile (docker rmi, invoke clean)? Run the build again; a removed "
                         "base image must be made or loaded again") from None
    except docker.errors.APIError as exc:
        explanation = getattr(exc, "explanation", None) or str(exc)
        if "no space left" in str(explanation).lower():
            raise InfraError(f"out of disk space while {what}", found=str(explanation)[:300],
                             hint="free space (invoke clean) or move Docker's data root") from None
        raise BuildError(f"Docker refused {what}", found=str(explanation)[:500]) from None


def client() -> Any:
    from .docker_engine import client as _client

    return _client()


@dataclass
class Containers:
    """Every container a build creates, removed on exit (errors and Ctrl-C included)."""

    labels: Mapping[str, str]
    created: list[Any] = field(default_factory=list)

    def create(self, image: str, **kwargs: Any) -> Any:
        labels = {**self.labels, **kwargs.pop("labels", {})}
        container = client().containers.create(image, labels=labels, **kwargs)
        self.created.append(container)
        return container

    def remove(self, container: Any) -> None:
        import docker.errors

        # A loaded daemon can refuse a forced remove ("did not receive an exit event"): retry a few
        # times when it answered with an error; a daemon that is gone is not waited for.
        for attempt in range(4):
            try:
                container.remove(force=True, v=True)
                break
            except docker.errors.NotFound:
                break
            except docker.errors.APIError:
                if attempt < 3:
                    time.sleep(1 + attempt)
            except Exception:
                break
        with contextlib.suppress(ValueError):
            self.created.remove(container)

    def close(self) -> None:
        for container in list(self.created):
            self.remove(container)


@contextlib.contextmanager
def containers(labels: Mapping[str, str]) -> Iterator[Containers]:
    scope = Containers(labels)
    try:
        yield scope
    finally:
        scope.close()


def path_stat(container: Any, path: str) -> dict[str, Any] | None:
    """The daemon's stat of ``path`` in a container (HEAD archive), or None when absent."""
    api = client().api
    response = api.head(api._url("/containers/{0}/archive", container.id), params={"path": path})
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        api._raise_for_status(response)
    header = response.headers.get("X-Docker-Container-Path-Stat")
    if not header:
        return None
    stat: dict[str, Any] = json.loads(base64.b64decode(header))
    return stat


def is_symlink(stat: Mapping[str, Any]) -> bool:
    return bool(int(stat.get("mode", 0)) & S_IFLNK_GO)


def is_dir(stat: Mapping[str, Any]) -> bool:
    return bool(int(stat.get("mode", 0)) & S_IFDIR_GO)


def read_file(container: Any, path: str) -> tuple[bytes, tarfile.TarInfo] | None:
    """Bytes and tar header of one regular file in a (created, unstarted) container."""
    import docker.errors

    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    buf = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=buf) as tar:
        member = tar.next()
        if member is None:
            return None
        if member.issym():
            raise BuildError(f"{path} is a symbolic link in the image (to {member.linkname})",
                             hint="patch or overlay the file it points to")
        if not member.isfile():
            raise BuildError(f"{path} is not a regular file in the image")
        fh = tar.extractfile(member)
        assert fh is not None
        return fh.read(), member


def list_dir(container: Any, directory: str) -> list[tuple[str, tarfile.TarInfo]]:
    """Direct entries of ``directory`` (name, header) without extracting any data."""
    import docker.errors

    try:
        stream, _ = container.get_archive(directory.rstrip("/") + "/.")
    except docker.errors.NotFound:
        return []
    reader = _StreamReader(stream)
    out: list[tuple[str, tarfile.TarInfo]] = []
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            name = member.name
            name = name[2:] if name.startswith("./") else name
            if name in (".", "") or "/" in name.rstrip("/"):
                continue
            out.append((name.rstrip("/"), member))
    return out


class _StreamReader(io.RawIOBase):
    def __init__(self, chunks: Any) -> None:
        self._it = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def tar_of(entries: Sequence[tarfile.TarInfo], payloads: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in entries:
            data = payloads.get(info.name)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_entry(path: str, data: bytes, *, mode: int, uid: int = 0, gid: int = 0,
               mtime: int = FIXED_MTIME) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = mtime
    return info


def symlink_entry(path: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    info.mtime = FIXED_MTIME
    return info


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
                  "python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3]}))
"""


@dataclass(frozen=True)
class PackageInfo:
    version: str
    site: str
    package_dir: str
    python: str
    python_version: str


def process_overrides(parent_config: Mapping[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """create() arguments that run ``argv`` while letting commit restore the parent's config.

    ``docker commit`` fills an empty ENTRYPOINT from the container, so the ENTRYPOINT is only
    overridden when the parent has one (commit then restores it explicitly).
    """
    if parent_config.get("Entrypoint"):
        return {"entrypoint": [argv[0]], "command": list(argv[1:])}
    return {"command": list(argv)}


def discovery_cache_dir() -> Path:
    root = Path(os.environ.get("IMAGEFORGE_CACHE", Path.home() / ".cache" / "imageforge"))
    return root / "discovery"


def discover_package(image_id: str, target: Target, scope: Containers, log: Log) -> PackageInfo:
    """Site directory and version of the target's package in the image (cached per image ID)."""
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
    if pkg.version != "*" and data["version"] != pkg.version:
        raise BuildError(
            f"{pkg.distribution} version in the base image differs from the manifest",
            key_path=f"targets.{target.name}.package.version",
            expected=pkg.version,
            found=data["version"],
            hint="the patches were written for the manifest's version; update the manifest after check-patches",
        )
    return PackageInfo(data["version"], data["site"], data["package_dir"], data["python"], data["python_version"])


# --------------------------------------------------------------------------- script steps

SCRIPT_SCRATCH = "/tmp/imageforge-step"
IDLE_LOOP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def directory_entries(root: Path, dest: str) -> tuple[list[tarfile.TarInfo], dict[str, bytes]]:
    """Tar entries that put the host directory ``root`` at ``dest`` (modes kept, owner root, fixed mtime)."""
    entries = [_dir_entry(dest)]
    payloads: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        inside = posixpath.join(dest, path.relative_to(root).as_posix())
        if path.is_symlink():
            entries.append(symlink_entry(inside, os.readlink(path)))
        elif path.is_dir():
            entries.append(_dir_entry(inside))
        elif path.is_file():
            data = path.read_bytes()
            entries.append(file_entry(inside, data, mode=path.stat().st_mode & 0o777))
            payloads[entries[-1].name] = data
    return entries, payloads


def _dir_entry(path: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = FIXED_MTIME
    return info


def script_directory(step: Step, environ: Mapping[str, str]) -> Path:
    """The host directory of a directory script step; InfraError (exit 5) when unset or not there."""
    directory = step.directory(environ)
    if directory is None:
        raise InfraError(
            f"script step {step.id!r} copies a directory from ${step.directory_env}, which is not set",
            location=step.where("directory"), key_path=f"{step.key_path}.directory",
            hint=step.load_hint or f"export {step.directory_env}=<directory>",
        )
    if not directory.is_dir():
        raise InfraError(
            f"script step {step.id!r}: {directory} is not a directory",
            location=step.where("directory"), key_path=f"{step.key_path}.directory",
            hint=step.load_hint or "give the directory that holds the step's files",
        )
    return directory


def exec_script(container: Any, step: Step, environ: Mapping[str, str], *,
                echo: Log | None = None) -> tuple[int | None, list[str]]:
    """Put a script step's files into a running ``container`` and exec it; (exit code, output lines).

    A ``source`` script goes to a scratch directory and runs with its ``args``; a ``directory`` is
    copied to ``dest`` and ``command`` runs there (``workdir``, default ``dest``).
    """
    spec = step.spec
    if "directory" in spec:
        entries, payloads = directory_entries(script_directory(step, environ), str(spec["dest"]))
        argv = list(spec["command"])
    else:
        name = posixpath.basename(spec["source"])
        data = step.source.read_bytes()
        entries = [file_entry(f"{SCRIPT_SCRATCH}/{name}", data, mode=0o755)]
        payloads = {entries[0].name: data}
        argv = [f"{SCRIPT_SCRATCH}/{name}", *spec.get("args", ())]
    if not container.put_archive("/", tar_of(entries, payloads)):
        raise BuildError(f"the daemon refused to write the files of step {step.id}")
    env = {k: str(v) for k, v in spec.get("env", {}).items()}
    api = client().api
    options: dict[str, Any] = {"environment": env, "user": spec.get("user", "root")}
    if spec.get("workdir"):
        options["workdir"] = spec["workdir"]
    exec_id = api.exec_create(container.id, argv, **options)["Id"]
    lines: list[str] = []
    pending = ""
    for chunk in api.exec_start(exec_id, stream=True):
        pending += chunk.decode(errors="replace")
        *done, pending = pending.split("\n")
        for line in done:
            lines.append(line)
            if echo is not None:
                echo(line)
    if pending:
        lines.append(pending)
        if echo is not None:
            echo(pending)
    code = api.exec_inspect(exec_id).get("ExitCode")
    return code, lines


# --------------------------------------------------------------------------- base image


def base_reference(resolved: Resolved, environ: Mapping[str, str], log: Log, *, make: bool) -> tuple[str, str]:
    """(reference, image id) of the target's base; makes recipe bases when ``make``."""
    target = resolved.target
    if target.base.recipe is not None:
        from . import base as base_mod

        if make:
            made = base_mod.ensure_cpu_base(target.base.recipe, log=log)
            ensure_model(resolved, log)
            return made.ref, made.image_id
        recipe_ref = base_mod.base_image_status(target.base.recipe).ref
        recipe_id = recipe_image_id(recipe_ref)
        if recipe_id is None:
            raise InfraError(f"the base image of target {target.name!r} is not built yet",
                             found=f"no image {recipe_ref}", hint=f"run `invoke base --target {target.name}`")
        return recipe_ref, recipe_id
    ref = target.base.reference(environ)
    if ref is None:
        raise InfraError(
            f"the base image of target {target.name!r} comes from ${target.base.image_env}, which is not set",
            key_path=f"targets.{target.name}.base.image",
            hint=target.base.load_hint or f"export {target.base.image_env}=<image reference>",
        )
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
    return ref, str(image.id)


def recipe_image_id(ref: str) -> str | None:
    import docker.errors

    try:
        return str(client().images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def ensure_model(resolved: Resolved, log: Log) -> None:
    """Recipe targets may ship a model directory that run options mount (cpu: the tiny model)."""
    recipe = resolved.target.base.recipe
    if recipe is None:
        return
    from . import base as base_mod

    for volume in resolved.run.volumes:
        source = volume.source
        if source.startswith(".imageforge/models/"):
            base_mod.ensure_model(recipe, resolved.manifest.root / source, log=log)


class DaemonProbe:
    """CacheProbe backed by the daemon; never builds anything."""

    def __init__(self) -> None:
        self._client = client()
        self._keys: dict[str, str] | None = None

    def base_image_id(self, reference: str) -> str | None:
        import docker.errors

        if reference.startswith("recipe:"):
            from . import base as base_mod

            return recipe_image_id(base_mod.base_image_status(Path(reference[len("recipe:"):])).ref)
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
                    self._keys.setdefault(found, str(raw["Id"]))
        return self._keys.get(key)


def daemon_probe(resolved: Resolved) -> CacheProbe | None:
    """A probe when a daemon answers quickly, else None (plan then says UNKNOWN)."""
    from .docker_engine import docker_host

    host = docker_host()
    if host is None and not Path("/var/run/docker.sock").exists():
        return None
    try:
        probe = DaemonProbe()
        probe._client.ping()
        return probe
    except Exception:
        return None


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class StepResult:
    id: str
    kind: str
    stage: str
    cache: str  # HIT, BUILT, SKIPPED (already applied)
    key: str
    image_id: str
    seconds: float
    detail: str = ""


class Builder:
    def __init__(self, plan: Plan, *, log: Log, verbose: bool, run_id: str, scope: Containers,
                 base_ref: str, base_id: str, environ: Mapping[str, str] | None = None) -> None:
        self.plan = plan
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.resolved = plan.resolved
        self.target = plan.resolved.target
        self.log = log
        self.verbose = verbose
        self.run_id = run_id
        self.scope = scope
        self.base_ref = base_ref
        self.base_id = base_id
        self.base_config: dict[str, Any] = client().images.get(base_id).attrs["Config"] or {}
        self.revision = git_revision(self.resolved.manifest.root)
        self.info: PackageInfo | None = None

    # -- common -------------------------------------------------------------

    def labels(self, planned: PlannedStep, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        r = self.resolved
        labels = {
            L_TOOL: TOOL,
            L_KIND: planned.stage,
            L_KEY: planned.key or "",
            L_TARGET: self.target.name,
            L_MANIFEST: r.manifest.digest,
            L_RUN: self.run_id,
            L_BASE: self.base_id,
            L_REVISION: self.revision,
            L_CREATED: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            f"{L_STEP}.{planned.id}.key": planned.key or "",
        }
        for name, digest in planned.inputs.items():
            labels[f"{L_STEP}.{planned.id}.sha256.{name}"] = digest
        if extra:
            labels.update(extra)
        return labels

    def commit(self, container: Any, planned: PlannedStep, parent_config: Mapping[str, Any],
               conf: Mapping[str, Any] | None = None, extra_labels: Mapping[str, str] | None = None) -> str:
        config = {
            "Entrypoint": parent_config.get("Entrypoint"),
            "Cmd": parent_config.get("Cmd"),
            "Env": parent_config.get("Env"),
            "WorkingDir": parent_config.get("WorkingDir") or "",
            "User": parent_config.get("User") or "",
            "Labels": self.labels(planned, extra_labels),
        }
        config.update(conf or {})
        with daemon_errors(f"committing step {planned.id}"):
            image = container.commit(message=f"imageforge {planned.kind} {planned.id}", author=TOOL, conf=config)
            got = client().images.get(image.id).attrs["Config"] or {}
        for key in ("Entrypoint", "Cmd", "WorkingDir", "User"):
            if (got.get(key) or None) != (config.get(key) or None):
                raise BuildError(
                    f"committing step {planned.id} changed the image's {key}",
                    expected=json.dumps(config.get(key)), found=json.dumps(got.get(key)),
                    hint="a base image with neither ENTRYPOINT nor CMD cannot keep them empty through "
                    "`docker commit`; give the base a CMD",
                )
        return str(image.id)

    def site_path(self, path: str) -> str:
        assert self.info is not None
        return resolve_image_path(path, self.info.site)

    def guard_symlinks(self, container: Any, path: str, step: Step) -> None:
        """Refuse destinations that go through a symlink inside the package's site directory."""
        assert self.info is not None
        site = self.info.site.rstrip("/")
        if not path.startswith(site + "/"):
            return
        current = site
        for part in path[len(site) + 1:].split("/")[:-1]:
            current = f"{current}/{part}"
            stat = path_stat(container, current)
            if stat is None:
                return
            if is_symlink(stat):
                raise BuildError(
                    f"destination {path} goes through a symbolic link in the image ({current} -> "
                    f"{stat.get('linkTarget')})",
                    location=step.location, key_path=step.key_path,
                    hint="write to the real path instead",
                )

    # -- file steps ---------------------------------------------------------

    def run_file_step(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        step = planned.step
        assert step is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        with daemon_errors(f"step {step.id}"):
            container = self.scope.create(parent, labels={L_KIND: f"step-{step.kind}"})
            try:
                payloads: dict[str, bytes] = {}
                entries: list[tarfile.TarInfo] = []
                detail = ""
                if step.kind == "overlay":
                    detail = self.overlay(container, step, entries, payloads)
                elif step.kind == "patch":
                    detail = self.patch(container, step, entries, payloads)
                elif step.kind == "symlink":
                    detail = self.symlink(container, step, entries)
                if entries and not container.put_archive("/", tar_of(entries, payloads)):
                    raise BuildError(f"the daemon refused to write the files of step {step.id}")
                return self.commit(container, planned, parent_config), detail
            finally:
                self.scope.remove(container)

    def overlay(self, container: Any, step: Step, entries: list[tarfile.TarInfo],
                payloads: dict[str, bytes]) -> str:
        dest = self.site_path(step.spec["dest"])
        self.guard_symlinks(container, dest, step)
        data = step.source.read_bytes()
        if "mode" in step.spec:
            mode = int(step.spec["mode"])
        else:
            mode = 0o755 if os.access(step.source, os.X_OK) else 0o644
        uid, gid = (int(x) for x in str(step.spec.get("owner", "0:0")).split(":"))
        existing = path_stat(container, dest)
        if existing is not None and is_dir(existing):
            raise BuildError(f"overlay destination {dest} is a directory in the image",
                             location=step.where("dest"), key_path=f"{step.key_path}.dest")
        entries.append(file_entry(dest, data, mode=mode, uid=uid, gid=gid))
        payloads[entries[-1].name] = data
        return f"{'replaced' if existing else 'added'} {dest} ({len(data)} bytes, mode {mode:o})"

    def patch(self, container: Any, step: Step, entries: list[tarfile.TarInfo], payloads: dict[str, bytes]) -> str:
        path = self.site_path(step.spec["file"])
        self.guard_symlinks(container, path, step)
        found = read_file(container, path)
        if found is None:
            raise BuildError(
                f"patch target {path} does not exist in the image",
                location=step.where("file"), key_path=f"{step.key_path}.file",
                hint="check the path with `invoke check-patches`",
            )
        data, member = found
        text = data.decode("utf-8")
        outcome = apply_patch(text, step.spec["old"], step.spec["new"], int(step.spec.get("count", 1)))
        if outcome.status == "already-applied":
            return "already applied: skipped"
        if outcome.result is None:
            raise BuildError(
                f"patch {step.id!r} does not apply to {path}: {describe(outcome)}",
                location=step.where("old"), key_path=f"{step.key_path}.old",
                expected=f"the anchor exactly {outcome.expected} time(s)",
                found=f"{outcome.found} time(s)",
                hint="`invoke check-patches --diff` shows every patch; `invoke patch-from` writes new anchors",
            )
        new_data = outcome.result.encode("utf-8")
        # Keep the file's mode, owner and mtime: a same-size edit then looks unchanged to
        # timestamp-based .pyc files, which is exactly what verification must defeat.
        entries.append(file_entry(path, new_data, mode=member.mode, uid=member.uid, gid=member.gid,
                                  mtime=int(member.mtime)))
        payloads[entries[-1].name] = new_data
        return f"patched {path} at line {', '.join(map(str, outcome.lines))}"

    def glob_listing(self, container: Any, directory: str, step: Step) -> list[tuple[str, bool]]:
        """(name, is directory) of ``directory``'s entries.

        get_archive streams the whole directory (torch/lib: ~1 s), so the listing is cached per
        base image when no earlier step can have changed it: no script step before this one, and
        no file step writing into, over or above the directory.
        """
        import hashlib

        prefix = directory.rstrip("/") + "/"
        cacheable = True
        for planned in self.plan.steps:
            earlier = planned.step
            if earlier is None or earlier is step:
                break
            if earlier.kind == "script":
                cacheable = False
                break
            spec = earlier.spec
            paths = [self.site_path(spec[k]) for k in ("dest", "file") if k in spec]
            paths += [posixpath.normpath(spec[k]) for k in ("link", "into") if k in spec]
            if any(p == directory.rstrip("/") or p.startswith(prefix) or prefix.startswith(p + "/") for p in paths):
                cacheable = False
                break
        digest = hashlib.sha256(directory.encode()).hexdigest()[:16]
        cache_file = discovery_cache_dir() / f"listing-{self.base_id.split(':')[-1]}-{digest}.json"
        if cacheable and cache_file.exists():
            with contextlib.suppress(ValueError, OSError):
                return [(str(n), bool(d)) for n, d in json.loads(cache_file.read_text())]
        listing = [(name, info.isdir()) for name, info in list_dir(container, directory)]
        if cacheable and listing:
            with contextlib.suppress(OSError):
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                cache_file.write_text(json.dumps(listing))
        return listing

    def symlink(self, container: Any, step: Step, entries: list[tarfile.TarInfo]) -> str:
        spec = step.spec
        pairs: list[tuple[str, str]] = []
        if "glob" in spec:
            pattern = posixpath.normpath(spec["glob"])
            directory, name_glob = posixpath.split(pattern)
            if any(ch in directory for ch in "*?["):
                raise ConfigError("only the last component of a symlink glob may hold wildcards",
                                  location=step.location, key_path=f"{step.key_path}.glob", found=pattern)
            matches = sorted(name for name, is_directory in self.glob_listing(container, directory, step)
                             if fnmatch.fnmatchcase(name, name_glob) and not is_directory)
            if not matches:
                raise BuildError(f"symlink glob {pattern} matches nothing in the image",
                                 location=step.location, key_path=f"{step.key_path}.glob",
                                 hint="check the directory with `docker run --rm IMAGE ls DIR`")
            into = posixpath.normpath(spec["into"])
            pairs = [(f"{into}/{name}", f"{directory}/{name}") for name in matches]
        else:
            pairs = [(posixpath.normpath(spec["link"]), spec["target"])]
        made = skipped = 0
        for link, target in pairs:
            stat = path_stat(container, link)
            if stat is not None:
                if is_symlink(stat) and stat.get("linkTarget") == target:
                    skipped += 1
                    continue
                if is_dir(stat) and not is_symlink(stat):
                    if list_dir(container, link) and not spec.get("replace_directory"):
                        raise BuildError(
                            f"{link} is a non-empty directory in the image; refusing to replace it with a link",
                            location=step.location, key_path=step.key_path,
                            hint="link the files inside it (glob + into) instead; replace_directory: true forces it",
                        )
                elif not spec.get("replace"):
                    raise BuildError(
                        f"{link} already exists in the image",
                        location=step.location, key_path=step.key_path,
                        hint="set replace: true to replace existing files with links",
                    )
            entries.append(symlink_entry(link, target))
            made += 1
        return f"{made} link(s) made, {skipped} already in place"

    # -- script steps -------------------------------------------------------

    def run_script_step(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        import docker.errors

        step = planned.step
        assert step is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        with daemon_errors(f"script step {step.id}"):
            container = self.scope.create(
                parent, labels={L_KIND: "step-script"},
                **process_overrides(parent_config, IDLE_LOOP),
            )
            try:
                container.start()
                code, lines = exec_script(container, step, self.environ,
                                          echo=(lambda line: self.log(f"    | {line}")) if self.verbose else None)
                if code != 0:
                    # ENOSPC inside the step is the host's disk, not the script: infrastructure (exit 5)
                    full = any("no space left on device" in line.lower() for line in lines[-30:])
                    raise (InfraError if full else BuildError)(
                        f"script step {step.id!r} exited with code {code}"
                        + (": out of disk space (free some: invoke clean)" if full else ""),
                        location=step.location, key_path=step.key_path,
                        hint=f"run it by hand: docker run --rm -it {parent[:19]} sh",
                        log_tail=lines[-30:],
                    )
                if "source" in step.spec:  # a directory step's copy stays, like a Dockerfile COPY
                    api = client().api
                    cleanup = api.exec_create(container.id, ["rm", "-rf", SCRIPT_SCRATCH], user="root")["Id"]
                    api.exec_start(cleanup)
                # kill, not stop: the idle loop only sees TERM after its `sleep 1` (stop took ~1 s)
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
                image_id = self.commit(container, planned, parent_config)
            finally:
                self.scope.remove(container)
        return image_id, (lines[-1].strip() if lines else "no output")[:120]

    # -- verify / config ----------------------------------------------------

    def run_verify(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        from .verify import verify_image, verify_spec

        assert self.info is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        spec = verify_spec(self.plan, self.info.site)
        with daemon_errors("verifying"):
            report = verify_image(self.scope, parent, parent_config, self.target, self.info, spec, log=self.log,
                                  verbose=self.verbose)
        image_id = self.commit(report.container, planned, parent_config,
                               extra_labels={L_VERIFIED: canonical(report.summary())})
        self.scope.remove(report.container)
        return image_id, report.text()

    def run_config(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        parent_config = client().images.get(parent).attrs["Config"] or {}
        serving = self.target.serving
        if serving.style == "argv":
            cmd = fit_argv(parent_config.get("Entrypoint"), serving_argv(self.resolved))
        else:
            cmd = fit_command(parent_config.get("Entrypoint"), serving.command, serving.config_path)
        env = list(parent_config.get("Env") or [])
        serving_env = self.resolved.serving_env()
        env = [e for e in env if e.split("=", 1)[0] not in serving_env]
        env += [f"{k}={v}" for k, v in serving_env.items()]
        data = self.plan.serving_config
        with daemon_errors("writing the serving config"):
            container = self.scope.create(parent, labels={L_KIND: "config"})
            try:
                entry = file_entry(serving.config_path, data, mode=0o644)
                container.put_archive("/", tar_of([entry], {entry.name: data}))
                image_id = self.commit(
                    container, planned, parent_config,
                    conf={"Cmd": cmd, "Env": env},
                    extra_labels={L_PROFILE: self.resolved.profile_name, L_FINAL: "true",
                                  f"{LABEL}.serving-config": serving.config_path},
                )
            finally:
                self.scope.remove(container)
        return image_id, f"{serving.config_path} ({len(data)} bytes); CMD {json.dumps(cmd)}"


# --------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class BuildResult:
    run_id: str
    target: str
    profile: str
    image_id: str
    tags: tuple[str, ...]
    steps: tuple[StepResult, ...]
    seconds: float
    run_dir: Path

    @property
    def built(self) -> int:
        return sum(1 for s in self.steps if s.cache != "HIT")

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "target": self.target, "profile": self.profile, "image_id": self.image_id,
            "tags": list(self.tags), "seconds": round(self.seconds, 3), "run_dir": str(self.run_dir),
            "steps": [{"id": s.id, "kind": s.kind, "stage": s.stage, "cache": s.cache, "key": s.key,
                       "image_id": s.image_id, "seconds": round(s.seconds, 3), "detail": s.detail}
                      for s in self.steps],
        }


@contextlib.contextmanager
def image_lock(root: Path, image: str) -> Iterator[None]:
    """Serialise builds of one image name, so concurrent builds leave consistent tags."""
    lock_dir = root / ".imageforge" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / (image.replace("/", "_") + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class RunLog:
    """Writes the run directory (.imageforge/runs/<run id>/) and echoes progress."""

    def __init__(self, root: Path, run_id: str, echo: Log) -> None:
        self.dir = root / ".imageforge" / "runs" / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.dir / "build.log", "a", encoding="utf-8")  # noqa: SIM115
        self._echo = echo

    def __call__(self, line: str) -> None:
        self._fh.write(line + "\n")
        self._fh.flush()
        self._echo(line)

    def write_json(self, name: str, payload: Any) -> None:
        (self.dir / name).write_text(json.dumps(payload, indent=2, default=str) + "\n")

    def close(self) -> None:
        self._fh.close()


def build(resolved: Resolved, *, environ: Mapping[str, str], echo: Log = print, verbose: bool = False,
          make_base: bool = True, locked: bool = False) -> BuildResult:
    """Build (or reuse) every layer of the resolved target/profile and move its tags.

    ``locked``: first compare the inputs with build.lock (ConfigError, exit 2, on any drift).
    """
    from .docker_engine import ensure_daemon

    t_start = time.monotonic()
    target = resolved.target
    if target.base.recipe is None and target.base.reference(environ) is None:
        # Fail before touching Docker: the vendor image reference is missing.
        raise InfraError(
            f"the base image of target {target.name!r} comes from ${target.base.image_env}, which is not set",
            key_path=f"targets.{target.name}.base.image",
            hint=target.base.load_hint or f"export {target.base.image_env}=<image reference>",
        )
    for step in resolved.steps:
        if step.kind == "script" and "directory" in step.spec:
            script_directory(step, environ)  # an unset ${VAR} or a missing folder: exit 5 before Docker
    run_id = new_run_id()
    root = resolved.manifest.root
    runlog = RunLog(root, run_id, echo)
    try:
        ensure_daemon(log=runlog)
        if locked:
            from .housekeeping import check_lock

            check_lock(resolved, environ, runlog)
        with daemon_errors("preparing the build"):
            base_ref, base_id = base_reference(resolved, environ, runlog, make=make_base)
        probe = DaemonProbe()
        with image_lock(root, resolved.target.image):
            plan = make_plan(resolved, environ=environ, probe=_FixedBase(probe, base_id))
            runlog.write_json("plan.json", plan.to_json())
            labels = {L_TOOL: TOOL, L_RUN: run_id, L_MANIFEST: resolved.manifest.digest,
                      L_TARGET: resolved.target.name}
            n = len(plan.steps)
            runlog(f"build {resolved.target.name}:{resolved.profile_name}  run {run_id}  base {base_ref} "
                   f"({base_id.split(':')[-1][:12]})")
            results: list[StepResult] = []
            with containers(labels) as scope:
                builder = Builder(plan, log=runlog, verbose=verbose, run_id=run_id, scope=scope,
                                  base_ref=base_ref, base_id=base_id, environ=environ)
                parent = base_id
                needs_info = any(s.cache != "HIT" for s in plan.steps)
                if needs_info:
                    with daemon_errors("discovering the package"):
                        builder.info = discover_package(base_id, resolved.target, scope, runlog)
                for i, planned in enumerate(plan.steps, 1):
                    t0 = time.monotonic()
                    assert planned.key is not None
                    if planned.image_id is not None:
                        image_id, cache, detail = planned.image_id, "HIT", ""
                    else:
                        runner = {"verify": builder.run_verify, "config": builder.run_config}.get(planned.stage)
                        if runner is None:
                            assert planned.step is not None
                            runner = builder.run_script_step if planned.kind == "script" else builder.run_file_step
                        image_id, detail = runner(planned, parent)
                        cache = "SKIPPED" if detail.startswith("already applied") else "BUILT"
                    dt = time.monotonic() - t0
                    results.append(StepResult(planned.id, planned.kind, planned.stage, cache, planned.key,
                                              image_id, dt, detail))
                    runlog(f"  [{i}/{n}] {cache:<7} {planned.kind:<8} {planned.id:<28} {dt:6.2f}s"
                           + (f"  {detail}" if detail else ""))
                    parent = image_id
            with daemon_errors("tagging"):
                image = client().images.get(parent)
                for tag in plan.tags:
                    if tag in image.tags:  # already there (a no-op rebuild): ~30 ms per tag saved
                        continue
                    repo, _, tag_name = tag.rpartition(":")
                    image.tag(repo, tag_name)
            result = BuildResult(run_id, resolved.target.name, resolved.profile_name, parent, plan.tags,
                                 tuple(results), time.monotonic() - t_start, runlog.dir)
            runlog(f"tagged {', '.join(plan.tags)} -> {parent.split(':')[-1][:12]}  "
                   f"({result.built} of {n} steps built, {result.seconds:.1f}s)")
            runlog.write_json("summary.json", result.to_json())
            return result
    except ImageforgeError as exc:
        runlog.write_json("summary.json", {"run_id": run_id, "target": resolved.target.name,
                                           "profile": resolved.profile_name, "ok": False, "exit_code": exc.exit_code,
                                           "error": exc.render()})
        raise
    except KeyboardInterrupt:
        runlog.write_json("summary.json", {"run_id": run_id, "ok": False, "exit_code": 130, "error": "interrupted"})
        raise
    finally:
        runlog.close()


class _FixedBase:
    """A probe whose base image ID is already known (the build resolved it)."""

    def __init__(self, probe: DaemonProbe, base_id: str) -> None:
        self._probe = probe
        self._base_id = base_id

    def base_image_id(self, reference: str) -> str | None:
        return self._base_id

    def lookup(self, key: str) -> str | None:
        return self._probe.lookup(key)


def prepare_base(manifest: str | None, target: str | None) -> str:
    """Make sure the Docker engine answers and the target's base image (and model) exist."""
    from .docker_engine import ensure_daemon
    from .manifest import load_manifest, manifest_path
    from .resolve import resolve

    m = load_manifest(manifest_path(manifest))
    resolved = resolve(m, target, None, environ=os.environ)
    ensure_daemon()
    with daemon_errors("making the base image"):
        ref, _ = base_reference(resolved, os.environ, print, make=True)
    return ref


def build_for_cli(manifest: str | None, target: str | None, profile: str | None, sets: Sequence[str], *,
                  verbose: bool, quiet: bool, locked: bool = False) -> BuildResult:
    from .manifest import load_manifest, manifest_path
    from .resolve import resolve

    m = load_manifest(manifest_path(manifest))
    resolved = resolve(m, target, profile, environ=os.environ, sets=sets)
    with daemon_errors("building"):  # any SDK call outside a narrower scope: still no traceback
        return build(resolved, environ=os.environ, echo=(lambda _line: None) if quiet else print, verbose=verbose,
                     locked=locked)
