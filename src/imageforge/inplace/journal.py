"""The write-ahead journal of an in-place apply: ``ROOT/var/lib/imageforge/``.

* ``journal.json``: what is applied (the plan's step keys, the steps completed, the one in progress), the
  interpreter and its ``PYTHONPATH``/``LD_LIBRARY_PATH``, and for every path changed its original state and
  one state per step that changed it (a stack: the top is what the disk should hold);
* ``objects/<sha256>``: the bytes of every file state recorded (originals included), copied, never linked;
* ``snapshots/<step>.json``: a script step's declared trees as they were before it ran.

Every change is recorded (and the journal fsync'd) *before* it is made; files are replaced atomically
(a temporary file in the same directory, fsync, rename). :func:`write_file` / :func:`make_link` are the only
writers of the root; :func:`restore` puts a recorded state back (bytes, mode, owner, mtime, link).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import stat as st
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BuildError
from .interrupts import critical

JOURNAL_DIR = "var/lib/imageforge"
FORMAT = 1
TMP_SUFFIX = ".imageforge-tmp"

State = dict[str, Any]  # {"type": absent|file|link|dir, "mode", "uid", "gid", "size", "mtime_ns", "link", "sha256"}
ABSENT: State = {"type": "absent"}


def journal_dir(root: Path) -> Path:
    return root / JOURNAL_DIR


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def state_of(path: Path, *, hashed: bool = True) -> State:
    """What is at ``path`` now (never following a final link)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return dict(ABSENT)
    base: State = {"mode": st.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid,
                   "mtime_ns": info.st_mtime_ns}
    if st.S_ISLNK(info.st_mode):
        return {**base, "type": "link", "link": os.readlink(path)}
    if st.S_ISDIR(info.st_mode):
        return {**base, "type": "dir"}
    if st.S_ISREG(info.st_mode):
        return {**base, "type": "file", "size": info.st_size, "sha256": sha256_file(path) if hashed else None}
    return {**base, "type": "other"}


def same_content(a: State, b: State) -> bool:
    """Same type and content (bytes or link target); mode/owner/mtime are not compared."""
    if a.get("type") != b.get("type"):
        return False
    if a["type"] == "file":
        return bool(a.get("sha256") == b.get("sha256"))
    if a["type"] == "link":
        return bool(a.get("link") == b.get("link"))
    return True


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _chown(path: Path, uid: int | None, gid: int | None, *, link: bool = False) -> None:
    if uid is None or gid is None:
        return
    info = os.lstat(path)
    if (info.st_uid, info.st_gid) != (uid, gid):
        with contextlib.suppress(PermissionError):
            os.chown(path, uid, gid, follow_symlinks=not link)


def write_file(path: Path, data: bytes, mode: int, uid: int | None, gid: int | None, mtime_ns: int | None) -> None:
    """Replace ``path`` atomically: a temporary file in its directory, fsync'd, renamed over it."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with critical():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        _chown(tmp, uid, gid)
        os.chmod(tmp, mode)  # after chown (which may clear set-id bits)
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
        _fsync_dir(path.parent)


def make_link(path: Path, target: str, uid: int | None = None, gid: int | None = None,
              mtime_ns: int | None = None) -> None:
    """Replace ``path`` with a symbolic link to ``target`` atomically (link at a temporary name, renamed)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with critical():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(target, tmp)
        _chown(tmp, uid, gid, link=True)
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
        _fsync_dir(path.parent)


def set_dir_meta(path: Path, state: State) -> None:
    if state.get("type") != "dir" or not path.is_dir() or path.is_symlink():
        return
    os.chmod(path, int(state["mode"]))
    _chown(path, state.get("uid"), state.get("gid"))
    os.utime(path, ns=(int(state["mtime_ns"]), int(state["mtime_ns"])))


