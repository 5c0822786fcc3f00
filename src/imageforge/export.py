"""`export`: the deliverable -- a `docker save` tarball, its sha256, a JSON description; `--push`.

``invoke export --target T --profile P [--out DIR] [--gzip] [--push REPO] [--no-save]``

* The image exported is the one ``invoke build`` tagged ``<image>:<profile>``; it must carry
  the cache key the manifest describes now (else the tag is stale: exit 3, rebuild first).
* The tarball holds both tags (``<profile>`` and ``<profile>-<manifest digest>``), so
  ``docker load -i FILE`` restores them.  It is written to a temporary name and renamed when
  complete, with its sha256 computed while streaming (``FILE.sha256``, sha256sum format).
* ``FILE.json`` describes it: image ID, tags, labels, size, config (ENTRYPOINT/CMD/ENV), the
  serving config (rendered file, args, env, command) and the run options to start it.
* ``--push REPO`` tags the image ``REPO:<profile>`` and ``REPO:<profile>-<digest>`` and pushes
  through the SDK.  Credentials come from Docker's own config (``$DOCKER_CONFIG`` or
  ``~/.docker/config.json``, credential helpers included); they are never printed, logged
  or written anywhere.  The REPO tags added for the push are removed afterwards.

Everything goes through the docker SDK, so ``DOCKER_HOST`` selects the daemon.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import hashlib
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from . import labels as lb
from .base import DaemonProbe
from .cli.progress import Tracker, progress
from .docker_engine import DiskNeed, check_disk, client, daemon_errors, ensure_daemon, human_bytes
from .errors import BuildError, ConfigError, InfraError
from .manifest.resolve import Resolved
from .plan import Plan, make_plan
from .rundirs import image_lock

Log = Callable[[str], None]
CHUNK = 1 << 20


@dataclass
class ExportResult:
    image_id: str
    tags: tuple[str, ...]
    tarball: Path | None
    sha256: str | None
    description: Path
    bytes: int
    seconds: float
    pushed: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "tags": list(self.tags),
                "tarball": str(self.tarball) if self.tarball else None, "sha256": self.sha256,
                "description": str(self.description), "bytes": self.bytes, "seconds": round(self.seconds, 2),
                "pushed": self.pushed}

    def text(self) -> str:
        out = [f"exported {', '.join(self.tags)} ({self.image_id.split(':')[-1][:12]}) in {self.seconds:.1f}s"]
        if self.tarball is not None:
            out.append(f"  tarball      {self.tarball}  ({human_bytes(self.bytes)})")
            out.append(f"  sha256       {self.sha256}  ({self.tarball.name}.sha256)")
        out.append(f"  description  {self.description}")
        for p in self.pushed:
            out.append(f"  pushed       {p['ref']}@{p['digest']}")
        if self.tarball is not None:
            out.append(f"  load with    docker load -i {self.tarball}")
        return "\n".join(out)


def file_stem(image: str, profile: str) -> str:
    """``imageforge/cpu`` + ``conservative`` -> ``imageforge-cpu-conservative`` (pure)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in f"{image}-{profile}")
    return safe.strip("-") or "image"


def sha256_line(digest: str, name: str) -> str:
    """One line in `sha256sum` format (``sha256sum -c`` reads it)."""
    return f"{digest}  {name}\n"


def run_options(resolved: Any) -> dict[str, Any]:
    r = resolved.run
    return {"port": r.port, "shm_size": r.shm_size, "ipc": r.ipc, "gpus": r.gpus, "devices": list(r.devices),
            "privileged": r.privileged, "env": dict(r.env),
            "ulimits": {k: list(v) for k, v in r.ulimits.items()},
            "volumes": [asdict(v) for v in r.volumes]}


def docker_run_example(tag: str, options: Mapping[str, Any], host_address: str = "127.0.0.1") -> str:
    """A `docker run` line that serves the image as the manifest's run options say (pure)."""
    parts = ["docker run -d"]
    if options.get("shm_size"):
        parts.append(f"--shm-size {options['shm_size']}")
    if options.get("ipc"):
        parts.append(f"--ipc {options['ipc']}")
    if options.get("privileged"):
        parts.append("--privileged")
    if options.get("gpus"):
        parts.append(f"--gpus {options['gpus']}")
    for dev in options.get("devices", ()):
        parts.append(f"--device {dev}")
    for k, v in sorted(options.get("env", {}).items()):
        parts.append(f"-e {k}={v}")
    for vol in options.get("volumes", ()):
        parts.append(f"-v {vol['source']}:{vol['target']}" + (":ro" if vol.get("read_only") else ""))
    port = options.get("port", 8000)
    parts.append(f"-p {host_address}:{port}:{port}")
    parts.append(tag)
    return " ".join(parts)


