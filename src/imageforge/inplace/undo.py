"""Undoing an in-place step, recovering one left in progress (SIGKILL), and drift: a journaled path changed
since apply stops apply and revert (exit 3) unless ``--force`` keeps the drifted copy aside."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError
from .interrupts import deferred
from .journal import ABSENT, Journal, State, same_content, set_dir_meta, state_of, walk

Log = Callable[[str], None]


def restore_order(keys: Sequence[str], targets: Mapping[str, State]) -> list[str]:
    """Restores of something first (shallow first), then removals (deepest first)."""
    present = sorted((k for k in keys if targets[k]["type"] != "absent"), key=lambda k: k.count("/"))
    absent = sorted((k for k in keys if targets[k]["type"] == "absent"), key=lambda k: -k.count("/"))
    return present + absent


def undo_step(journal: Journal, step_id: str) -> int:
    """Every path whose last state is ``step_id``'s back to the state before it; the step leaves ``applied``.

    A step interrupted before its Changes were diffed (a script) also has its snapshot put back.
    """
    progress = journal.in_progress() or {}
    keys = journal.touched_by(step_id)
    targets: dict[str, State] = {}
    for key in keys:
        targets[key] = journal.before_last(key)
    snapshot_file = progress.get("snapshot") if progress.get("id") == step_id else None
    snapshot: dict[str, State] = {}
    if snapshot_file and Path(snapshot_file).exists():
        snapshot = json.loads(Path(snapshot_file).read_text())
        roots = [Path(r) for r in progress.get("roots", [])]
        for path in [p for r in roots for p in walk(r)]:
            if str(path) not in snapshot and str(path) not in targets:
                targets[str(path)] = dict(ABSENT)
        for key, state in snapshot.items():
            if key not in targets and not same_state(state_of(Path(key)), state):
                targets[key] = state
    for key in restore_order(list(targets), targets):
        journal.restore(key, targets[key])
    journal.restore_dirs({str(Path(k).parent) for k in targets} | {k for k in targets if targets[k]["type"] == "dir"})
    for key in sorted((k for k, s in snapshot.items() if s["type"] == "dir"), key=lambda k: -k.count("/")):
        set_dir_meta(Path(key), snapshot[key])
    for key in keys:
        journal.pop(key)
    journal.drop(step_id)
    if snapshot_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(snapshot_file)
    journal.save()
    return len(targets)


def same_state(a: State, b: State) -> bool:
    if not same_content(a, b):
        return False
    return all(a.get(k) == b.get(k) for k in ("mode", "uid", "gid", "mtime_ns") if a["type"] in ("file", "link"))


def recover(journal: Journal, log: Log) -> str | None:
    """A step left in progress (SIGKILL, a power cut) is rolled back; returns its id."""
    progress = journal.in_progress()
    if not progress:
        return None
    with deferred():
        undo_step(journal, str(progress["id"]))
    log(f"  recovered: step {progress['id']} was left in progress; rolled back")
    return str(progress["id"])


@dataclass(frozen=True)
class Drift:
    path: str
    expected: str
    found: str

    def text(self) -> str:
        return f"{self.path}: sha256 expected {self.expected}, found {self.found}"


def describe(state: State) -> str:
    kind_ = state.get("type")
    if kind_ == "file":
        return str(state.get("sha256"))
    if kind_ == "link":
        return f"link -> {state.get('link')}"
    return str(kind_)


def find_drift(journal: Journal) -> list[Drift]:
    """Journaled paths whose content differs from what the journal says is there."""
    out: list[Drift] = []
    for key in journal.journaled():
        want = journal.expected(key)
        if want["type"] == "file" and want.get("sha256") is None:
            continue
        now = state_of(Path(key), hashed=want["type"] == "file")
        if want["type"] == "dir" and now["type"] == "dir":
            continue
        if not same_content(now, want):
            out.append(Drift(key, describe(want), describe(now)))
    return out


def settle_drift(journal: Journal, force: bool, what: str) -> tuple[str, ...]:
    """Exit 3 naming the drifted files; with ``force`` each drifted copy is moved aside and the journal goes on."""
    drift = find_drift(journal)
    if not drift:
        return ()
    if not force:
        raise BuildError(f"{len(drift)} journaled path(s) changed since apply; {what} stopped",
                         problems=(), log_tail=[d.text() for d in drift],
                         hint="put the files back, or --force (the drifted copies are kept aside)")
    aside = journal.directory / "drifted" / time.strftime("%Y%m%dT%H%M%S")
    kept: list[str] = []
    for d in drift:
        path = Path(d.path)
        if os.path.lexists(path):
            dest = aside / path.relative_to(journal.root.resolve() if path.is_absolute() else journal.root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
            kept.append(str(dest))
        journal.restore(d.path, journal.expected(d.path))
    journal.restore_dirs({str(Path(d.path).parent) for d in drift})
    return tuple(kept)
