"""Why a server did not reach ``/health``: the start failure through the exception root, blaming a step.

A build no longer imports ``verify.imports`` by default (``build --verify-imports`` does): the first server start
proves them, so a start that fails must name what broke it as a failed verify would have. :func:`start_error` reads
the server's whole log (a container's or an in-place process's) with :func:`imageforge.blame.diagnose`: the
traceback's innermost frame in a file a step wrote gives "vLLM did not start: NameError in vllm/x.py line 12,
written by step 'ID' (patch)" at the step's build.yaml line and key path, ``SmokeError`` (exit 4) as before (the
caller's class for a server killed for memory); without a traceback the error is the one of before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..blame import diagnose
from ..errors import ImageforgeError, SmokeError
from ..manifest.model import Step


def start_error(*, what: str, package: str, seconds: float, state: str, expected: str, hint: str,
                log: Sequence[str], log_tail: Sequence[str], steps: Sequence[Step], saved: Path | str | None = None,
                error_cls: type[ImageforgeError] = SmokeError) -> ImageforgeError:
    """The error of a server that stopped before ``/health`` answered (the container's and the process's).

    ``what``: ``target:profile``; ``state``: how it ended (``status exited, exit code 1``); ``hint``:
    :func:`imageforge.serve.container.exit_hint` (the step's hint when a step wrote the blamed file); ``log``: the
    server's whole log. Without a traceback the message is the one of before: "the server of T:P stopped before it
    was ready".
    """
    stopped = f"the server of {what} stopped before it was ready ({seconds:.0f}s after start)"
    hint += f"; full log: {saved}" if saved else ""
    failure = diagnose(log, steps)
    if failure is None:
        return error_cls(stopped, found=state, expected=expected, hint=hint, log_tail=log_tail)
    step = failure.step
    return error_cls(failure.headline(package), location=step.location if step else None,
                     key_path=step.key_path if step else None, expected=expected,
                     found=f"{state}, {stopped}: {failure.trace.exception or failure.trace.type}", hint=hint,
                     log_tail=log_tail)


__all__ = ["start_error"]
