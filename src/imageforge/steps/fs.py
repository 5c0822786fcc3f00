"""The image file system a step kind's ``apply`` reads: a read-only view, in memory or over a container.

* :class:`DictFS`: an in-memory view (unit tests, the checks' fixtures);
* :class:`ContainerFS`: a created (never started) container, through get_archive/HEAD archive only; a pristine
  container's directory listings are kept on disk by image ID (the archive of a directory carries its files: torch/lib
  is ~450 MB to name 13 entries).

``apply`` never writes through these: it returns :class:`imageforge.steps.core.Changes`, which
the build writes into its step container (put_archive) and check-patches records in its overlay.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..docker_engine import containers as dc
from ..errors import BuildError
from ..settings import cache_dir, keep_json

#: The format of a kept listing; a new one makes every older entry a miss.
LISTING_FORMAT = "imageforge-dir-listing/1"


@dataclass(frozen=True)
class Entry:
    """What is at a path: a regular file, a directory or a symbolic link (with its target)."""

    kind: Literal["file", "dir", "link"]
    link_target: str | None = None


@dataclass(frozen=True)
class FileMeta:
    """A regular file's mode, owner and mtime in the image (None: not known, the writer's defaults)."""

    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    mtime: int | None = None


class ImageFS(Protocol):
    """Read-only view of an image's files (what the step kinds need)."""

    def stat(self, path: str) -> Entry | None: ...

    def read(self, path: str) -> bytes | None:
        """Bytes of a regular file; None when absent.  May raise BuildError (a link, a directory)."""
        ...

    def read_file(self, path: str) -> tuple[bytes, FileMeta] | None:
        """Bytes and mode/owner/mtime of a regular file; None when absent (BuildError as ``read``)."""
        ...

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]: ...


@dataclass
class DictFS:
    """An in-memory ImageFS: ``files`` path -> bytes, ``links`` path -> target; directories implied.

    ``meta`` gives a file's mode/owner/mtime (default: 0644, root, unknown mtime).
    """

    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    meta: dict[str, FileMeta] = field(default_factory=dict)

    def _dirs(self) -> set[str]:
        out = set(self.dirs) | {"/"}
        for path in [*self.files, *self.links, *self.dirs]:
            parent = posixpath.dirname(path)
            while parent not in out:
                out.add(parent)
                parent = posixpath.dirname(parent)
        return out

    def stat(self, path: str) -> Entry | None:
        path = posixpath.normpath(path)
        if path in self.links:
            return Entry("link", self.links[path])
        if path in self.files:
            return Entry("file")
        if path in self._dirs():
            return Entry("dir")
        return None

    def read(self, path: str) -> bytes | None:
        path = posixpath.normpath(path)
        if path in self.links:
            raise BuildError(f"{path} is a symbolic link in the image (to {self.links[path]})",
                             hint="patch or overlay the file it points to")
        if path in self._dirs():
            raise BuildError(f"{path} is not a regular file in the image")
        return self.files.get(path)

    def read_file(self, path: str) -> tuple[bytes, FileMeta] | None:
        data = self.read(path)
        return None if data is None else (data, self.meta.get(posixpath.normpath(path), FileMeta()))

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]:
        directory = posixpath.normpath(directory)
        out: list[tuple[str, Entry]] = []
        for path in sorted({*self.files, *self.links, *self._dirs()}):
            if path != directory and posixpath.dirname(path) == directory:
                entry = self.stat(path)
                assert entry is not None
                out.append((posixpath.basename(path), entry))
        return out


