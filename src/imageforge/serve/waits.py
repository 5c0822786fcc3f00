"""Waiting for a server: one ``/health`` probe and one poll loop, for every poller in run, smoke and bench.

* :func:`probe_health` -- one ``GET /health``: a :class:`Health` (the status, or why no answer came);
  run's ``wait_ready``, smoke's liveness checks and ``smoke --wait`` all ask it.
* :func:`poll_health` -- the one readiness poll (``/health`` until 200, a check that stops it when the server
  exited): a container's server and an in-place process wait through it, each adding only its exit check.
* :class:`Progress` -- the line a long wait shows (rewritten in place on a terminal, every 10 s otherwise).
* :func:`wait_until` / :func:`await_until` -- call a condition until it gives a value or the time is up,
  in the style of testcontainers' wait strategies (a condition may raise to stop waiting at once, e.g. a
  container that exited).  Used for readiness and for ``/metrics`` counters catching up.

A hand-written loop here is shorter than tenacity's retry objects for the two shapes we need (a deadline
measured from an earlier start, a progress callback between polls), so no retry library is used.

This module sits below run, smoke and bench and imports nothing of imageforge.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
Log = Callable[[str], None]

HEALTH_PATH = "/health"


@dataclass(frozen=True)
class Health:
    """What one ``GET /health`` got: an HTTP status, or the transport error instead."""

    status: int | None = None
    error_type: str | None = None  # e.g. ConnectError, ReadTimeout
    error: str | None = None  # ``"ConnectError: [Errno 111] Connection refused"``

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def connect_failed(self) -> bool:
        """Nothing listens there (as opposed to a server that answers badly or slowly)."""
        return self.error_type is not None and "Connect" in self.error_type

    @property
    def short(self) -> str:
        """``HTTP 503`` or the error's type name (a progress line's "last answer")."""
        return f"HTTP {self.status}" if self.status is not None else self.error_type or "no answer"

    def describe(self) -> str:
        """``GET /health -> HTTP 500`` or ``GET /health: ConnectError: ...`` (a failure message)."""
        if self.status is not None:
            return f"GET {HEALTH_PATH} -> HTTP {self.status}"
        return f"GET {HEALTH_PATH}: {self.error or self.error_type}"


def probe_health(client: httpx.Client, base_url: str = "", *, timeout: float | None = None) -> Health:
    """One ``GET <base_url>/health`` with ``client`` (``base_url`` empty: the client's own base URL)."""
    url = base_url.rstrip("/") + HEALTH_PATH
    try:
        response = client.get(url, timeout=timeout) if timeout is not None else client.get(url)
    except httpx.HTTPError as exc:
        name = type(exc).__name__
        return Health(error_type=name, error=f"{name}: {exc}" if str(exc) else name)
    return Health(status=response.status_code)


def wait_until(condition: Callable[[], T | None], *, timeout: float, interval: float,
               started: float | None = None, on_poll: Callable[[float], None] | None = None) -> T | None:
    """Call ``condition`` until it returns something other than None; None once ``timeout`` s have passed.

    The time counts from ``started`` (a ``time.monotonic()`` value; default now), so a wait can include
    what came before it (a container's start).  ``on_poll(elapsed)`` runs before each sleep.  An exception
    from ``condition`` ends the wait and propagates.
    """
    t0 = time.monotonic() if started is None else started
    while True:
        value = condition()
        if value is not None:
            return value
        elapsed = time.monotonic() - t0
        if elapsed >= timeout:
            return None
        if on_poll is not None:
            on_poll(elapsed)
        time.sleep(min(interval, max(0.0, timeout - elapsed)))


async def await_until(condition: Callable[[], Awaitable[T | None]], *, timeout: float,
                      interval: float) -> T | None:
    """:func:`wait_until` for a coroutine condition (the bench's event loop must keep running)."""
    t0 = time.monotonic()
    while True:
        value = await condition()
        if value is not None:
            return value
        elapsed = time.monotonic() - t0
        if elapsed >= timeout:
            return None
        await asyncio.sleep(min(interval, max(0.0, timeout - elapsed)))


def poll_health(url: str, *, timeout: float, interval: float = 0.5, started: float | None = None,
                on_poll: Callable[[float], None] | None = None, check: Callable[[Health], None] | None = None,
                probe_timeout: float = 5.0, connect_timeout: float = 2.0,
                transport: httpx.BaseTransport | None = None) -> tuple[float | None, Health | None]:
    """Poll ``url``'s ``/health`` until it answers 200: (seconds since ``started``, None); once ``timeout`` s
    have passed: (None, the last answer).

    The one readiness poll of a container's server and an in-place process's (:mod:`imageforge.serve`) and of
    ``smoke --wait``: ``check(last answer)`` runs after each answer that is not 200 and raises to stop waiting
    (the server exited); ``on_poll(elapsed)`` before each sleep (a progress line).
    """
    t0 = time.monotonic() if started is None else started
    last: list[Health] = []

    def ready() -> float | None:
        health = probe_health(http, url)
        if health.ok:
            return time.monotonic() - t0
        last.append(health)
        if check is not None:
            check(health)
        return None

    with httpx.Client(timeout=httpx.Timeout(probe_timeout, connect=connect_timeout), transport=transport) as http:
        seconds = wait_until(ready, timeout=timeout, interval=interval, started=t0, on_poll=on_poll)
    return seconds, (None if seconds is not None or not last else last[-1])


def wait_healthy(url: str, *, timeout: float, interval: float = 1.0, probe_timeout: float = 3.0,
                 transport: httpx.BaseTransport | None = None) -> Health | None:
    """Poll ``url``'s ``/health`` until it answers 200 (that Health) or ``timeout`` s pass (None)."""
    seconds, _ = poll_health(url, timeout=timeout, interval=interval, probe_timeout=probe_timeout,
                             connect_timeout=probe_timeout, transport=transport)
    return Health(status=200) if seconds is not None else None


__all__ = ["HEALTH_PATH", "Health", "await_until", "poll_health", "probe_health", "wait_healthy", "wait_until"]


class Progress:
    """One progress line: rewritten in place on a terminal, a line every ``every`` s otherwise."""

    def __init__(self, what: str, log: Log, *, every: float = 10.0, stream: Any = None) -> None:
        self.what = what
        self.log = log
        self.every = every
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = -every

    def update(self, elapsed: float) -> None:
        if self.tty:
            self.stream.write(f"\r{self.what}: {elapsed:5.0f}s")
            self.stream.flush()
        elif elapsed - self._last >= self.every:
            self._last = elapsed
            self.log(f"{self.what}: {elapsed:.0f}s")

    def done(self, message: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.log(message)
