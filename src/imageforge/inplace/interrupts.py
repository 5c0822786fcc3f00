"""SIGINT, SIGTERM and SIGHUP (an SSH drop) during an in-place apply or revert.

:func:`interruptible` turns each into :class:`Interrupted` in the main thread, so the step in progress
rolls back (the caller's ``except``) while the completed steps stay journaled; inside :func:`critical`
(a journal save, one file's atomic replace) the signal waits until the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from ..errors import EXIT_INTERRUPTED, ImageforgeError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(ImageforgeError):
    """A signal stopped an in-place command; the step in progress was rolled back (exit 130)."""

    exit_code = EXIT_INTERRUPTED
    kind = "interrupted"

    def __init__(self, signum: int, message: str | None = None, **kwargs: Any) -> None:
        self.signum = signum
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}", **kwargs)


_depth = 0
_pending: list[int] = []


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """A section a signal must not cut: the signal is raised when it ends."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            signum = _pending.pop()
            _pending.clear()
            raise Interrupted(signum)


def _handler(signum: int, _frame: FrameType | None) -> None:
    if _depth:
        _pending.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The three signals raise :class:`Interrupted` while the block runs (main thread only; else no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold the signals (a rollback in progress must finish): raised after the block, if any came."""
    with critical():
        yield
