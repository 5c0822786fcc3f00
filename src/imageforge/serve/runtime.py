"""One serving runtime: where a command prepares its target and serves it.

A :class:`Runtime` is made once from the command's options (:func:`imageforge.app.runtime`) and handed to every
stage that serves (run, stop, smoke, bench and its replay, sweep, equiv, bisect, ablate). It has exactly two
implementations, and nothing outside them asks which one it has:

* :class:`imageforge.serve.container.ContainerRuntime`: ``prepare`` builds (or reuses) the image, ``serving``
  starts a container from it and waits for ``/health``, and removes it afterwards; nothing to restore;
* :class:`imageforge.serve.process.ProcessRuntime` (``--in-place``): ``prepare`` applies exactly the steps to the
  files under a root through the journal, ``serving`` starts the serving command as a process and waits for
  ``/health``, and stops it afterwards; ``restoring`` puts the root back as it was when the command began.

What differs between them that a command must plan for is a capability, not a kind: ``one_at_a_time`` (the
process runtime's server owns the card: one server up at a time, so a command that compares two servers runs them
one after the other).
"""

from __future__ import annotations

import abc
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..manifest.resolve import Resolved

Log = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Runtime.prepare` made ready to serve."""

    served: str  # what ``serving`` serves: an image (its tag, or its id when pinned), or the root's identity
    note: str  # one line for a record: the layers built, or what the root serves
    line: str  # the line a command shows for it
    image_id: str | None = None  # the image's id (a container), else None
    base: bool = False  # the target's base with its serving configuration only (no step)
    built: int = 0  # layers built (the rest were cached); 0 in place
    layers: int = 0  # layers of the image; 0 in place


class Runtime(abc.ABC):
    """Prepare the target, serve it, restore what preparing changed; see the module."""

    #: only one server of this runtime may be up at a time (the process on the card's machine)
    one_at_a_time: ClassVar[bool]

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """Where it serves, for a command's lines ("in place on /", "in Docker containers")."""

    @abc.abstractmethod
    def prepare(self, resolved: Resolved, *, environ: Mapping[str, str] | None = None, log: Log = print,
                base: bool = False, image: str | None = None, pin: bool = False) -> Prepared:
        """Make exactly ``resolved``'s steps what is served next (``base``: none of them, the serving configuration
        only; ``image``: that image as it is). ``pin``: what is served is the exact content prepared, never a name
        a later prepare moves (a sweep's points share a tag)."""

    @abc.abstractmethod
    def prepare_failed(self, what: str) -> str:
        """The words for a prepare of ``what`` (e.g. "after step 3") that failed."""

    @abc.abstractmethod
    def serving(self, resolved: Resolved, prepared: Prepared, *, environ: Mapping[str, str] | None = None,
                log: Log = print, run_id: str | None = None, port: int | None = None,
                startup_timeout: float | None = None, host_address: str | None = None,
                wait: bool = True) -> contextlib.AbstractContextManager[Any]:
        """Start the server of ``prepared``, wait for ``/health`` (unless not ``wait``), yield it; always end it."""

    @abc.abstractmethod
    def serving_together(self, servings: Sequence[tuple[Resolved, Prepared, str]], *,
                         environ: Mapping[str, str] | None = None, log: Log = print,
                         startup_timeout: float | None = None,
                         host_address: str | None = None) -> contextlib.AbstractContextManager[list[Any]]:
        """Start every ``(resolved, prepared, run_id)`` at once (distinct free ports), wait until each answers
        ``/health``, yield the servers in that order; always end them all. A ``one_at_a_time`` runtime refuses."""

    @abc.abstractmethod
    def identity(self, server: Any, prepared: Prepared) -> str:
        """What a record says was served (the image's id; the root and its journal digest)."""

    @abc.abstractmethod
    def restoring(self, manifest: Any, *, environ: Mapping[str, str] | None = None,
                  log: Log = print) -> contextlib.AbstractContextManager[None]:
        """Run the block, then put back what preparing changed (also after an error)."""

    @abc.abstractmethod
    def start_detached(self, resolved: Resolved, *, base: bool, port: int | None, timeout: float | None,
                       host_address: str, environ: Mapping[str, str] | None = None, log: Log = print) -> Any:
        """``run``: prepare, start, wait until ready and leave the server running (a failed start is ended)."""

    @abc.abstractmethod
    def detached_note(self, server: Any) -> str:
        """``run``'s line on the server it left running and how to end it."""

    @abc.abstractmethod
    def stop(self, target: str | None, *, every: bool, root: Path, log: Log = print) -> list[str]:
        """``stop``: end the servers ``run`` left (``every``: also those of interrupted runs); their names."""



@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """In the main thread, turn SIGTERM into KeyboardInterrupt so cleanup code runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["Prepared", "Runtime", "sigterm_as_interrupt"]
