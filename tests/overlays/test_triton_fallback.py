"""PermanentFallback: errors and hangs disable the fast path for good; success keeps it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import pytest
import triton_fallback
from triton_fallback import PermanentFallback


def test_success_keeps_fast_path() -> None:
    guard = PermanentFallback("k", first_call_timeout=5)
    calls: list[str] = []

    def fast(x: int) -> int:
        calls.append("fast")
        return x * 2

    def slow(x: int) -> int:
        calls.append("slow")
        return -1

    for i in range(3):
        assert guard.run(fast, slow, i) == i * 2
    assert calls == ["fast"] * 3 and guard.enabled


def test_error_on_first_call_falls_back_forever() -> None:
    guard = PermanentFallback("k", first_call_timeout=5)
    fast_calls = 0

    def fast(x: int) -> int:
        nonlocal fast_calls
        fast_calls += 1
        raise RuntimeError("SMEM overflow")

    assert guard.run(fast, lambda x: x + 100, 1) == 101
    assert guard.run(fast, lambda x: x + 100, 2) == 102
    assert fast_calls == 1
    assert guard.disabled_reason == "RuntimeError: SMEM overflow"


def test_error_after_proven_also_disables() -> None:
    guard = PermanentFallback("k", first_call_timeout=5)
    state = {"fail": False}

    def fast() -> str:
        if state["fail"]:
            raise ValueError("late")
        return "fast"

    assert guard.run(fast, lambda: "slow") == "fast"
    state["fail"] = True
    assert guard.run(fast, lambda: "slow") == "slow"
    state["fail"] = False
    assert guard.run(fast, lambda: "slow") == "slow"
    assert not guard.enabled


def test_hang_on_first_call_falls_back_within_timeout() -> None:
    guard = PermanentFallback("k", first_call_timeout=0.3)
    release = threading.Event()
    started = time.monotonic()
    assert guard.run(lambda: release.wait(30) and "fast", lambda: "slow") == "slow"
    assert time.monotonic() - started < 5
    assert guard.disabled_reason is not None and "hang" in guard.disabled_reason
    release.set()
    assert guard.run(lambda: "fast", lambda: "slow") == "slow"


def test_concurrent_first_calls_run_fast_path_once() -> None:
    """Eight threads arrive before the fast path is proven: exactly one runs the guarded first call (in the
    watchdog thread), the other seven wait for it and then run the fast path inline."""
    guard = PermanentFallback("k", first_call_timeout=5)
    threads_seen: list[str] = []
    lock = threading.Lock()
    arrived = threading.Barrier(8)

    def fast() -> str:
        with lock:
            threads_seen.append(threading.current_thread().name)
        time.sleep(0.05)
        return "fast"

    def call() -> None:
        arrived.wait(5)  # all eight ask at the same moment, before anything is proven
        results.append(guard.run(fast, lambda: "slow"))

    results: list[str] = []
    threads = [threading.Thread(target=call, name=f"caller-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["fast"] * 8
    assert threads_seen.count("k-first-call") == 1, threads_seen
    assert len(threads_seen) == 8 and sum(n.startswith("caller-") for n in threads_seen) == 7, threads_seen


def test_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGEFORGE_TRITON_FIRST_CALL_TIMEOUT", "7.5")
    assert PermanentFallback("k").first_call_timeout == 7.5


def test_has_triton_reflects_import() -> None:
    # what a fresh interpreter says about `import triton`, independent of the module under test
    importable = subprocess.run([sys.executable, "-c", "import triton"], capture_output=True).returncode == 0
    assert triton_fallback.HAS_TRITON is importable


def test_triton_available_follows_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    assert triton_fallback.triton_available() is False
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))  # `import triton` works
    assert triton_fallback.triton_available() is True
