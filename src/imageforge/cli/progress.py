"""Progress of long work on stderr: a rich bar on a terminal, plain lines otherwise, nothing under ``--quiet``.

::

    with progress("bench", total=32, unit="requests") as bar:
        ...
        bar.advance()            # one more done
    with progress("save imageforge/cpu:conservative", total=size, unit="bytes") as bar:
        bar.update(completed=n)  # or bar.advance(len(chunk))

``rich.progress`` is imported only when a bar is drawn. Off a terminal a line is written at the start, then at
most every :data:`PLAIN_EVERY_S` seconds (and at the end): ``bench: 12/32 requests (38%), ETA 40s``. A command
run with ``--quiet`` wraps its work in :func:`quiet` (see ``imageforge.cli.output.command_io``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

PLAIN_EVERY_S = 10.0
_QUIET: list[bool] = []


@contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress at all inside (``--quiet``)."""
    _QUIET.append(on)
    try:
        yield
    finally:
        _QUIET.pop()


def is_quiet() -> bool:
    return bool(_QUIET and _QUIET[-1])


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


class Tracker:
    """One task's progress: ``advance(n)``, ``update(completed=, total=)``; drawn by a bar or plain lines."""

    def __init__(self, label: str, total: float | None, unit: str, stream: TextIO, bar: Any = None,
                 task: Any = None, clock: Any = time.monotonic) -> None:
        self.label, self.total, self.unit, self.stream = label, total, unit, stream
        self.completed = 0.0
        self._bar, self._task, self._clock = bar, task, clock
        self._t0 = clock()
        self._last_line = float("-inf")
        self._finished = False

    def advance(self, n: float = 1) -> None:
        self.update(completed=self.completed + n)

    def update(self, *, completed: float | None = None, total: float | None = None) -> None:
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, total=self.total)
        elif self._bar is None and self.stream is not None:
            now = self._clock()
            if now - self._last_line >= PLAIN_EVERY_S:
                self._write_line(now)

    def line(self, now: float | None = None) -> str:
        """``label: done/total unit (pct%), ETA Ns`` (bytes shown as sizes)."""
        now = self._clock() if now is None else now
        if not self.total and not self.unit and not self.completed:  # work without a measure: running, then done
            return f"{self.label}: {'done' if self._finished else 'running'} ({now - self._t0:.0f}s)"
        done = _size(self.completed) if self.unit == "bytes" else f"{self.completed:g}"
        text = f"{self.label}: {done}"
        if self.total:
            total = _size(self.total) if self.unit == "bytes" else f"{self.total:g}"
            text += f"/{total}"
        if self.unit and self.unit != "bytes":
            text += f" {self.unit}"
        if self.total:
            fraction = min(1.0, self.completed / self.total)
            text += f" ({fraction:.0%})"
            elapsed = now - self._t0
            if 0 < fraction < 1 and elapsed > 0:
                text += f", ETA {elapsed * (1 - fraction) / fraction:.0f}s"
        return text

    def _write_line(self, now: float) -> None:
        self._last_line = now
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def finish(self) -> None:
        self._finished = True
        if self._bar is None and self.stream is not None:
            self._write_line(self._clock())


class _Silent(Tracker):
    def update(self, *, completed: float | None = None, total: float | None = None) -> None:
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total

    def finish(self) -> None:
        return None


@contextmanager
def progress(label: str, total: float | None = None, *, unit: str = "", stream: TextIO | None = None,
             live: bool | None = None) -> Iterator[Tracker]:
    """Show the progress of one piece of work (``unit="bytes"``: sizes and a transfer speed)."""
    out = stream if stream is not None else sys.stderr
    if is_quiet():
        yield _Silent(label, total, unit, out)
        return
    if not (out.isatty() if live is None else live):
        tracker = Tracker(label, total, unit, out)
        tracker.update()
        try:
            yield tracker
        finally:
            tracker.finish()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn()]
    columns += [DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()]
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=Console(file=out), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield Tracker(label, total, unit, out, bar=bar, task=task)


@contextmanager
def watch_size(folder: Any, tracker: Tracker, *, every: float = 0.5) -> Iterator[None]:
    """While the body runs (a subprocess downloading into ``folder``, say), set ``tracker``'s completed bytes to
    the size of the files under ``folder``, every ``every`` seconds (a thread), and once more at the end."""
    root = Path(folder)
    stop = threading.Event()

    def size() -> int:
        total = 0
        for p in root.rglob("*"):
            with contextlib.suppress(OSError):  # a file pip renamed meanwhile
                total += p.stat().st_size if p.is_file() else 0
        return total

    def poll() -> None:
        while not stop.wait(every):
            tracker.update(completed=size())

    thread = threading.Thread(target=poll, name="imageforge-watch-size", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tracker.update(completed=size())
