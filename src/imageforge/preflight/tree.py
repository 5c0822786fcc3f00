"""The final tree preflight checks: every file a step or a script added or changed, what the image holds besides
(a listing of the import roots), and the host folders the submission ships. Pure: the Docker side fills it in
(:mod:`.run`), the unit tests write one by hand."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

Reader = Callable[[str], "bytes | None"]


@dataclass(frozen=True)
class TreeFile:
    path: str  # absolute path in the image
    data: bytes
    step: str  # the step that produced it
    added: bool = False  # new in the tree (not a changed file of the base)


@dataclass(frozen=True)
class ShippedFolder:
    """A host folder a script step copies into the image (``directory`` -> ``dest``) and runs ``command`` in."""

    step: str
    host: Path
    dest: str
    command: tuple[str, ...]

    def files(self) -> dict[str, Path]:
        """Relative name -> host file, every regular file of the folder."""
        return {p.relative_to(self.host).as_posix(): p for p in sorted(self.host.rglob("*"))
                if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(self.host).parts}


@dataclass
class FinalTree:
    site: str
    python_version: str
    package: str  # the package's import name (vllm)
    roots: tuple[str, ...]  # import roots: the site dirs, the target's PYTHONPATH
    files: dict[str, TreeFile] = field(default_factory=dict)
    listing: frozenset[str] = frozenset()  # every path (files and directories) under the roots, final state
    reader: Reader | None = None  # reads any file of the final image
    folders: tuple[ShippedFolder, ...] = ()
    removed: frozenset[str] = frozenset()
    cache: dict[str, bytes] = field(default_factory=dict)  # files of the final image already read (what reader gives)
    _index: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _index_key: tuple[int, int] | None = field(default=None, repr=False)

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        return (path in self.files or path in self.listing) and path not in self.removed

    def _children(self) -> dict[str, set[str]]:
        """Directory -> the names in it (built once from the listing and the changed files)."""
        key = (len(self.listing), len(self.files))
        if self._index_key != key:
            index: dict[str, set[str]] = {}
            for path in [*self.listing, *self.files]:
                parent, _, name = path.rstrip("/").rpartition("/")
                index.setdefault(parent or "/", set()).add(name)
            self._index, self._index_key = index, key
        return self._index

    def is_dir(self, path: str) -> bool:
        return bool(self._children().get(path.rstrip("/")))

    def read(self, path: str) -> bytes | None:
        if path in self.files:
            return self.files[path].data
        for folder in self.folders:
            if path.startswith(folder.dest.rstrip("/") + "/"):
                host = folder.host / path[len(folder.dest.rstrip("/")) + 1:]
                if host.is_file():
                    return host.read_bytes()
        if path in self.cache:
            return self.cache[path]
        return self.reader(path) if self.reader is not None else None

    def producer(self, path: str) -> str | None:
        if path in self.files:
            return self.files[path].step
        for folder in self.folders:
            if path.startswith(folder.dest.rstrip("/") + "/"):
                return folder.step
        return None

    def module_of(self, path: str, roots: Iterable[str] | None = None) -> str | None:
        """Dotted module name of a ``.py`` file under one of the roots (the longest root that holds it)."""
        best: str | None = None
        for root in roots if roots is not None else self.roots:
            prefix = root.rstrip("/") + "/"
            if path.startswith(prefix) and (best is None or len(root) > len(best)):
                best = root
        if best is None or not path.endswith(".py"):
            return None
        rel = path[len(best.rstrip("/")) + 1:-3]
        parts = rel.split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None

    def find_module(self, name: str, roots: Iterable[str] | None = None) -> tuple[str, str] | None:
        """(kind, path) of module ``name`` in the tree: ``source`` (a .py or a package's __init__.py), ``package``
        (a folder without __init__: a namespace package), ``extension`` (a .so), or None."""
        rel = name.replace(".", "/")
        for root in roots if roots is not None else self.roots:
            base = posixpath.join(root, rel)
            for candidate, kind in ((base + "/__init__.py", "source"), (base + ".py", "source")):
                if self.exists(candidate):
                    return kind, candidate
            parent = posixpath.dirname(base)
            leaf = posixpath.basename(base)
            for path in self._in_dir(parent):
                tail = path[len(parent) + 1:]
                if "/" not in tail and tail.startswith(leaf + ".") and tail.endswith(".so"):
                    return "extension", path
            if self.is_dir(base):
                return "package", base
        return None

    def _in_dir(self, directory: str) -> list[str]:
        directory = directory.rstrip("/")
        return [f"{directory}/{name}" for name in sorted(self._children().get(directory, ()))]


def listing_from(paths: Iterable[str]) -> frozenset[str]:
    """Every path and every parent directory of ``paths``."""
    out: set[str] = set()
    for p in paths:
        p = p.rstrip("/")
        while p and p not in out:
            out.add(p)
            p = posixpath.dirname(p)
            if p == "/":
                break
    return frozenset(out)


def tree_from_mapping(files: Mapping[str, bytes], *, changed: Mapping[str, str], site: str, package: str,
                      python_version: str = "3.10", roots: tuple[str, ...] = (), added: Iterable[str] = (),
                      folders: tuple[ShippedFolder, ...] = ()) -> FinalTree:
    """A tree from a path -> bytes mapping (every file of the image) and changed path -> producing step."""
    added_set = set(added)
    return FinalTree(site=site, python_version=python_version, package=package, roots=roots or (site,),
                     files={p: TreeFile(p, files[p], step, p in added_set) for p, step in changed.items()},
                     listing=listing_from(files), reader=files.get, folders=folders)
