"""Why a server did not reach ``/health``: the start failure through the exception root, blaming a step.

A build no longer imports ``verify.imports`` by default (``build --verify-imports`` does): the first server start
proves them, so a start that fails must name what broke it as a failed verify would have. :func:`start_error` reads
the server's whole log (a container's or an in-place process's) with :func:`imageforge.blame.diagnose`: the
traceback's innermost frame in a file a step wrote gives "vLLM did not start: NameError in vllm/x.py line 12,
written by step 'ID' (patch)" at the step's build.yaml line and key path, ``SmokeError`` (exit 4) as before (the
caller's class for a server killed for memory); without a traceback the error is the one of before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..blame import diagnose
from ..errors import ImageforgeError, SmokeError
from ..manifest.model import Step
from ..manifest.resolve import Resolved


def start_error(*, what: str, package: str, seconds: float, state: str, expected: str, hint: str,
                log: Sequence[str], log_tail: Sequence[str], steps: Sequence[Step], saved: Path | str | None = None,
                error_cls: type[ImageforgeError] = SmokeError) -> ImageforgeError:
    """The error of a server that stopped before ``/health`` answered (the container's and the process's).

    ``what``: ``target:profile``; ``state``: how it ended (``status exited, exit code 1``); ``hint``:
    :func:`exit_hint` (the step's hint when a step wrote the blamed file); ``log``: the
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


def exit_hint(lines: Sequence[str], resolved: Resolved | None = None, *, log: Sequence[str] | None = None) -> str:
    """A hint for a server that stopped during start-up, from the last log lines (``log``: the whole log, where
    a traceback through a file a step wrote is looked for: :mod:`imageforge.blame`)."""
    if resolved is not None:
        failure = diagnose(lines if log is None else log, resolved.steps)
        if failure is not None and failure.step is not None:
            return (failure.step_hint() + f" (`invoke run --target {resolved.target.name} --base` runs the image "
                    "without the steps)")
    text = "\n".join(lines)
    rules: list[tuple[str, str]] = [
        (r"No module named|ModuleNotFoundError|ImportError", "an import failed: check the overlays and patches "
         "of this image (`invoke plan` lists them) and rebuild"),
        (r"SyntaxError|IndentationError", "a patched or overlaid Python file does not compile: check the patch"),
        (r"Unsupported CPU attention", "the model's head_dim is not supported by the CPU attention backend"),
        (r"shm|/dev/shm|Bus error", "the container's /dev/shm is too small: raise run.shm_size in the manifest"),
        (r"out of memory|OOM|Cannot allocate memory", "the server ran out of memory: lower the KV cache "
         "(VLLM_CPU_KVCACHE_SPACE / gpu-memory-utilization) or max-num-seqs"),
        (r"unrecognized arguments|invalid choice|error: argument", "vllm serve rejected an argument: check "
         "the target's serving args (`invoke plan` shows them)"),
        (r"Address already in use", "the port inside the container is taken: check serving.args.port"),
        (r"No such file or directory|does not exist|not a valid model|Can't load", "the model directory is "
         "missing or incomplete: check run.volumes and serving.args.model"),
    ]
    for pattern, hint in rules:
        if re.search(pattern, text):
            return hint
    if resolved is not None:
        return f"the last log lines below say why; `invoke run --target {resolved.target.name} --base` runs " \
            "the image without the steps"
    return "the last log lines below say why"
