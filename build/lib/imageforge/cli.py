"""What every invoke task shares: error rendering, exit codes, tracebacks behind a flag."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from invoke.exceptions import Exit

from . import settings
from .errors import EXIT_INTERRUPTED, ImageforgeError


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

