"""What every command shares: error rendering, exit codes, tracebacks behind a flag; results on stdout, the rest
on stderr; a closed stdout ending quietly."""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from typing import Any, TextIO, cast

from invoke.exceptions import Exit

from .. import settings
from ..errors import EXIT_INTERRUPTED, ImageforgeError
from . import progress


def traceback_wanted(flag: bool = False) -> bool:
    return settings.traceback_wanted(flag, os.environ)


@contextmanager
def user_errors(show_traceback: bool = False) -> Iterator[None]:
    """Turn ImageforgeError / Ctrl-C into a message on stderr and an exit code."""
    try:
        yield
    except ImageforgeError as exc:
        if traceback_wanted(show_traceback):
            traceback.print_exc()
        print(exc.render(), file=sys.stderr)
        raise Exit(code=exc.exit_code) from None
    except KeyboardInterrupt:
        if traceback_wanted(show_traceback):
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        raise Exit(code=EXIT_INTERRUPTED) from None



# --------------------------------------------------------------------------- results on stdout, the rest on stderr

#: The stream results go to while a command runs (the real stdout; stderr under --json); see `results_stream`.
_RESULTS: list[TextIO] = []


def results_stream() -> TextIO:
    """Where a result table goes: the command's stdout (sys.stdout outside a command)."""
    return _RESULTS[-1] if _RESULTS else sys.stdout


class _Null(io.TextIOBase):
    def write(self, s: str) -> int:
        return len(s)


@dataclass
class Output:
    """A running command's channels: ``result`` (stdout: tables, JSON, ``URL=...``) and ``log`` (stderr)."""

    settings: Any
    as_json: bool
    quiet: bool
    stdout: TextIO
    runtime: Any = None  # the command's serving Runtime (app.runtime, from --in-place [--root] [--python])

    def result(self, text: object, data: object = None, *, logged: bool = False) -> None:
        """The command's result: ``data`` as one JSON document under --json, else ``text`` (None: nothing).

        ``logged``: the run's log (stderr) already ended with ``text``; it is written again only when stdout is
        not the terminal the log went to (a file, a pipe), so a terminal shows it once."""
        if self.as_json:
            self.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        elif text is not None and not (logged and not self.quiet and _same_terminal(self.stdout, sys.stderr)):
            self.stdout.write(f"{text}\n")
        self.stdout.flush()

    def line(self, text: str) -> None:
        """A result line in text mode (``URL=...``); nothing under --json."""
        if not self.as_json:
            self.stdout.write(text + "\n")
            self.stdout.flush()

    def log(self, text: str) -> None:
        """A progress or log line: stderr, nothing under --quiet."""
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


def _same_terminal(a: TextIO, b: TextIO) -> bool:
    try:
        return a.isatty() and b.isatty() and os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


@contextmanager
def command_io(show_traceback: bool = False, *, as_json: bool = False, quiet: bool = False,
               settings: Any = None) -> Iterator[Output]:
    """Run a command: ``print`` (every library log line) goes to stderr (nowhere under ``quiet``), results to the
    real stdout through the yielded :class:`Output` (result tables: :func:`results_stream`; under ``as_json`` they
    are logs too); errors as :func:`user_errors`; a stdout closed by the reader ends quietly (exit 141)."""
    real = sys.stdout
    logs = cast(TextIO, _Null()) if quiet else sys.stderr
    _RESULTS.append(logs if as_json else real)
    try:
        with user_errors(show_traceback), closed_pipe_quiet(), redirect_stdout(logs), progress.quiet(quiet):
            yield Output(settings, as_json, quiet, real)
    finally:
        _RESULTS.pop()


@contextmanager
def closed_pipe_quiet() -> Iterator[None]:
    """A reader that closed stdout (``| head -c1``) ends the command quietly: no traceback, exit 141 (SIGPIPE)."""
    try:
        yield
    except BrokenPipeError:
        try:  # Python flushes stdout at exit: point it at /dev/null so that flush cannot fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            pass
        raise Exit(code=EXIT_CLOSED_PIPE) from None


EXIT_CLOSED_PIPE = 141