def describe(resolved: Any, plan: Any, image_attrs: Mapping[str, Any], *, tarball: str | None, sha256: str | None,
             nbytes: int, compressed: bool) -> dict[str, Any]:
    """The JSON description of an exported image (pure)."""
    config = image_attrs.get("Config") or {}
    labels = dict(config.get("Labels") or {})
    tags = list(plan.tags)
    options = run_options(resolved)
    return {
        "format": "imageforge-export/1",
        "exported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": resolved.target.name,
        "profile": resolved.profile_name,
        "manifest_digest": resolved.manifest.digest,
        "file": tarball,
        "compression": "gzip" if compressed else None,
        "sha256": sha256,
        "file_bytes": nbytes,
        "load": f"docker load -i {tarball}" if tarball else None,
        "image": {
            "id": image_attrs.get("Id"),
            "tags": tags,
            "size": image_attrs.get("Size"),
            "created": image_attrs.get("Created"),
            "architecture": image_attrs.get("Architecture"),
            "os": image_attrs.get("Os"),
            "entrypoint": config.get("Entrypoint"),
            "cmd": config.get("Cmd"),
            "env": list(config.get("Env") or []),
            "working_dir": config.get("WorkingDir"),
            "user": config.get("User"),
            "labels": labels,
        },
        "serving": {
            "config_path": resolved.target.serving.config_path,
            "config": plan.serving_config.decode("utf-8"),
            "command": list(resolved.target.serving.command),
            "args": resolved.serving_args(),
            "env": resolved.serving_env(),
        },
        "run": options,
        "run_example": docker_run_example(tags[0], options),
        "pushed": [],
    }


# --------------------------------------------------------------------------- daemon side


def _plan_for_export(resolved: Resolved, environ: Mapping[str, str]) -> tuple[Plan, Any]:
    """(plan, image) for the tagged image of TARGET:PROFILE; stale tags refused."""
    import docker.errors

    plan = make_plan(resolved, environ=environ, probe=DaemonProbe())
    tag = plan.tags[0]
    try:
        image = client().images.get(tag)
    except docker.errors.ImageNotFound:
        raise InfraError(f"{tag} is not on the Docker daemon",
                         hint=f"build it first: invoke build --target {resolved.target.name} "
                         f"--profile {resolved.profile_name}") from None
    have = (image.attrs.get("Config") or {}).get("Labels", {}) or {}
    want = plan.final.key
    if want is not None and have.get(lb.L_KEY) != want:
        raise BuildError(
            f"{tag} is not the image the manifest describes now",
            expected=f"cache key {want[:16]}", found=f"cache key {str(have.get(lb.L_KEY))[:16]}",
            hint=f"rebuild it: invoke build --target {resolved.target.name} --profile {resolved.profile_name}",
        )
    if want is None:
        raise InfraError(f"the base image of {resolved.target.name!r} is not on the daemon, so {tag} cannot be "
                         "checked against the manifest", hint=plan.base_problem or "")
    return plan, image


def _save_stream(tags: Iterable[str]) -> Iterable[bytes]:
    """`docker save TAG...` through the SDK (one tarball naming every tag)."""
    api = client().api
    response = api._get(api._url("/images/get"), params={"names": list(tags)}, stream=True)
    chunks: Iterable[bytes] = api._stream_raw_result(response, CHUNK, False)
    return chunks


def _counted(chunks: Iterable[bytes], bar: Tracker) -> Iterator[bytes]:
    """``chunks``, advancing ``bar`` by each one's size."""
    for chunk in chunks:
        bar.advance(len(chunk))
        yield chunk