@dataclass
class Journal:
    """The journal of one root, loaded in memory; :meth:`save` writes it atomically and fsyncs it."""

    root: Path
    _data: dict[str, Any] = field(default_factory=dict)  # changed only through the methods below

    # -- files -------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return journal_dir(self.root)

    @property
    def path(self) -> Path:
        return self.directory / "journal.json"

    @property
    def objects(self) -> Path:
        return self.directory / "objects"

    @classmethod
    def load(cls, root: Path) -> Journal | None:
        path = journal_dir(root) / "journal.json"
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise BuildError(f"the in-place journal {path} is not readable", found=str(exc),
                             hint="it is written atomically: a broken file was edited by hand") from None
        if data.get("format") != FORMAT:
            raise BuildError(f"the in-place journal {path} has format {data.get('format')}", expected=str(FORMAT))
        return cls(root, data)

    @classmethod
    def create(cls, root: Path, header: Mapping[str, Any]) -> Journal:
        """A new journal (its directory made, and the directories made for it remembered for revert)."""
        made: list[str] = []
        parents: dict[str, State] = {}
        directory = journal_dir(root)
        current = root
        for part in Path(JOURNAL_DIR).parts:
            child = current / part
            if not child.exists():
                parents.setdefault(str(current), state_of(current))
                made.append(str(child))
            current = child
        directory.mkdir(parents=True, exist_ok=True)
        journal = cls(root, {"format": FORMAT, **header, "applied": [], "in_progress": None, "paths": {},
                             "dirs": {}, "made": made, "made_parents": parents})
        journal.save()
        return journal

    def save(self) -> None:
        text = json.dumps(self._data, indent=1, sort_keys=True)
        tmp = self.path.with_name("journal.json" + TMP_SUFFIX)
        with critical():
            with tmp.open("w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)

    def keep(self, path: Path) -> str:
        """Copy a file's bytes into the object store (by sha256; a copy, never a hard link)."""
        self.objects.mkdir(exist_ok=True)
        digest = sha256_file(path)
        blob = self.objects / digest
        if not blob.exists():
            tmp = blob.with_name(digest + TMP_SUFFIX)
            shutil.copyfile(path, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, blob)
        return digest

    def keep_bytes(self, data: bytes) -> str:
        self.objects.mkdir(exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        blob = self.objects / digest
        if not blob.exists():
            tmp = blob.with_name(digest + TMP_SUFFIX)
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, blob)
        return digest

    def blob(self, digest: str) -> bytes:
        return (self.objects / digest).read_bytes()

    # -- recording -----------------------------------------------------------

    @property
    def _paths(self) -> dict[str, Any]:
        paths: dict[str, Any] = self._data["paths"]
        return paths

    # -- reading -------------------------------------------------------------

    def get(self, name: str) -> Any:
        """A header value (``target``, ``profile``, ``dist_info``, ...), None when absent."""
        return self._data.get(name)

    def record(self) -> dict[str, Any]:
        """The whole journal as JSON data (a copy: `status` shows it)."""
        return copy.deepcopy(self._data)

    def applied(self) -> list[tuple[str, str]]:
        """(step id, key) of every applied step, in order."""
        return [(str(a["id"]), str(a["key"])) for a in self._data["applied"]]

    def in_progress(self) -> dict[str, Any] | None:
        """The step left in progress (its id, key, and a script's snapshot and roots), or None."""
        progress = self._data.get("in_progress")
        return dict(progress) if progress else None

    def journaled(self) -> list[str]:
        """Every path the journal holds, sorted."""
        return sorted(self._paths)

    def holds(self, key: str) -> bool:
        return key in self._paths

    def known(self, key: str) -> bool:
        """``key`` is journaled as a path or as a directory whose metadata comes back."""
        return key in self._paths or key in self._data["dirs"]

    def directories(self) -> list[str]:
        return sorted(self._data["dirs"])

    def originals(self) -> dict[str, State]:
        """Every journaled path's original state (what revert puts back)."""
        return {k: dict(e["original"]) for k, e in self._paths.items()}

    def before_last(self, key: str) -> State:
        """What ``key`` held before the last step that changed it: the state below the top, else its original."""
        stack = self._paths[key]["stack"]
        return dict(stack[-2]["state"]) if len(stack) > 1 else dict(self._paths[key]["original"])

    def capture(self, path: Path) -> State:
        """The state at ``path`` now, its bytes kept (a file)."""
        state = state_of(path, hashed=False)
        if state["type"] == "file":
            state["sha256"] = self.keep(path)
        return state

    def note_original(self, path: Path, original: State | None = None) -> None:
        """Remember ``path``'s original state (first change only) and its directory's mode/owner/mtime."""
        key = str(path)
        if key not in self._paths:
            self._paths[key] = {"original": original if original is not None else self.capture(path), "stack": []}
        parent = str(path.parent)
        if parent not in self._data["dirs"] and parent not in self._paths:
            self._data["dirs"][parent] = state_of(path.parent)

    def note_pycache(self, cache: Path) -> None:
        """Remember the ``.pyc`` names in ``cache`` (a ``__pycache__`` imageforge writes into) before its first
        write there: revert removes every ``.pyc`` that appeared in it since (an import after apply compiles the
        patched sources, or modules next to them; none of that bytecode was there before)."""
        caches: dict[str, list[str] | None] = self._data.setdefault("pycache", {})
        key = str(cache)
        if key not in caches:
            caches[key] = sorted(n for n in os.listdir(cache) if n.endswith(".pyc")) if cache.is_dir() else None

    def drop_new_bytecode(self) -> list[str]:
        """Remove the ``.pyc`` files that appeared, since apply, in the ``__pycache__`` folders imageforge wrote
        into and that no journaled path accounts for (those are put back by :meth:`restore`)."""
        removed: list[str] = []
        for key, before in sorted(self._data.get("pycache", {}).items()):
            cache = Path(key)
            if not cache.is_dir():
                continue
            kept = set(before or ())
            for name in sorted(os.listdir(cache)):
                path = cache / name
                if name.endswith(".pyc") and name not in kept and str(path) not in self._paths and path.is_file():
                    with critical():
                        os.unlink(path)
                    removed.append(str(path))
        return removed

    def push(self, path: Path, step: str, state: State, original: State | None = None) -> None:
        self.note_original(path, original)
        self._paths[str(path)]["stack"].append({"step": step, "state": state})

    def note_dir(self, key: str, state: State | None = None) -> None:
        """Remember a directory's mode/owner/mtime (``state``, else read now) unless it or a journaled path at
        ``key`` is known already, so revert puts it back."""
        if not self.known(key):
            self._data["dirs"][key] = state if state is not None else state_of(Path(key))

    def note_dirs(self, states: Mapping[str, State]) -> None:
        """Directories' metadata, recorded (replacing what was there)."""
        self._data["dirs"].update(states)

    def settle(self, step: str) -> None:
        """The paths ``step`` changed last recorded as the disk holds them now (mtimes, made directories)."""
        for key in self.touched_by(step):
            self._paths[key]["stack"][-1]["state"] = state_of(Path(key))

    def update_header(self, header: Mapping[str, Any]) -> None:
        self._data.update(header)

    def pop(self, key: str) -> None:
        """``key``'s last change forgotten (it was undone)."""
        self._paths[key]["stack"].pop()

    def drop(self, step: str) -> None:
        """``step`` leaves ``applied`` (and ``in_progress`` when it is the one there)."""
        self._data["applied"] = [a for a in self._data["applied"] if a["id"] != step]
        progress = self._data.get("in_progress")
        if progress and progress.get("id") == step:
            self._data["in_progress"] = None

    def clear(self) -> None:
        """Nothing applied and no path held any more (revert keeping the journal's folder)."""
        self._data["applied"], self._data["paths"], self._data["in_progress"] = [], {}, None

    def expected(self, key: str) -> State:
        """What the disk should hold at ``key`` now: the top of its stack, else its original."""
        entry = self._paths[key]
        return dict(entry["stack"][-1]["state"]) if entry["stack"] else dict(entry["original"])

    def begin(self, step: str, key: str, **extra: Any) -> None:
        self._data["in_progress"] = {"id": step, "key": key, **extra}

    def complete(self, step: str, key: str, detail: str) -> None:
        self._data["applied"].append({"id": step, "key": key, "detail": detail})
        self._data["in_progress"] = None
        self.save()

    def touched_by(self, step: str) -> list[str]:
        return [k for k, e in self._paths.items() if e["stack"] and e["stack"][-1]["step"] == step]

    # -- restoring -------------------------------------------------------------

    def restore(self, key: str, state: State) -> None:
        """Put ``state`` back at ``key`` (a recorded file's bytes come from the object store)."""
        path = Path(key)
        kind = state["type"]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.with_name(path.name + TMP_SUFFIX))
        if kind == "absent":
            if path.is_symlink() or path.is_file():
                with critical():
                    os.unlink(path)
            elif path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()  # a directory something else filled stays
            return
        if kind == "dir":
            if path.is_symlink() or path.is_file():
                os.unlink(path)
            path.mkdir(exist_ok=True)
            set_dir_meta(path, state)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            make_link(path, str(state["link"]), state.get("uid"), state.get("gid"), state.get("mtime_ns"))
            return
        if kind == "file":
            now = state_of(path, hashed=False)
            if now["type"] == "dir":
                shutil.rmtree(path)
            write_file(path, self.blob(str(state["sha256"])), int(state["mode"]), state.get("uid"), state.get("gid"),
                       state.get("mtime_ns"))
            return
        raise BuildError(f"cannot restore {key}: state {kind!r} is not supported")

    def restore_dirs(self, keys: Iterable[str]) -> None:
        """Directories' original mode/owner/mtime, deepest first (after their entries were put back)."""
        for key in sorted(keys, key=lambda k: -k.count("/")):
            state = self._data["dirs"].get(key)
            if state is not None:
                set_dir_meta(Path(key), state)

    def remove(self) -> None:
        """Remove the journal and the directories made for it (their parents' mtimes put back)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        for made in sorted(self._data.get("made", []), key=lambda k: -k.count("/")):
            with contextlib.suppress(OSError):
                Path(made).rmdir()
        for key, state in sorted(self._data.get("made_parents", {}).items(), key=lambda kv: -kv[0].count("/")):
            set_dir_meta(Path(key), state)
        parent = self.directory.parent
        if parent.is_dir():
            _fsync_dir(parent)


def walk(top: Path) -> Iterator[Path]:
    """Every path under ``top`` (``top`` included), not following links; missing: nothing. In name order, also
    across directories (os.walk descends in ``dirnames``' order: sorted in place, not the directory's order, which
    a directory removed and made again, as pip does with a package, changes)."""
    if not os.path.lexists(top):
        return
    yield top
    if top.is_symlink() or not top.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        dirnames.sort()
        for name in dirnames:
            yield base / name
        for name in sorted(filenames):
            yield base / name
