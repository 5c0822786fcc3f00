"""The live file system under a root as an :class:`imageforge.steps.fs.ImageFS` (image paths in, host paths read).

Each step kind's ``apply`` reads the machine through this, exactly as it reads an image; what it returns
(its Changes) is then written under the root through the journal (:mod:`imageforge.inplace.apply`).
"""

from __future__ import annotations

import os
import stat as st
from pathlib import Path

from ..errors import BuildError
from ..steps.fs import Entry, FileMeta
from .runner import in_root


class LocalFS:
    """ImageFS over ``root`` (``/``: the machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host(self, path: str) -> Path:
        return in_root(self.root, path)

    def stat(self, path: str) -> Entry | None:
        try:
            info = os.lstat(self.host(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if st.S_ISLNK(info.st_mode):
            return Entry("link", os.readlink(self.host(path)))
        return Entry("dir" if st.S_ISDIR(info.st_mode) else "file")

    def identity(self, path: str) -> tuple[str | int, ...] | None:
        """What changes when the file's bytes may have (its ELF summary is kept by it: vendor_api.elfcache):
        host path, device, inode, size, mtime and ctime in ns (a rewrite that keeps size and mtime moves ctime)."""
        host = self.host(path)
        try:
            info = os.stat(host)
        except OSError:
            return None
        if not st.S_ISREG(info.st_mode):
            return None
        return ("host", str(host), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def read(self, path: str) -> bytes | None:
        found = self.read_file(path)
        return None if found is None else found[0]

    def read_file(self, path: str) -> tuple[bytes, FileMeta] | None:
        entry = self.stat(path)
        if entry is None:
            return None
        if entry.kind == "link":
            raise BuildError(f"{path} is a symbolic link (to {entry.link_target})",
                             hint="patch or overlay the file it points to")
        if entry.kind == "dir":
            raise BuildError(f"{path} is not a regular file")
        host = self.host(path)
        info = os.stat(host)
        return host.read_bytes(), FileMeta(st.S_IMODE(info.st_mode), info.st_uid, info.st_gid, int(info.st_mtime))

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]:
        host = self.host(directory)
        if not host.is_dir():
            return []
        out: list[tuple[str, Entry]] = []
        for name in sorted(os.listdir(host)):
            entry = self.stat(f"{directory.rstrip('/')}/{name}")
            if entry is not None:
                out.append((name, entry))
        return out