def _write_tarball(chunks: Iterable[bytes], dest: Path, *, compress: bool) -> tuple[str, int]:
    """Stream ``chunks`` to ``dest`` (atomic rename), hashing the bytes written. (sha256, size)"""
    tmp = dest.with_name(f".{dest.name}.partial")
    digest = hashlib.sha256()
    size = 0

    class _Hashing:
        def __init__(self, fh: IO[bytes]) -> None:
            self.fh = fh

        def write(self, data: bytes) -> int:
            nonlocal size
            digest.update(data)
            size += len(data)
            return self.fh.write(data)

        def flush(self) -> None:
            self.fh.flush()

    try:
        with open(tmp, "wb") as raw:
            sink = _Hashing(raw)
            if compress:
                with gzip.GzipFile(filename="", mode="wb", fileobj=sink, compresslevel=1, mtime=0) as gz:
                    for chunk in chunks:
                        gz.write(chunk)
            else:
                for chunk in chunks:
                    sink.write(chunk)
            raw.flush()
            os.fsync(raw.fileno())
        tmp.replace(dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return digest.hexdigest(), size


def saved_image_ids(tarball: Path) -> list[str]:
    """Image IDs (sha256:...) a `docker save` tarball holds, from its manifest.json (written last: a plain tarball
    is read with seeks over the layers, headers only; a gzipped one has to be read through)."""
    with contextlib.ExitStack() as stack:
        if tarball.name.endswith(".gz"):
            raw = stack.enter_context(gzip.open(tarball, "rb"))
            tar = stack.enter_context(tarfile.open(fileobj=raw, mode="r|"))
        else:
            tar = stack.enter_context(tarfile.open(tarball, mode="r:"))
        for member in tar:
            if member.name == "manifest.json":
                fh = tar.extractfile(member)
                assert fh is not None
                entries = json.loads(fh.read())
                return ["sha256:" + str(e["Config"]).split("/")[-1].removesuffix(".json") for e in entries]
    return []


def push_image(image: Any, tags: Iterable[str], repository: str, log: Log) -> list[dict[str, str]]:
    """Tag ``image`` as ``repository:<tag part>`` for each tag, push, untag what we added."""
    import docker.errors

    api = client().api
    out: list[dict[str, str]] = []
    if "@" in repository or repository.rsplit("/", 1)[-1].count(":"):
        raise ConfigError("--push takes a repository without tag or digest", found=repository,
                          expected="e.g. 127.0.0.1:5000/imageforge/cpu")
    existing = set(image.tags)
    added: list[str] = []
    try:
        for tag in tags:
            tag_name = tag.rpartition(":")[2]
            ref = f"{repository}:{tag_name}"
            if ref not in existing:
                image.tag(repository, tag_name)
                added.append(ref)
            digest = ""
            errors: list[str] = []
            layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes pushed, its size), from the daemon's events
            with progress(f"docker push {ref}", unit="bytes") as bar:
                for event in api.push(repository, tag=tag_name, stream=True, decode=True):
                    if "error" in event:
                        errors.append(str(event.get("error")))
                    aux = event.get("aux") or {}
                    if aux.get("Digest"):
                        digest = str(aux["Digest"])
                    detail = event.get("progressDetail") or {}
                    if event.get("id") and detail.get("total"):
                        layers[str(event["id"])] = (int(detail.get("current") or 0), int(detail["total"]))
                        bar.update(completed=sum(c for c, _ in layers.values()),
                                   total=sum(n for _, n in layers.values()))
            if errors:
                raise InfraError(f"push of {ref} failed", found=errors[-1][:300],
                                 hint="is the registry reachable and are you logged in? credentials come from "
                                 "Docker's config (docker login REGISTRY; $DOCKER_CONFIG)")
            log(f"pushed {ref}  {digest}")
            out.append({"ref": ref, "digest": digest})
    finally:
        for ref in added:
            with contextlib.suppress(docker.errors.APIError):
                api.remove_image(ref, noprune=True)
    return out


def export(resolved: Resolved, *, environ: Mapping[str, str], out: str | None = None, push: str | None = None,
           gzip_: bool = False, save: bool = True, log: Log = print) -> ExportResult:
    """`invoke export`: see the module docstring."""
    t0 = time.monotonic()
    ensure_daemon(log=log)
    # builds of this checkout move tags under this lock: hold it so the tag cannot move mid-export
    with daemon_errors("exporting the image"), image_lock(resolved.manifest.root, resolved.target.image):
        plan, image = _plan_for_export(resolved, environ)
        out_dir = Path(out) if out else resolved.manifest.root / "dist"
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = file_stem(resolved.target.image, resolved.profile_name)
        tarball: Path | None = None
        digest: str | None = None
        nbytes = 0
        if save:
            tarball = out_dir / (stem + (".tar.gz" if gzip_ else ".tar"))
            size = int(image.attrs.get("Size") or 0)
            check_disk([DiskNeed("the exported tarball", out_dir, size // 2 if gzip_ else size)])
            log(f"saving {', '.join(plan.tags)} -> {tarball}")
            with progress(f"docker save {plan.tags[0]}", total=size or None, unit="bytes") as bar:
                digest, nbytes = _write_tarball(_counted(_save_stream(plan.tags), bar), tarball, compress=gzip_)
            saved = saved_image_ids(tarball)
            if saved != [str(image.id)]:  # a build elsewhere (another checkout) moved the tag meanwhile
                tarball.unlink()
                raise BuildError(f"the tarball holds {saved}, not the checked image {image.id}",
                                 hint="a tag moved during the export (a concurrent build?); run it again")
            (out_dir / (tarball.name + ".sha256")).write_text(sha256_line(digest, tarball.name))
        description = describe(resolved, plan, image.attrs, tarball=tarball.name if tarball else None,
                               sha256=digest, nbytes=nbytes, compressed=gzip_)
        pushed: list[dict[str, str]] = []
        if push:
            pushed = push_image(image, plan.tags, push, log)
            description["pushed"] = pushed
        desc_path = out_dir / (stem + ".json")
        desc_path.write_text(json.dumps(description, indent=2, default=str) + "\n")
    return ExportResult(str(image.id), tuple(plan.tags), tarball, digest, desc_path, nbytes,
                        time.monotonic() - t0, pushed)
