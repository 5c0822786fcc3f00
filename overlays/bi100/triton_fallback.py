"""Try a Triton kernel first; on its first error or hang, fall back to PyTorch for good.

Replaces the team's hand-written ``patch_enable_triton.py`` wrapper around
``PagedAttention.forward_prefix`` (vendor ``vllm/attention/ops/paged_attn.py``): the vendor image
hard-codes ``HAS_TRITON = False`` because ``context_attention_fwd`` (prefix_prefill.py) has hung on the
BI-V100; the notes enable Triton again behind a permanent fallback to ``_forward_prefix_pytorch``.

* :data:`HAS_TRITON` is what ``import triton`` says (the corex Triton needs the /usr/local/corex/lib64
  symlinks of the image's symlink step to import).
* :class:`PermanentFallback` wraps one fast path. Its first call runs in a watchdog thread and must finish
  within ``first_call_timeout`` seconds (``IMAGEFORGE_TRITON_FIRST_CALL_TIMEOUT``, default 300, enough for
  Triton's JIT compile); later calls run inline. Any exception, or a first call that outlives the timeout,
  disables the fast path for the life of the process and the call is answered by the fallback. A hung
  first call cannot be killed from Python: its thread is abandoned (daemon) and the device may stay busy,
  which is why the notes call a hang "no worse than baseline" only for the *next* calls.

Call site (the team's ``forward_prefix`` patch, shape only)::

    TRITON_PREFILL = PermanentFallback("context_attention_fwd")
    ...
    if HAS_TRITON:
        return TRITON_PREFILL.run(_triton_prefix, _forward_prefix_pytorch, *args)
    return _forward_prefix_pytorch(*args)

Imports only the standard library (and triton, optionally).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HAS_TRITON", "PermanentFallback", "triton_available"]

T = TypeVar("T")
logger = logging.getLogger(__name__)
DEFAULT_FIRST_CALL_TIMEOUT = 300.0


def triton_available() -> bool:
    """True when ``import triton`` works in this process."""
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a corex library that fails to load
        return False
    return True


HAS_TRITON = triton_available()


class PermanentFallback:
    """One fast path with a permanent fallback (thread-safe; one instance per kernel)."""

    def __init__(self, name: str, first_call_timeout: float | None = None) -> None:
        self.name = name
        if first_call_timeout is None:
            first_call_timeout = float(os.environ.get("IMAGEFORGE_TRITON_FIRST_CALL_TIMEOUT",
                                                      DEFAULT_FIRST_CALL_TIMEOUT))
        self.first_call_timeout = first_call_timeout
        self._lock = threading.Lock()
        self._proven = False
        self.disabled_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    def disable(self, reason: str) -> None:
        if self.disabled_reason is None:
            self.disabled_reason = reason
            logger.warning("%s disabled for the rest of this process, using the PyTorch fallback: %s",
                           self.name, reason)

    def run(self, fast: Callable[..., T], fallback: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.enabled:
            return fallback(*args, **kwargs)
        if self._proven:
            try:
                return fast(*args, **kwargs)
            except Exception as exc:
                self.disable(f"{type(exc).__name__}: {exc}")
                return fallback(*args, **kwargs)
        with self._lock:
            if self._proven:
                return self.run(fast, fallback, *args, **kwargs)
            if not self.enabled:
                return fallback(*args, **kwargs)
            return self._first_call(fast, fallback, args, kwargs)

    def _first_call(self, fast: Callable[..., T], fallback: Callable[..., T], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> T:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fast(*args, **kwargs)
            except BaseException as exc:  # reported to the caller below
                box["error"] = exc

        worker = threading.Thread(target=target, name=f"{self.name}-first-call", daemon=True)
        worker.start()
        worker.join(self.first_call_timeout)
        if worker.is_alive():
            self.disable(f"first call did not finish within {self.first_call_timeout:g}s (hang)")
            return fallback(*args, **kwargs)
        if "error" in box:
            exc = box["error"]
            self.disable(f"{type(exc).__name__}: {exc}")
            return fallback(*args, **kwargs)
        self._proven = True
        value: T = box["value"]
        return value
