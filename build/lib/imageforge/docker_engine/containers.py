"""Containers as file systems: create and always remove them, read and write their files.

File steps, ``check-patches`` and discovery never start a process to look at an image: a
container is *created* from it, read with ``get_archive`` (and the HEAD archive stat), written
with ``put_archive`` (tarballs built here, with a fixed mtime for reproducible layers).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BuildError
from . import client

FIXED_MTIME = 1577836800  # 2020-01-01: written files get a fixed mtime (reproducible layers)
S_IFLNK_GO = 1 << 27  # Go's os.ModeSymlink in the archive stat header
S_IFDIR_GO = 1 << 31


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


def process_overrides(parent_config: Mapping[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """create() arguments that run ``argv`` while letting commit restore the parent's config.

    ``docker commit`` fills an empty ENTRYPOINT from the container, so the ENTRYPOINT is only
    overridden when the parent has one (commit then restores it explicitly).
    """
    if parent_config.get("Entrypoint"):
        return {"entrypoint": [argv[0]], "command": list(argv[1:])}
    return {"command": list(argv)}


# --------------------------------------------------------------------------- reading


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


# --------------------------------------------------------------------------- writing


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