class ContainerFS:
    """ImageFS over a container: get_archive/HEAD archive only (it need not be started).

    ``pristine``: the creator's word that nothing writes into the container while it is read (created from an
    image and only read: check-patches' view of the base, a committed step's reader); its files are then the
    image's, and :meth:`identity` names them by the image ID.
    """

    def __init__(self, container: Any, *, pristine: bool = False) -> None:
        self.container = container
        self.pristine = pristine
        self._stats: dict[str, dict[str, Any] | None] = {}  # a pristine container's HEAD answers, by path

    def _path_stat(self, path: str) -> dict[str, Any] | None:
        """The daemon's stat of ``path`` (HEAD archive); a pristine container's asked once per path (the ELF
        resolution follows every component of every candidate path: /usr, /usr/local, ... again and again)."""
        if not self.pristine:
            return dc.path_stat(self.container, path)
        if path not in self._stats:
            self._stats[path] = dc.path_stat(self.container, path)
        return self._stats[path]

    def identity(self, path: str) -> tuple[str | int, ...] | None:
        """The image's content at ``path`` (its ELF summary is kept by it: vendor_api.elfcache): the container's
        image ID, the path, its size, mtime and mode; None for a container that is not pristine (what a step
        wrote there is not the image's) and for what is not a regular file."""
        image_id = self.image_id()
        if image_id is None:
            return None
        st = self._path_stat(path)
        if st is None or dc.is_symlink(st) or dc.is_dir(st):
            return None
        return ("image", image_id, path, int(st.get("size", -1)), str(st.get("mtime", "")),
                int(st.get("mode", 0)))

    def stat(self, path: str) -> Entry | None:
        st = self._path_stat(path)
        if st is None:
            return None
        if dc.is_symlink(st):
            return Entry("link", str(st.get("linkTarget", "")))
        return Entry("dir" if dc.is_dir(st) else "file")

    def read(self, path: str) -> bytes | None:
        found = dc.read_file(self.container, path)
        return None if found is None else found[0]

    def read_file(self, path: str) -> tuple[bytes, FileMeta] | None:
        found = dc.read_file(self.container, path)
        if found is None:
            return None
        data, member = found
        return data, FileMeta(member.mode, member.uid, member.gid, int(member.mtime))

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]:
        """The directory's entries; a pristine container's through :func:`kept_listing` (by its image ID)."""
        image_id = self.image_id()
        if image_id is None:
            return self.read_dir(directory)
        return kept_listing(image_id, directory, lambda: self.read_dir(directory))

    def image_id(self) -> str | None:
        """The ID of the image whose files these are: a pristine container's image; None otherwise."""
        image_id = (getattr(self.container, "attrs", None) or {}).get("Image") if self.pristine else None
        return str(image_id) if image_id else None

    def read_dir(self, directory: str) -> list[tuple[str, Entry]]:
        """The directory's entries, read from the container now (its archive)."""
        out: list[tuple[str, Entry]] = []
        for name, info in dc.list_dir(self.container, directory):
            if info.issym():
                out.append((name, Entry("link", info.linkname)))
            else:
                out.append((name, Entry("dir" if info.isdir() else "file")))
        return out


Listing = list[tuple[str, Entry]]


def kept_listing(image_id: str, directory: str, read: Callable[[], Listing]) -> Listing:
    """``directory``'s entries in the image ``image_id``: ``read()`` once, then kept in ``cache_dir()/listings``
    (an image ID names its content; a kept entry that does not read as one is read again)."""
    kept = listing_path(image_id, directory)
    found = _read_listing(kept)
    if found is not None:
        return found
    out = read()
    keep_json(kept, [[name, e.kind, e.link_target] for name, e in out])
    return out


def listing_path(image_id: str, directory: str) -> Path:
    """Where the listing of ``directory`` in the image ``image_id`` is kept."""
    key = json.dumps([LISTING_FORMAT, image_id, posixpath.normpath(directory)])
    return cache_dir() / "listings" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def _read_listing(path: Path) -> Listing | None:
    """A kept listing, or None (none kept, or one that does not read as one: read again)."""
    try:
        rows = json.loads(path.read_text())
        return [(str(name), Entry(kind, None if target is None else str(target))) for name, kind, target in rows
                if kind in ("file", "dir", "link")]
    except (OSError, ValueError, TypeError):
        return None
