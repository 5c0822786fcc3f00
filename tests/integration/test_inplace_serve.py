"""In-place serving rehearsed in a box: no Docker inside, the server as a process.

The session's one box (tests/integration/conftest.py's ``box``, :mod:`box_fixture`: the cpu base image, ``--shm-size
1g``, no network, no Docker socket, imageforge in its own venv), after test_inplace_box left it as it found it. vLLM
starts: five (run, serving the dummy suite, the evaluator suite's dummy-ok checks, the equiv reference (``equiv
--record --url``) and the evaluator's replay (``bench --url --replay``); ``equiv --in-place --against`` that record;
ablate over one step: full, the variant, full) -- each 30-110 s here. ``bench --in-place`` starting and stopping its
own server: tests/unit/test_bench_replay.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.integration.box_fixture import Box

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESULTS: dict[str, float] = {}
REF = "/tmp/ref.json"  # the equiv reference: recorded from run's server, compared in place later


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
        # with the parameters a 2048-token server needs (the evaluator's defaults assume a 131072-token one)
        code, evaluator = box.invoke("smoke", "--url", url.group(1), "--target", "cpu", "--suite",
                                     "smoke/evaluator.yaml", "--tags", "dummy-ok", "--param", "max_context_tokens=2048",
                                     "--param", "cache_min_prompt_tokens=256", "--param", "truncation_tokens=1024",
                                     timeout=1500)
        assert code == 0 and re.search(r"^\d+ passed, 0 failed$", evaluator, re.M), evaluator
        # the same server for the equiv reference and the evaluator's replay: nothing else started
        servers = _server_records(box)
        _record_the_reference(box, url.group(1))
        _replay(box, url.group(1))
        assert _server_records(box) == servers
    finally:
        code, stopped = box.invoke("stop", "--in-place", timeout=120)
    assert code == 0 and f"stopped pid {pid.group(1)}" in stopped and "terminated" in stopped, stopped
    code, out = box.sh(f"test -d /proc/{pid.group(1)} && echo alive || echo gone")
    assert out.strip() == "gone"
    code, out = box.invoke("revert", timeout=300)
    assert code == 0, out
    print(f"apply --in-place to the smoke verdict: {RESULTS['apply_to_smoke_verdict_s']:.0f}s "
          f"(apply {RESULTS['apply_s']:.0f}s)")


def _server_records(box: Box) -> int:
    _code, out = box.sh("ls .imageforge/runs/*/server.json 2>/dev/null | wc -l")
    return int(out.strip())


def _record_the_reference(box: Box, url: str) -> None:
    """`equiv --record --url`: the reference from the server already up, as a team records it from the server it
    has (the card's flow: in the dtype served, bf16)."""
    code, out = box.invoke("equiv", "--target", "cpu", "--record", REF, "--url", url, "--dtype", "bfloat16",
                           "--prompts", "3", timeout=600)
    assert code == 0 and f"recorded 3 prompts of {url} serving tiny-qwen3-moe (/v1/models)" in out, out
    assert "started pid" not in out and "stopped pid" not in out, out
    record = json.loads(box.read(REF))
    assert record["format"] == "imageforge-equiv-record/1" and record["dtype"] == "bfloat16"
    assert record["served"] == f"{url} serving tiny-qwen3-moe (/v1/models)", record["served"]
    assert record["flags"] == {"served-model-name": "tiny-qwen3-moe", "max-model-len": 2048,
                               "model": f"{box.repo}/.imageforge/models/tiny-qwen3-moe"}, record["flags"]
    assert len(record["evidence"]["prompts"]) == 3 and record["evidence"]["prompts"][0]["positions"]


def _replay(box: Box, url: str) -> None:
    """`bench --url --replay` on the running server (was `bench --in-place --replay`, its own start)."""
    code, out = box.invoke("bench", "--url", url, "--replay", "--requests", "4", "--seed", "5", timeout=800)
    assert code == 0, out
    for line in ("PASS  success rate >= 99.00%: 100.00%", "TTFT p90", "Output TPS p10",
                 "PLATFORM'S SCORE: weighted_tps"):
        assert line in out, out
    assert "started pid" not in out, out
    report = json.loads(box.read(out.split("report: ")[1].split()[0]))
    assert report["kind"] == "replay" and len(report["requests"]) == 4


@pytest.mark.timeout(1200)
def test_equiv_in_place_against_the_record_of_the_running_server(box: Box) -> None:
    """equiv in place starts and stops its own server (the profile applied) and compares it with the record
    test_apply_run_in_place_then_smoke_then_stop took from `run`'s server, in the record's dtype."""
    code, _out = box.sh(f"test -s {REF}")
    assert code == 0, f"no {REF}: test_apply_run_in_place_then_smoke_then_stop records it (run the module)"
    code, out = box.invoke("equiv", "--target", "cpu", "--in-place", "--against", REF, timeout=600)
    assert code == 0, out
    assert "equiv in place on /: 1 server start(s), one at a time" in out, out
    assert "started pid" in out and "stopped pid" in out, out
    result = json.loads(box.read(out.split("reports: ")[1].split(",")[1].split()[0]))
    assert result["passed"] is True and result["dtype"] == "bfloat16", result
    code, left = box.sh("cat .imageforge/runs/*/server.json | grep -c '\"stopped\"'; "
                        "ls .imageforge/runs/*/server.json | wc -l")
    stopped, total = (int(x) for x in left.split())
    assert stopped == total, left  # every server this module started has been stopped


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
        assert row["pairs"] == 1 and row["failed_runs"] == 0 and row["delta_weighted_tps"] is not None, row
        assert row["equiv"] == "pass", row  # the prefill tiles are inert on CPU: same logprobs
    assert table["workload"]["schedule"] == "in place: full, variants, full"
    assert _journal(box) == "none"  # the root as before the command: nothing applied
