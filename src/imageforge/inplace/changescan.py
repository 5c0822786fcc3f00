"""What a script step changed outside what it declares, with one ``lstat`` scan instead of two.

Before the script: a names-only listing of the scanned trees (``os.scandir``: name, ``d_type``, ``d_ino``; no
``lstat``), the exact state of the few paths that need one (below), then a **marker**: a file made in the
journal's folder, touched again until its ctime moves one timestamp tick on (a few ms: what this apply did
before has a ctime at or before the first value, the script's changes one at or after the last). After the
script: one ``lstat`` per entry. A path counts as changed when it is new, gone, of another type or inode (a
rename over it), or when its ctime is after the marker less its file system's timestamp granularity. Every
change to a file's bytes, size, mode, owner, mtime (``utime`` included: ctime cannot be set) or links moves its
ctime to the clock's present; a name made, removed or renamed in a folder moves the folder's. So a same-size
rewrite with its mtime put back is seen, which the mtime-and-size comparison of two scans missed.

Exact paths, stat'ed before and compared field by field: what the journal already holds from this apply (on a
file system with whole-second timestamps the steps just before would otherwise fall in the marker's second),
and the folders between a scanned tree and a declared path (a declared path's write legitimately touches them:
on an overlay root a copy-up gives them a new ctime; they are compared on type, size, mode and mtime as before).

The one way a ctime could fall before the marker is the wall clock (CLOCK_REALTIME, ctime's source) being set
back while the script runs. That is detected exactly, not sampled: a timerfd armed on CLOCK_REALTIME with
``TFD_TIMER_CANCEL_ON_SET`` is cancelled by the kernel on any setting of the clock (``settimeofday``,
``clock_settime``, an NTP step, a leap second), however short and whichever way. If the clock was set, no ctime
can be trusted: :meth:`ChangeScan.changes` names every scanned path and says why (the caller stops with exit 3
as for an undeclared change). Where no timerfd can be armed (not Linux, no libc), the listing takes the full
``lstat`` state of every entry instead and compares field by field (the two-scan way: exact, slower).
Timestamps are assumed to come from this machine's clock (a local file system or an overlay on one).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import math
import os
import stat as st
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

#: (type, size, mode, mtime_ns): how a folder on the way to a declared path is compared (see the module).
Loose = tuple[int, int, int, int]
#: (type, size, mode, mtime_ns, ctime_ns, ino, nlink, uid, gid): every other path compared field by field.
Exact = tuple[int, int, int, int, int, int, int, int, int]
#: path -> (folder, link or other, d_ino): the names-only listing.
Names = dict[str, tuple[int, int]]
_OTHER, _DIR, _LINK = 0, 1, 2


class ClockWatch(Protocol):
    """Was CLOCK_REALTIME set between :meth:`arm` and :meth:`was_set`?"""

    def arm(self) -> bool:
        """Start watching; False when this machine cannot tell (then the scan compares full states)."""

    def was_set(self) -> bool: ...

    def offset_ns(self) -> int:
        """CLOCK_REALTIME less CLOCK_BOOTTIME now: moves only when the clock is set (for the message)."""

    def close(self) -> None: ...


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class KernelClock:
    """The kernel's word on CLOCK_REALTIME being set: a timerfd with ``TFD_TIMER_CANCEL_ON_SET`` (Linux >= 3.0).

    Armed for an absolute time ten years ahead; reading it gives ECANCELED once the clock was set (the kernel
    keeps that until the timer is armed again), EAGAIN when it was not, and its expiry count if the clock was
    set past the ten years: every answer but EAGAIN counts as set."""

    CLOCK_REALTIME = 0
    TFD_NONBLOCK = os.O_NONBLOCK
    TFD_CLOEXEC = 0o2000000
    TFD_TIMER_ABSTIME = 1
    TFD_TIMER_CANCEL_ON_SET = 2

    def __init__(self) -> None:
        self.fd: int | None = None

    def arm(self) -> bool:
        if not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return False
        fd = int(create(self.CLOCK_REALTIME, self.TFD_NONBLOCK | self.TFD_CLOEXEC))
        if fd < 0:
            return False
        when = _Itimerspec(_Timespec(0, 0), _Timespec(int(time.time()) + 10 * 365 * 86400, 0))
        if settime(fd, self.TFD_TIMER_ABSTIME | self.TFD_TIMER_CANCEL_ON_SET, ctypes.byref(when), None) != 0:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def was_set(self) -> bool:
        if self.fd is None:
            return True
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno != errno.ECANCELED:
                raise
        return True

    def offset_ns(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_BOOTTIME)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def granularity_ns(ctime_ns: int) -> int:
    """An upper bound of the timestamp granularity of the file system that wrote ``ctime_ns``: the kernel
    truncates a timestamp to a multiple of it, and it divides a second; a whole second may be FAT's two."""
    g = math.gcd(ctime_ns, 1_000_000_000)
    return 2_000_000_000 if g == 1_000_000_000 else g


