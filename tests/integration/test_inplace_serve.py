"""In-place serving rehearsed in a box (issue 21 items 4-7): no Docker inside, the server as a process.

One box for the module (:mod:`box_fixture`: the cpu base image, ``--shm-size 1g``, no network, no Docker
socket, imageforge in its own venv).  vLLM starts: seven (run, serving both the dummy suite and the evaluator
suite's dummy-ok checks; bench --replay; equiv --record and --against; ablate over one step: full, the variant,
full) -- each 30-110 s here.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.box_fixture import Box, make_box

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    try:
        made = make_box()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    try:
        yield made
    finally:
        made.remove()


def test_the_box_has_no_docker_and_the_target_python(box: Box) -> None:
    code, out = box.sh("test -S /var/run/docker.sock && echo socket; command -v docker || echo no-docker-cli; "
                       "python3 -c 'import sys, vllm; print(sys.prefix, vllm.__version__)'; df -k /dev/shm | tail -1")
    assert code == 0 and "socket" not in out.split() and "no-docker-cli" in out, out
    assert "/opt/venv 0.32.0" in out, out
    assert int(out.strip().splitlines()[-1].split()[1]) == 1024 * 1024  # 1 GiB, as run.shm_size asks


@pytest.mark.timeout(2400)
def test_apply_run_in_place_then_smoke_then_stop(box: Box) -> None:
    t0 = time.monotonic()
    code, out = box.invoke("apply", "--target", "cpu", "--in-place", timeout=600)
    assert code == 0, out
    RESULTS["apply_s"] = time.monotonic() - t0
    code, out = box.invoke("run", "--target", "cpu", "--in-place", timeout=600)
    assert code == 0, out
    url = re.search(r"^URL=(\S+)$", out, re.M)
    pid = re.search(r"^pid (\d+) \(in place: / \(journal sha256:[0-9a-f]{16}\)\) is serving", out, re.M)
    assert url and pid and url.group(1) == "http://127.0.0.1:8000", out
    try:
        log_path = re.search(r"; log (\S+);", out)
        assert log_path, out
        record = json.loads(box.read(log_path.group(1).rsplit("/", 1)[0] + "/server.json"))
        assert record["pid"] == int(pid.group(1)) and record["argv"][:3] == ["/opt/venv/bin/vllm", "serve",
                                                                              "--config"]
        assert record["rewritten"] == {"/models/tiny-qwen3-moe": f"{box.repo}/.imageforge/models/tiny-qwen3-moe"}
        stat = box.read(f"/proc/{record['pid']}/stat")
        assert int(stat.rpartition(")")[2].split()[19]) == record["starttime"]
        # one server at a time: a second run is exit 5 naming the pid
        code, again = box.invoke("run", "--target", "cpu", "--in-place", "--port", "8123", timeout=120)
        assert code == 5 and f"still up: pid {record['pid']}" in again, again
        code, smoke = box.invoke("smoke", "--url", url.group(1), "--target", "cpu", "--suite", "smoke/dummy.yaml",
                                 "--tags", "dummy-ok", timeout=900)
        assert code == 0 and re.search(r"^\d+ passed, 0 failed$", smoke, re.M), smoke
        RESULTS["apply_to_smoke_verdict_s"] = time.monotonic() - t0
        Path("/tmp/imageforge-inplace-serve-results.json").write_text(json.dumps(RESULTS))
        # the same server for the evaluator suite's dummy-ok checks (~55 checks: 4-9 min on 2 shared cores)
        code, evaluator = box.invoke("smoke", "--url", url.group(1), "--target", "cpu", "--suite",
                                     "smoke/evaluator.yaml", "--tags", "dummy-ok", timeout=1500)
        assert code == 0 and re.search(r"^\d+ passed, 0 failed$", evaluator, re.M), evaluator
    finally:
        code, stopped = box.invoke("stop", "--in-place", timeout=120)
    assert code == 0 and f"stopped pid {pid.group(1)}" in stopped and "terminated" in stopped, stopped
    code, out = box.sh(f"test -d /proc/{pid.group(1)} && echo alive || echo gone")
    assert out.strip() == "gone"
    code, out = box.invoke("revert", timeout=300)
    assert code == 0, out
    print(f"apply --in-place to the smoke verdict: {RESULTS['apply_to_smoke_verdict_s']:.0f}s "
          f"(apply {RESULTS['apply_s']:.0f}s)")


@pytest.mark.timeout(900)
def test_bench_in_place_replay(box: Box) -> None:
    code, out = box.invoke("bench", "--target", "cpu", "--in-place", "--replay", "--requests", "4", "--seed", "5",
                           timeout=800)
    assert code == 0, out
    for line in ("PASS  success rate >= 99.00%: 100.00%", "TTFT p90", "Output TPS p10", "Score (ESTIMATE"):
        assert line in out, out
    assert "started pid" in out and "stopped pid" in out, out
    report = json.loads(box.read(out.split("report: ")[1].split()[0]))
    assert report["kind"] == "replay" and len(report["requests"]) == 4
    code, left = box.sh("cat .imageforge/runs/*/server.json | grep -c '\"stopped\"'; "
                        "ls .imageforge/runs/*/server.json | wc -l")
    stopped, total = (int(x) for x in left.split())
    assert stopped == total, left  # every server this module started has been stopped


@pytest.mark.timeout(1200)
def test_equiv_in_place_record_then_against_float32(box: Box) -> None:
    code, out = box.invoke("equiv", "--target", "cpu", "--in-place", "--record", "/tmp/ref.json", "--prompts", "3",
                           timeout=600)
    assert code == 0 and "recorded 3 prompts of in place: /" in out, out
    record = json.loads(box.read("/tmp/ref.json"))
    assert record["format"] == "imageforge-equiv-record/1" and record["dtype"] == "float32"
    assert record["flags"]["dtype"] == "float32" and record["served"].startswith("in place: /")
    assert len(record["evidence"]["prompts"]) == 3 and record["evidence"]["prompts"][0]["positions"]
    code, out = box.invoke("equiv", "--target", "cpu", "--in-place", "--against", "/tmp/ref.json", timeout=600)
    assert code == 0, out
    result = json.loads(box.read(out.split("reports: ")[1].split(",")[1].split()[0]))
    assert result["passed"] is True and result["dtype"] == "float32", result


def _journal(box: Box) -> str:
    _code, out = box.sh("test -e /var/lib/imageforge/journal.json && echo journal || echo none")
    return out.strip()


@pytest.mark.timeout(2400)
def test_ablate_in_place_full_variant_full(box: Box) -> None:
    """One step ablated: three starts (full, the variant, full); the order for several variants (full, each variant,
    full) is tests/unit/test_ablate.py's test_in_place_schedule_is_full_each_variant_full."""
    assert _journal(box) == "none"
    code, out = box.invoke("ablate", "--target", "cpu", "--in-place", "--steps", "prefill-num-warps",
                           "--repeat", "1", "--requests", "4", "--concurrency", "2", "--prompt-tokens", "64",
                           "--output-tokens", "8", "--warmup", "0", "--out", "/tmp/ablate", timeout=2300)
    assert code == 0, out
    assert "3 server starts, one at a time: full (before), without prefill-num-warps, full (after)" in out, out
    table = json.loads(box.read("/tmp/ablate/ablate.json"))
    rows = {r["step"]: r for r in table["variants"]}
    assert set(rows) == {"prefill-num-warps"}
    for row in rows.values():
        assert row["pairs"] == 1 and row["failed_runs"] == 0 and row["delta_score"] is not None, row
        assert row["equiv"] == "pass", row  # the prefill tiles are inert on CPU: same logprobs
    assert table["workload"]["schedule"] == "in place: full, variants, full"
    assert _journal(box) == "none"  # the root as before the command: nothing applied
