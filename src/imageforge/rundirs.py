"""Run directories and locks: run ids, the run directory and its log, file locks (through ``filelock``).

Every command that leaves a record writes it under ``<manifest dir>/.imageforge/runs/<run id>/``
(:func:`run_dir`, the one place that path is spelled); builds of one image name are serialised by
:func:`image_lock` under ``.imageforge/locks/``; the host cache serialises its own work with
:func:`file_lock`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

Log = Callable[[str], None]

STATE_DIR = ".imageforge"


def new_run_id() -> str:
    """``20240101-120000-ab12``: sortable by time, unique enough for one machine."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def runs_dir(root: Path) -> Path:
    """``<root>/.imageforge/runs``: where every run directory lives."""
    return root / STATE_DIR / "runs"


def run_dir(root: Path, run_id: str) -> Path:
    return runs_dir(root) / run_id


def locks_dir(root: Path) -> Path:
    return root / STATE_DIR / "locks"


# --------------------------------------------------------------------------- locks


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its directory), waiting as long as it takes."""
    import filelock

    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(path):
        yield


def _image_lock_path(root: Path, image: str) -> Path:
    return locks_dir(root) / (image.replace("/", "_") + ".lock")


def image_lock(root: Path, image: str) -> contextlib.AbstractContextManager[None]:
    """Serialise builds (and exports) of one image name, so concurrent builds leave consistent tags."""
    return file_lock(_image_lock_path(root, image))


@contextlib.contextmanager
def free_image_locks(root: Path, images: Iterable[str]) -> Iterator[set[str]]:
    """Take each image's build lock without waiting; yield the names whose lock is held here.

    An image whose lock another process holds (a build running now) is left out.
    """
    import filelock

    held: dict[str, Any] = {}
    try:
        for image in sorted(set(images)):
            path = _image_lock_path(root, image)
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(path)
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                continue
            held[image] = lock
        yield set(held)
    finally:
        for lock in held.values():
            with contextlib.suppress(OSError):
                lock.release()


# --------------------------------------------------------------------------- the run log


class RunLog:
    """Writes the run directory (``.imageforge/runs/<run id>/``) and echoes progress."""

    def __init__(self, root: Path, run_id: str, echo: Log, *, name: str = "build.log") -> None:
        self.run_id = run_id
        self.dir = run_dir(root, run_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.dir / name, "a", encoding="utf-8")  # noqa: SIM115
        self._echo = echo

    def __call__(self, line: str) -> None:
        self._fh.write(line + "\n")
        self._fh.flush()
        self._echo(line)

    def write_json(self, name: str, payload: Any) -> None:
        (self.dir / name).write_text(json.dumps(payload, indent=2, default=str) + "\n")

    def close(self) -> None:
        self._fh.close()
