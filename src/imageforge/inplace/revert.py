"""``revert`` and ``status`` of an in-place apply.

:func:`revert` puts every journaled path back as it was before the first apply (bytes, mode, owner, mtime,
link; added files, made directories and the ``.pyc`` imageforge wrote removed, and every ``.pyc`` that appeared
since apply in a ``__pycache__`` imageforge wrote into (an import after apply); directories' mtimes put
back), then removes the journal. :func:`status` says what the journal holds, what drifted, and checks the
package against its dist-info ``RECORD``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .interrupts import deferred, interruptible
from .journal import Journal, journal_dir, state_of
from .safety import root_lock
from .undo import find_drift, recover, restore_order, settle_drift

Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


@dataclass(frozen=True)
class RevertReport:
    root: str
    restored: int
    steps: tuple[str, ...]
    seconds: float
    nothing: bool = False
    drift_kept: tuple[str, ...] = ()
    recovered: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "restored": self.restored, "steps": list(self.steps), "nothing": self.nothing,
                "seconds": round(self.seconds, 3), "drift_kept": list(self.drift_kept), "recovered": self.recovered}

    def text(self) -> str:
        if self.nothing:
            return f"revert {self.root}: nothing to revert (no journal at {journal_dir(Path(self.root))})"
        out = [f"revert {self.root}: {self.restored} path(s) restored, steps " + ", ".join(self.steps)
               + f" undone; journal removed ({self.seconds:.2f}s)"]
        if self.recovered:
            out.append(f"  step {self.recovered} was left in progress; rolled back first")
        out += [f"  ! drifted copy kept at {p}" for p in self.drift_kept]
        return "\n".join(out)


def revert(root: Path = Path("/"), *, force: bool = False, log: Log = _quiet) -> RevertReport:
    """Every journaled path back to its original; the journal removed (drift: exit 3 unless ``force``)."""
    t0 = time.monotonic()
    root = root.resolve()
    with root_lock(root), interruptible():
        journal = Journal.load(root)
        if journal is None:
            return RevertReport(str(root), 0, (), time.monotonic() - t0, nothing=True)
        recovered = recover(journal, log)
        kept = settle_drift(journal, force, "revert")
        steps = tuple(step for step, _ in journal.applied())
        with deferred():
            targets = journal.originals()
            journal.drop_new_bytecode()  # first: a __pycache__ apply made is then empty when its absence is restored
            for key in restore_order(list(targets), targets):
                journal.restore(key, targets[key])
            dirs = set(journal.directories()) | {k for k, s in targets.items() if s["type"] == "dir"}
            journal.note_dirs({k: s for k, s in targets.items() if s["type"] == "dir"})
            journal.restore_dirs(dirs)
            if kept:  # the drifted copies stay in the journal's folder: keep it, emptied of the rest
                journal.clear()
                journal.save()
            else:
                journal.remove()
    return RevertReport(str(root), len(targets), steps, time.monotonic() - t0, drift_kept=kept,
                        recovered=recovered)


def record_mismatches(dist_info: Path) -> tuple[int, list[str]]:
    """(files checked, files whose sha256 differs from RECORD or are missing) of an installed distribution."""
    record = dist_info / "RECORD"
    if not record.is_file():
        return 0, []
    site = dist_info.parent
    checked = 0
    bad: list[str] = []
    with record.open(newline="") as fh:
        for row in csv.reader(fh):
            if len(row) < 2 or not row[1].startswith("sha256="):
                continue
            path = (site / row[0]).resolve() if not os.path.isabs(row[0]) else Path(row[0])
            checked += 1
            try:
                digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            except OSError:
                bad.append(f"{path} (missing)")
                continue
            if "sha256=" + digest != row[1]:
                bad.append(str(path))
    return checked, bad


@dataclass(frozen=True)
class StatusReport:
    root: str
    journal: dict[str, Any] | None
    drift: tuple[str, ...] = ()
    record_checked: int = 0
    record_changed: tuple[str, ...] = field(default_factory=tuple)  # RECORD differences the journal explains
    record_foreign: tuple[str, ...] = field(default_factory=tuple)  # RECORD differences it does not

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(a["id"] for a in (self.journal or {}).get("applied", []))

    @property
    def ok(self) -> bool:
        return not self.drift and not self.record_foreign

    def to_json(self) -> dict[str, Any]:
        j = self.journal or {}
        return {"root": self.root, "applied": list(self.applied), "target": j.get("target"),
                "profile": j.get("profile"), "python": j.get("python"), "environ": j.get("environ"),
                "in_progress": j.get("in_progress"), "paths": len(j.get("paths", {})), "drift": list(self.drift),
                "pristine": {"checked": self.record_checked, "changed_by_imageforge": list(self.record_changed),
                             "changed_otherwise": list(self.record_foreign)}, "ok": self.ok}

    def text(self) -> str:
        if self.journal is None:
            out = [f"status {self.root}: nothing applied in place (no journal)"]
        else:
            j = self.journal
            out = [f"status {self.root}: {j.get('target')}:{j.get('profile')} applied with {j.get('python')} "
                   f"({len(j.get('paths', {}))} journaled path(s))",
                   "  steps: " + (", ".join(self.applied) or "none")]
            if j.get("in_progress"):
                out.append(f"  ! step {j['in_progress']['id']} was left in progress (the next apply or revert "
                           "rolls it back)")
        out += [f"  ! drift: {d}" for d in self.drift]
        if self.record_checked:
            out.append(f"  RECORD: {self.record_checked} file(s) checked, {len(self.record_changed)} changed by "
                       f"the journaled steps, {len(self.record_foreign)} changed otherwise")
            out += [f"    ! {p}" for p in self.record_foreign[:20]]
        return "\n".join(out)


def status(root: Path = Path("/"), *, dist_info: str | None = None) -> StatusReport:
    """What is applied under ``root``, what drifted, and the package against its RECORD (``dist_info``:
    the distribution's dist-info folder when nothing is journaled)."""
    root = root.resolve()
    journal = Journal.load(root)
    drift = tuple(d.text() for d in find_drift(journal)) if journal else ()
    info = dist_info or (journal.get("dist_info") if journal else None)
    checked, bad = record_mismatches(Path(info)) if info else (0, [])
    journaled = set(journal.journaled()) if journal else set()
    changed = tuple(p for p in bad if p in journaled)
    foreign = tuple(p for p in bad if p not in journaled)
    return StatusReport(str(root), journal.record() if journal else None, drift, checked, changed, foreign)


def listing(top: Path) -> list[tuple[Any, ...]]:
    """(path, type, mode, uid:gid, size, mtime_ns, link, sha256) of everything under ``top``: what revert keeps."""
    from .journal import walk

    out: list[tuple[Any, ...]] = []
    for path in walk(top):
        s = state_of(path)
        out.append((str(path), s["type"], s.get("mode"), f"{s.get('uid')}:{s.get('gid')}", s.get("size"),
                    s.get("mtime_ns"), s.get("link"), s.get("sha256")))
    return out
