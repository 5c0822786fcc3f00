"""The bench client against real vLLM (the session's shared cpu server) and one 2-point sweep of the cpu target.

vLLM starts: none for the bench and replay tests (they use conftest's ``cpu_server``), one for the interleaved
sweep: its two points are up at once; the second is ``cpu_server`` itself, reused (``--reuse-servers``: the same
image and run options), and left running; the first is started and removed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imageforge import app
from imageforge.bench import Workload, run_bench, verdict
from tests.integration.helpers import labelled

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_bench_counts_exactly_the_tokens_requested(cpu_server: Any, tmp_path: Path) -> None:
    w = Workload(requests=8, concurrency=4, prompt_tokens=300, output_tokens=24, shared_prefix=0.75, seed=20261129,
                 warmup=1, duration=120)
    lines: list[str] = []
    bench = run_bench(cpu_server.url, w, run_dir=tmp_path / "run", echo=lines.append)
    verdict(bench)
    assert bench.prompt_mode == "token-ids" and bench.model == "tiny-qwen3-moe"
    assert bench.errors == 0 and bench.cancelled == 0 and len(bench.results) == 8
    # ignore_eos + min_tokens: random weights still give exactly the tokens asked for
    assert [r.completion_tokens for r in bench.results] == [24] * 8
    assert [r.prompt_tokens for r in bench.results] == [300] * 8
    assert all(r.usage for r in bench.results)
    assert bench.completion_tokens == 8 * 24 and bench.prompt_tokens == 8 * 300 and bench.short_responses == 0
    # the server counted the same tokens (pytest runs one test at a time: no other traffic on this server)
    assert bench.metrics_delta["vllm:generation_tokens_total"] == 8 * 24
    assert bench.metrics_delta["vllm:prompt_tokens_total"] == 8 * 300
    # the 225-token shared prefix is served from the prefix cache (in whole KV blocks) for later requests;
    # the cpu target enables prompt-tokens details, so each response says how many of its tokens were cached
    assert bench.cache_source == "usage.prompt_tokens_details.cached_tokens"
    assert bench.cached_tokens is not None and 0 < bench.cached_tokens <= 8 * 225
    s = bench.summary()
    assert s["output_tps"] > 0 and s["input_tps"] > s["output_tps"] and s["weighted_tps"] > 0
    assert 0 < s["ttft_p50_s"] <= s["latency_p50_s"] <= s["latency_p95_s"]
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["summary"] == s and data["host"]["cpus"] == os.cpu_count()


def test_bench_cli_against_a_url_and_its_exit_codes(cpu_server: Any, invoke_cli: Callable[..., Any]) -> None:
    small = ["--requests", "4", "--concurrency", "2", "--prompt-tokens", "64", "--output-tokens", "8"]
    ok = invoke_cli("bench", "--url", cpu_server.url, *small, "--json")
    assert ok.code == 0, ok.output
    summary = json.loads(ok.stdout)  # --json: one document on stdout, the table and logs on stderr
    assert summary["completion_tokens"] == 32 and summary["errors"] == 0
    assert "Output TPS" in ok.output and "report: " in ok.output
    report = Path(ok.output.split("report: ")[1].split()[0])
    assert report.is_file() and report.is_relative_to(REPO / ".imageforge" / "runs")

    wrong_model = invoke_cli("bench", "--url", cpu_server.url, *small, "--model", "no-such-model", "--warmup", "0")
    assert wrong_model.code == 4, wrong_model.output
    assert "got no tokens back" in wrong_model.output and "HTTP 404" in wrong_model.output

    too_long = invoke_cli("bench", "--url", cpu_server.url, "--prompt-tokens", "2040", "--output-tokens", "40")
    assert too_long.code == 2 and "max_model_len 2048" in too_long.output


def test_bench_replay_against_a_url(cpu_server: Any, invoke_cli: Callable[..., Any], tmp_path: Path) -> None:
    kept = tmp_path / "w.jsonl"
    run = invoke_cli("bench", "--url", cpu_server.url, "--replay", "--requests", "4", "--seed", "5",
                     "--replay-out", str(kept), "--json")
    assert run.code == 0, run.output
    for line in ("PASS  success rate >= 99.00%: 100.00%  [organisers]", "TTFT p90 <= 5,000 ms",
                 "Output TPS p10 >= 20.00 tok/s", "cache hit rate >= 50.00%", "total time p99 <= 999,999 ms",
                 "[competition]", "[harness]", "PLATFORM'S SCORE: weighted_tps", "score shares: output"):
        assert line in run.output, run.output
    report = Path(run.output.split("report: ")[1].split()[0])
    plot = Path(run.output.split("plot: ")[1].split()[0])
    data = json.loads(report.read_text())
    assert data["kind"] == "replay" and data["concurrency"] == 1 and len(data["requests"]) == 4
    assert data["workload"]["spec"]["max_model_len"] == 2048  # scaled to the server's
    shown = json.loads(run.stdout)  # --json: the report under the harness's names
    assert shown["weighted_tps"] > 0 and shown["platform_score"] == pytest.approx(shown["weighted_tps"] * 38.582)
    assert [k for k in shown if k.endswith("score")] == ["platform_score"]
    assert shown["successful_requests"] == 4 and shown["unfinished_requests"] == 0
    sent = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(sent) == 4
    for request, line in zip(data["requests"], sent, strict=True):
        # the server counts the chat template too: more prompt tokens than the generator planned
        assert request["error_class"] is None and request["prompt_tokens"] > line["_replay"]["input_tokens"]
        assert request["cached_tokens"] is not None  # the cpu target sets enable-prompt-tokens-details
        assert request["completion_tokens"] == line.get("max_completion_tokens", line["_replay"]["output_tokens"])
        assert request["finished"] and request["input_tps"] > 0
    assert plot.read_bytes()[:4] == b"\x89PNG" and plot.parent == report.parent

    # the same requests as the evaluator harness's matched-request JSONL: read by content, replayed alike
    matched = tmp_path / "matched.jsonl"
    matched.write_text("".join(json.dumps({
        "source_file": "oneapi-20260801000000.log", "line_no": i + 1, "level": "INFO", "timestamp": "t",
        "request_id": f"r{i}", "request_body": json.dumps({**line, "max_tokens": line["_replay"]["output_tokens"]}
                                                          if "max_completion_tokens" not in line else line)})
        + "\n" for i, line in enumerate(sent)))
    again = invoke_cli("bench", "--url", cpu_server.url, "--replay", str(matched), "--json")
    assert again.code == 0, again.output
    second = json.loads(Path(again.output.split("report: ")[1].split()[0]).read_text())
    assert second["workload"]["format"] == "matched-request"
    assert [r["prompt_tokens"] for r in second["requests"]] == [r["prompt_tokens"] for r in data["requests"]]
    assert [r["completion_tokens"] for r in second["requests"]] == [r["completion_tokens"] for r in data["requests"]]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_point_sweep_of_the_cpu_target(cpu_server: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep in float32 (the config ``cpu_server`` serves): its max-num-seqs=8 point is the session's server,
    found by its run spec and reused; max-num-seqs=1 is started for the sweep and removed after it."""
    from imageforge.docker_engine import client
    from imageforge.labels import L_RUN_SPEC, L_TARGET

    w = Workload(requests=8, concurrency=4, prompt_tokens=128, output_tokens=16, seed=7, duration=120, repeat=2)
    lines: list[str] = []
    assert cpu_server.running() and not cpu_server.reused
    result = app.sweep(app.settings(reuse_servers=True), "cpu", "conservative", ["max-num-seqs=1,8"],
                       ["dtype=float32"], workload=w, requests_given=True, concurrency_given=True,
                       echo=lines.append)
    out = capsys.readouterr().out
    assert [p.status for p in result.points] == ["ok", "ok"], [p.error for p in result.points]
    for point in result.points:
        # only the serving-config layer differs between points (or nothing, when an earlier run built it)
        assert point.build.endswith("(serving-config)") or point.build.endswith("(all cached)"), point.build
        assert point.summary is not None and point.summary["completion_tokens"] == 8 * 16
        assert point.bench_json is not None and Path(point.bench_json).is_file()
    assert result.points[0].image_id != result.points[1].image_id
    # the first point started its own server; the second is cpu_server (same image ID, same run spec), reused
    assert not result.points[0].reused and result.points[0].startup_seconds is not None
    assert result.points[0].startup_seconds > 0
    assert result.points[1].reused and result.points[1].startup_seconds is None
    assert result.points[1].image_id == cpu_server.container.image.id
    assert f"  [2] server {cpu_server.name} reused on {cpu_server.url}" in lines, lines
    # interleaved: both servers up once, one run of each per round, the order rotating, seeds 7 and 8
    assert result.interleaved
    assert [[r["round"] for r in p.runs] for p in result.points] == [[0, 1], [0, 1]]
    assert [[r["seed"] for r in p.runs] for p in result.points] == [[7, 8], [7, 8]]
    assert result.points[0].ratio == (1.0, 1.0, 1.0) and result.points[1].ratio is not None
    assert any(line.startswith("round 2/2: [2] [1]") for line in lines), lines
    assert (result.run_dir / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert any(line == f"plot: {result.run_dir / 'sweep.png'}" for line in lines)
    assert result.best is not None and result.plateau in (None, 0)  # 2 points: 0, or still rising
    data = json.loads((result.run_dir / "sweep.json").read_text())
    assert [p["params"] for p in data["points"]] == [{"max-num-seqs": 1}, {"max-num-seqs": 8}]
    assert [p["reused"] for p in data["points"]] == [False, True]
    md = (result.run_dir / "sweep.md").read_text()
    assert "| max-num-seqs | Output TPS | Input TPS | Cache TPS | weighted TPS |" in md and "best weighted_tps" in md
    assert "sweep cpu:conservative" in out
    assert any(line.startswith("best weighted_tps: max-num-seqs=") for line in lines)
    # the server the sweep started is gone, the reused one is left running; the points are tagged under
    # imageforge/cpu-sweep, not the profile's own tags
    leftovers = [c for c in labelled({L_TARGET: "cpu"})
                 if c.image.id in {p.image_id for p in result.points}]
    assert [c.id for c in leftovers] == [cpu_server.container.id]
    assert cpu_server.running()
    assert (cpu_server.container.labels or {}).get(L_RUN_SPEC)
    # the first point's own start, as `smoke --target` starts one (the same serving(); test_smoke's end-to-end
    # test reuses cpu_server): started, ready after N s, removed after its benches, its log kept
    point_log = (result.run_dir / "point-1.log").read_text()
    started = re.search(r"started (imageforge-cpu-\S+) from (\S+) on ", point_log)
    assert started and started.group(2) == result.points[0].image_id, point_log
    assert re.search(r"ready: http://127\.0\.0\.1:\d+/health OK after [\d.]+s", point_log), point_log
    assert f"removed {started.group(1)}" in point_log
    tags = client().images.get(str(result.points[0].image_id)).tags
    assert tags and all(t.startswith("imageforge/cpu-sweep:") for t in tags), tags
