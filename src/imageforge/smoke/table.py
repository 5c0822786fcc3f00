"""The live table of a smoke run: a rich table on a terminal, one line per finished check otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..serve.openai_wire import short
from .results import FAIL, PASS, SKIP, CheckResult
from .suite import Check

Log = Callable[[str], None]
FIRST_FAILURE = 140  # characters of a check's first failure on its line


class LiveTable:
    """Rich live table on a terminal; one line per finished check otherwise. Thread-safe."""

    def __init__(self, checks: Sequence[Check], *, echo: Log, console: Any = None, live: bool | None = None) -> None:
        from rich.console import Console

        self.checks = list(checks)
        self.echo = echo
        self.console = console or Console(stderr=False)
        self.live_mode = self.console.is_terminal if live is None else live
        self.state: dict[str, tuple[str, float | None]] = {c.id: ("waiting", None) for c in checks}
        self._lock = threading.Lock()
        self._live: Any = None
        self._width = max((len(c.id) for c in checks), default=10)

    def __enter__(self) -> LiveTable:
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            tall = len(self.checks) + 6 > self.console.height
            self._live.update(self.render(full=not tall))
            self._live.__exit__(None, None, None)
            self._live = None
            if tall:  # the live view showed a window; print every row once
                self.console.print(self.render(full=True))

    def render(self, full: bool = False) -> Any:
        """The table; unless ``full``, cut to what fits: checks in flight, failures, the latest results."""
        from rich.table import Table

        styles = {PASS: "green", FAIL: "bold red", SKIP: "yellow", "running": "cyan", "waiting": "dim"}
        rows = list(self.checks)
        room = max(5, self.console.height - 7)
        caption = None
        if not full and len(rows) > room:
            counts: dict[str, int] = {}
            for status, _ in self.state.values():
                counts[status] = counts.get(status, 0) + 1
            caption = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            important = [c for c in rows if self.state[c.id][0] in ("running", FAIL)]
            finished = [c for c in rows if self.state[c.id][0] in (PASS, SKIP)]
            waiting = [c for c in rows if self.state[c.id][0] == "waiting"]
            rows = (important + finished[-max(0, room - len(important)):] + waiting)[:room]
            rows.sort(key=self.checks.index)
        table = Table(title="smoke", caption=caption, expand=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("latency", justify="right")
        for check in rows:
            status, latency = self.state[check.id]
            lat = "" if latency is None else f"{latency * 1000:.0f} ms"
            table.add_row(check.id, f"[{styles.get(status, '')}]{status}[/]", lat)
        return table

    def running(self, check: Check) -> None:
        with self._lock:
            self.state[check.id] = ("running", None)
            if self._live is not None:
                self._live.update(self.render())

    def done(self, result: CheckResult) -> None:
        with self._lock:
            self.state[result.check.id] = (result.status, result.latency)
            if self._live is not None:
                self._live.update(self.render())
            else:
                self.echo(result_line(result, self._width))


def result_line(result: CheckResult, width: int) -> str:
    """A finished check as one line (``  FAIL  tools-required   12 ms  <first failure>``), ids padded to ``width``:
    what a smoke run prints without a terminal, and what bisect shows of its failing probe."""
    lat = "" if result.latency is None else f"{result.latency * 1000:7.0f} ms"
    word = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP"}.get(result.status, result.status)
    line = f"  {word:<4}  {result.check.id:<{width}}  {lat}"
    if result.status == FAIL and result.failures:
        line += f"  {short(result.failures[0], FIRST_FAILURE)}"
    elif result.status == SKIP:
        line += f"  ({result.message})"
    return line