def _type(mode: int) -> int:
    return st.S_IFMT(mode)


@dataclass
class ChangeScan:
    """One scan's worth of state: :meth:`before` right before the script, :meth:`changes` right after it."""

    tops: Sequence[Path]
    skip: Sequence[Path]
    recursive: Sequence[bool]
    marker_dir: Path
    exact: Sequence[Path] = ()
    loose: Sequence[Path] = ()
    clock: ClockWatch = field(default_factory=KernelClock)
    names: Names = field(default_factory=dict)
    states: dict[str, tuple[int, ...]] = field(default_factory=dict)
    marker_ns: int = 0
    tick_wait_s: float = 0.05
    armed: bool = False
    offset0: int = 0

    def _walk(self) -> Iterator[os.DirEntry[str]]:
        skipped = {str(p) for p in self.skip}
        for top, deep in zip(self.tops, self.recursive, strict=True):
            if not top.is_dir() or any(top == s or s in top.parents for s in self.skip):
                continue
            pending = [str(top)]
            while pending:
                try:
                    entries = list(os.scandir(pending.pop()))
                except OSError:  # gone, or unreadable: os.walk's default too
                    continue
                for entry in entries:
                    if entry.path in skipped:
                        continue
                    yield entry
                    try:
                        if deep and entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                    except OSError:
                        continue

    def before(self) -> None:
        """The names listing, the exact paths' states, the clock armed, then the marker (last: nothing of
        this apply's own work falls after it)."""
        self.armed = self.clock.arm()
        self.offset0 = self.clock.offset_ns()
        for entry in self._walk():
            kind = _DIR if entry.is_dir(follow_symlinks=False) else _LINK if entry.is_symlink() else _OTHER
            self.names[entry.path] = (kind, entry.inode())
            if not self.armed:  # no word on the clock: the full state of every entry (exact, the slower way)
                self._keep(entry.path)
        for path in [*self.exact, *self.loose]:
            if str(path) in self.names:
                self._keep(str(path))
        marker = self.marker_dir / f".imageforge-marker-{os.getpid()}"
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"marker\n")
            first = os.fstat(fd).st_ctime_ns
            self.marker_ns = first
            deadline = time.monotonic() + self.tick_wait_s
            while self.marker_ns <= first and time.monotonic() < deadline:  # one timestamp tick on
                time.sleep(0.0005)
                os.utime(fd)
                self.marker_ns = os.fstat(fd).st_ctime_ns
        finally:
            os.close(fd)
            os.unlink(marker)

    def _keep(self, path: str) -> None:
        try:
            self.states[path] = self._state(path, os.lstat(path))
        except FileNotFoundError:
            self.names.pop(path, None)

    def _state(self, path: str, s: os.stat_result) -> tuple[int, ...]:
        if path in self._loose:
            return (_type(s.st_mode), s.st_size, s.st_mode, s.st_mtime_ns)
        return (_type(s.st_mode), s.st_size, s.st_mode, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_nlink,
                s.st_uid, s.st_gid)

    @functools.cached_property
    def _loose(self) -> frozenset[str]:
        return frozenset(str(p) for p in self.loose)

    def changes(self) -> tuple[list[str], list[str], str]:
        """(changed paths, added paths, why every path is named: "" unless the clock was set)."""
        loose = self._loose
        names, states, marker = self.names, self.states, self.marker_ns
        coarsest = marker - 2_000_000_000  # a ctime at or below it is before the marker on any file system
        changed: list[str] = []
        added: list[str] = []
        known: list[str] = []
        for entry in self._walk():
            path = entry.path
            try:
                s = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            old = names.get(path)
            if old is None:
                added.append(path)
                continue
            known.append(path)
            fmt = s.st_mode & 0o170000
            if (_DIR if fmt == st.S_IFDIR else _LINK if fmt == st.S_IFLNK else _OTHER, entry.inode()) != old:
                changed.append(path)
            elif path in states:
                if self._state(path, s) != states[path]:
                    changed.append(path)
            else:
                c = s.st_ctime_ns
                if c > coarsest and c > marker - granularity_ns(c) and path not in loose:
                    changed.append(path)
        gone = [] if len(known) == len(names) else sorted(set(names).difference(known))
        changed += gone
        why = ""
        if self.armed and self.clock.was_set():
            step = (self.clock.offset_ns() - self.offset0) / 1e9
            why = (f"the system clock (CLOCK_REALTIME) was set while the step ran (now {step:+.3f} s against the "
                   "boot clock): a change can no longer be told by its ctime, so every scanned path counts as "
                   "changed")
            changed = sorted(names)
        self.clock.close()
        return sorted(changed), sorted(added), why
