"""The in-place apply's guards: one command per root, no write leaving the root or reached through a link
leaving the package, a script's declared paths expanded, and where the scan that catches what a script changed
without declaring it looks (:func:`scan_tops`; the scan: :mod:`.changescan`)."""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import posixpath
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import BuildError
from .package import LocalPackage


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """One in-place command per root at a time (flock on the root directory itself: nothing is written)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def guard_path(pkg: LocalPackage, host: Path, allowed: Sequence[Path]) -> None:
    """Refuse a path outside the root, or one reached through a link leaving the package and ``allowed``."""
    root = pkg.root.resolve()
    parent = Path(os.path.realpath(host.parent))
    if parent != root and root not in parent.parents:
        raise BuildError(f"{host} resolves outside the root {root} (through {parent})",
                         hint="in-place apply writes only under --root")
    if parent == Path(os.path.normpath(host.parent)):
        return
    ok = [pkg.host(pkg.package_dir).resolve(), *(a.resolve() for a in allowed)]
    if not any(parent == a or a in parent.parents for a in ok):
        raise BuildError(f"{host} goes through a symbolic link to {parent}, outside the package and the step's "
                         "declared destinations", hint="write to the real path instead")


def expand(pkg: LocalPackage, patterns: Sequence[str]) -> list[Path]:
    """Host paths of a script's declared image paths; a wildcard in the last component is matched now."""
    out: list[Path] = []
    for pattern in patterns:
        parent, name = posixpath.split(pattern)
        if any(ch in name for ch in "*?["):
            directory = pkg.host(parent)
            if directory.is_dir():
                out.extend(directory / n for n in sorted(os.listdir(directory)) if fnmatch.fnmatchcase(n, name))
        else:
            out.append(pkg.host(pattern))
    return out


def under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def scan_tops(pkg: LocalPackage) -> tuple[list[Path], list[bool]]:
    """Where a script's undeclared change is looked for: the site directory and the interpreter's purelib and
    platlib (each whole), its bin directory and scripts directory (their entries): where pip writes."""
    places: list[tuple[Path, bool]] = [(pkg.host(pkg.site), True)]
    places += [(pkg.host(p), True) for p in (pkg.scheme_path("purelib"), pkg.scheme_path("platlib")) if p]
    places.append((Path(pkg.python).parent, False))
    places += [(pkg.host(p), False) for p in (pkg.scheme_path("scripts"),) if p]
    chosen: list[tuple[Path, bool]] = []
    for host, recursive in places:
        if any(t == host or (d and t in host.parents) for t, d in chosen):
            continue  # already scanned (in a venv the site is the purelib)
        if recursive:  # a top under this one is covered by it
            chosen = [(t, d) for t, d in chosen if host not in t.parents]
        chosen.append((host, recursive))
    return [t for t, _ in chosen], [d for _, d in chosen]
