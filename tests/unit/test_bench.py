"""Bench and sweep: weighted rate, percentiles, workloads, /metrics parsing, plateau, the client against a fake
transport.

No daemon: the client's HTTP goes through ``httpx.MockTransport`` (no sockets), and the sweep's build and serve
steps are replaced by stubs; except the in-place sweep, which applies a patch to a tmp root and serves each point
with the fake vLLM of test_equiv_record as a real process (the claim of the box test that served two real vLLM
points in place; the in-place budget of vLLM starts).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge import bench as bench_mod
from imageforge.bench import (
    CACHED_WEIGHT,
    OUTPUT_WEIGHT,
    PLATFORM_FACTOR,
    UNCACHED_INPUT_WEIGHT,
    BenchResult,
    RequestResult,
    SweepPoint,
    SweepResult,
    Workload,
    combinations,
    counter_delta,
    metrics_counters,
    parse_params,
    percentile,
    plateau_index,
    platform_score,
    prompt_words,
    run_bench,
    set_args,
    sweep_workload,
    verdict,
    weighted_tps,
)
from imageforge.bench.report import bench_rows
from imageforge.errors import ConfigError, SmokeError
from tests.unit.conftest import manifest_text

# ----------------------------------------------------------------------------- the weighted rate


def test_weights_are_the_platforms_formula() -> None:
    assert (OUTPUT_WEIGHT, UNCACHED_INPUT_WEIGHT, CACHED_WEIGHT, PLATFORM_FACTOR) == (16.796, 2.799, 0.56, 38.582)
    assert weighted_tps(100, 1000, 500) == pytest.approx(100 * 16.796 + 1000 * 2.799 + 500 * 0.56)
    assert weighted_tps(0, 0, 0) == 0
    assert platform_score(10.0) == pytest.approx(385.82)


def _result(wall: float, *, completions: list[int], prompts: list[int], cached: int | None,
            errors: int = 0, max_error_rate: float = 0.0) -> BenchResult:
    results = [RequestResult(i, ok=True, prompt_tokens=p, completion_tokens=c, ttft=0.1 * (i + 1),
                             latency=1.0 + i, usage=True)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    results += [RequestResult(100 + i, ok=False, error="HTTP 500: boom") for i in range(errors)]
    w = Workload(requests=len(results), output_tokens=completions[0] if completions else 1,
                 max_error_rate=max_error_rate)
    return BenchResult(run_id="r", url="http://127.0.0.1:1", model="m", workload=w, started_at="now",
                       wall_seconds=wall, results=results, cached_tokens=cached)


def test_bench_rates_and_weighted_rate_come_from_ok_requests_over_wall_time() -> None:
    b = _result(2.0, completions=[10, 10], prompts=[100, 100], cached=50, errors=1, max_error_rate=0.5)
    assert (b.output_tps, b.input_tps, b.uncached_input_tps, b.cache_tps) == (10.0, 100.0, 75.0, 25.0)
    # cached tokens are their own term: the input term counts the uncached 150 of 200 only
    assert b.weighted_tps == pytest.approx(10 * 16.796 + 75 * 2.799 + 25 * 0.56)
    s = b.summary()
    assert s["platform_score"] == pytest.approx(b.weighted_tps * 38.582, abs=0.1)
    assert [k for k in s if k.endswith("score")] == ["platform_score"]
    assert s["ok"] == 2 and s["errors"] == 1 and s["error_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert s["ttft_p50_s"] == pytest.approx(0.15) and s["latency_p95_s"] == pytest.approx(1.95)
    assert s["tpot_p50_s"] == pytest.approx(((1.0 - 0.1) / 9 + (2.0 - 0.2) / 9) / 2, abs=1e-6)
    verdict(b)  # 1/3 <= 0.5


def test_verdict_fails_on_error_rate_and_on_no_tokens() -> None:
    with pytest.raises(SmokeError, match=r"1 of 3 bench requests failed"):
        verdict(_result(1.0, completions=[4, 4], prompts=[8, 8], cached=None, errors=1))
    with pytest.raises(SmokeError, match="got no tokens back") as info:
        verdict(_result(1.0, completions=[], prompts=[], cached=None, errors=2, max_error_rate=1.0))
    assert info.value.exit_code == 4
    assert "HTTP 500: boom" in (info.value.found or "")


# ----------------------------------------------------------------------------- percentile


def test_percentile_interpolates_linearly_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    data = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 4.0
    assert percentile(data, 50) == pytest.approx(2.5)
    assert percentile(data, 95) == pytest.approx(3.85)  # numpy.percentile([1,2,3,4], 95)
    assert percentile(list(range(101)), 95) == pytest.approx(95.0)
    with pytest.raises(ValueError):
        percentile(data, 101)


# ----------------------------------------------------------------------------- workload


def test_prompt_words_are_deterministic_and_extend_without_changing_their_start() -> None:
    a = prompt_words(1, "prefix", 50)
    assert a == prompt_words(1, "prefix", 50)
    assert a != prompt_words(2, "prefix", 50)
    assert a != prompt_words(1, "request-0", 50)
    assert len(a.split()) == 50
    assert prompt_words(1, "prefix", 200).startswith(a + " ")
    assert prompt_words(1, "prefix", 0) == ""


def test_workload_texts_share_the_prefix_and_are_reproducible_in_another_process() -> None:
    w = Workload(requests=5, prompt_tokens=40, shared_prefix=0.25, seed=3)
    assert (w.prefix_tokens, w.unique_tokens) == (10, 30)
    texts = w.texts()
    assert len(texts) == 5 and len(set(texts)) == 5
    prefix = w.prefix_text(10)
    assert all(t.startswith(prefix + " ") for t in texts)
    assert texts == Workload(requests=5, prompt_tokens=40, shared_prefix=0.25, seed=3).texts()
    assert texts != Workload(requests=5, prompt_tokens=40, shared_prefix=0.25, seed=4).texts()
    code = ("import json; from imageforge.bench import Workload; "
            "print(json.dumps(Workload(requests=5, prompt_tokens=40, shared_prefix=0.25, seed=3).texts()))")
    for hashseed in ("1", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hashseed})
        assert json.loads(out.stdout) == texts


def test_workload_edges_and_validation() -> None:
    assert Workload(prompt_tokens=10, shared_prefix=0.0).prefix_tokens == 0
    assert Workload(prompt_tokens=10, shared_prefix=1.0).unique_tokens == 0
    assert all(t == Workload(requests=3, prompt_tokens=8, shared_prefix=1.0).texts()[0]
               for t in Workload(requests=3, prompt_tokens=8, shared_prefix=1.0).texts())
    with pytest.raises(ConfigError) as info:
        Workload(requests=0, concurrency=0, shared_prefix=2, api="grpc", max_error_rate=-1).validate()
    message = info.value.message
    for part in ("requests must be >= 1", "concurrency must be >= 1", "shared prefix", "api must be one of",
                 "max error rate"):
        assert part in message
    assert info.value.exit_code == 2


# ----------------------------------------------------------------------------- /metrics

METRICS_SAMPLE = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-qwen3-moe"} 25314.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-qwen3-moe"} 1.7959956041157568e+09
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-qwen3-moe"} 13568.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny-qwen3-moe"} 1.7959956041157675e+09
vllm:prompt_tokens_total{engine="0",model_name="tiny-qwen3-moe"} 25314.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny-qwen3-moe",source="local_compute"} 11746.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny-qwen3-moe",source="local_cache_hit"} 13568.0
vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-qwen3-moe"} 13568.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="tiny-qwen3-moe",source="device"} 13568.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="tiny-qwen3-moe",source="host"} 0.0
vllm:generation_tokens_total{engine="0",model_name="tiny-qwen3-moe"} 1957.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-qwen3-moe"} 0.0
vllm:generation_tokens_total{engine="1",model_name="tiny-qwen3-moe"} 43.0
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_metrics_counters_from_a_real_vllm_sample() -> None:
    counters = metrics_counters(METRICS_SAMPLE)
    assert counters["vllm:prompt_tokens_cached_total"] == 13568.0
    assert counters["vllm:prefix_cache_hits_total"] == 13568.0
    assert counters["vllm:prompt_tokens_by_source_total"] == 25314.0  # label sets are summed
    assert counters["vllm:generation_tokens_total"] == 2000.0  # both engines
    assert not any(name.endswith("_created") for name in counters)
    assert "python_gc_objects_collected_total" not in counters


def test_counter_delta_takes_the_first_name_present_in_both_snapshots() -> None:
    before = metrics_counters(METRICS_SAMPLE)
    after = dict(before, **{"vllm:prompt_tokens_cached_total": 14000.0, "vllm:prefix_cache_hits_total": 14100.0})
    assert counter_delta(before, after, bench_mod.CACHED_TOKEN_COUNTERS) == ("vllm:prompt_tokens_cached_total", 432.0)
    older = {"vllm:prefix_cache_hits": 10.0}
    assert counter_delta(older, {"vllm:prefix_cache_hits": 25.0}, bench_mod.CACHED_TOKEN_COUNTERS) == (
        "vllm:prefix_cache_hits", 15.0)
    assert counter_delta({}, after, bench_mod.CACHED_TOKEN_COUNTERS) is None
    # a restarted server (counter went down) never yields a negative count
    assert counter_delta(after, before, ["vllm:prompt_tokens_cached_total"]) == (
        "vllm:prompt_tokens_cached_total", 0.0)


# ----------------------------------------------------------------------------- plateau, sweep bookkeeping


def test_plateau_is_the_first_point_within_five_percent_of_the_max_before_the_last() -> None:
    assert plateau_index([100.0, 190.0, 200.0, 205.0]) == 2  # 200 >= 0.95 * 205
    assert plateau_index([100.0, 150.0, 190.0, 205.0]) is None  # still rising at the last point
    assert plateau_index([100.0, 150.0, 190.0, 205.0, 206.0]) == 3
    assert plateau_index([100.0]) is None and plateau_index([100.0, None]) is None
    assert plateau_index([300.0, 290.0, 100.0]) == 0
    assert plateau_index([None, 50.0, None, 52.0]) == 1
    assert plateau_index([]) is None and plateau_index([None]) is None
    assert plateau_index([100.0, 179.0, 200.0, 201.0], tolerance=0.1) == 2
    assert plateau_index([100.0, 180.0, 200.0], tolerance=0.1) == 1


def test_parse_params_combinations_and_set_args() -> None:
    params = parse_params(["max-num-seqs=1, 2,4", "enforce-eager=true,false", "env.X=a"])
    assert params == [("max-num-seqs", [1, 2, 4]), ("enforce-eager", [True, False]), ("env.X", ["a"])]
    points = combinations(params)
    assert len(points) == 6
    assert points[0] == {"max-num-seqs": 1, "enforce-eager": True, "env.X": "a"}
    assert points[1]["enforce-eager"] is False and points[2]["max-num-seqs"] == 2
    assert set_args(points[1]) == ["max-num-seqs=1", "enforce-eager=false", "env.X=a"]
    for bad in (["max-num-seqs"], ["=1,2"], ["max-num-seqs=1,,2"], ["max-num-seqs="], []):
        with pytest.raises(ConfigError):
            parse_params(bad)
    with pytest.raises(ConfigError, match="given twice"):
        parse_params(["a=1", "a=2"])


def test_sweep_workload_fills_the_largest_batch_unless_told_otherwise() -> None:
    params = [("max-num-seqs", [1, 4, 16])]
    w = sweep_workload(params, Workload(), requests_given=False, concurrency_given=False)
    assert (w.concurrency, w.requests) == (16, 64)
    w = sweep_workload(params, Workload(concurrency=2, requests=10), requests_given=True, concurrency_given=True)
    assert (w.concurrency, w.requests) == (2, 10)
    w = sweep_workload([("max-num-batched-tokens", [1024])], Workload(), requests_given=False,
                       concurrency_given=False)
    assert (w.concurrency, w.requests) == (8, 32)


def _point(params: dict[str, Any], status: str, out: float | None = None, sc: float | None = None) -> SweepPoint:
    summary = None if out is None else {"output_tps": out, "input_tps": out * 10, "cache_tps": out, "weighted_tps": sc,
                                         "ttft_p95_s": 0.2, "latency_p95_s": 1.5, "errors": 0, "requests": 8}
    return SweepPoint(params, status=status, summary=summary, error=None if status == "ok" else "boom\nmore",
                      startup_seconds=31.0 if summary else None)


def test_sweep_result_marks_best_and_plateau_and_skips_failed_points(tmp_path: Path) -> None:
    points = [_point({"max-num-seqs": 1}, "ok", 100.0, 1000.0), _point({"max-num-seqs": 4}, "ok", 196.0, 3000.0),
              _point({"max-num-seqs": 8}, "ok", 200.0, 2900.0), _point({"max-num-seqs": 16}, "no-start"),
              _point({"max-num-seqs": 32}, "failed", 900.0, 9000.0)]
    result = SweepResult(run_id="s", target="cpu", profile="conservative", base_sets=[], workload=Workload(),
                         points=points, run_dir=tmp_path / "s", started_at="2026-11-29T00:00:00+00:00")
    assert result.best == 1 and result.plateau == 1
    header, rows = result.rows()
    assert header[0] == "max-num-seqs" and header[-1] == "mark"
    assert rows[1][-1] == "best weighted_tps, plateau"
    assert rows[3][-1] == "no-start: boom" and rows[3][1] == "-"
    assert rows[4][-1].startswith("failed")
    json_path, md_path = result.write()
    data = json.loads(json_path.read_text())
    assert data["best"] == 1 and data["plateau"] == 1 and data["points"][3]["status"] == "no-start"
    md = md_path.read_text()
    assert "| max-num-seqs | Output TPS |" in md and "best weighted_tps, plateau" in md


# ----------------------------------------------------------------------------- the client (fake transport)


class FakeVllm:
    """Answers like vLLM's OpenAI server: /v1/models, /tokenize, /metrics, streamed /v1/completions."""

    def __init__(self, *, fail_every: int = 0, usage_details: bool = False, tokenize: bool = True,
                 stream_error: bool = False) -> None:
        self.fail_every = fail_every
        self.usage_details = usage_details
        self.has_tokenize = tokenize
        self.stream_error = stream_error
        self.completions: list[dict[str, Any]] = []
        self.cached = 0.0
        self.prompt = 0.0
        self.seen_prefixes: set[tuple[int, ...]] = set()

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake", "max_model_len": 4096}]})
        if path == "/tokenize":
            if not self.has_tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            text = json.loads(request.content)["prompt"]
            return httpx.Response(200, json={"tokens": [len(w) for w in text.split()] * 2})
        if path == "/metrics":
            return httpx.Response(200, text=f"vllm:prompt_tokens_total{{engine=\"0\"}} {self.prompt}\n"
                                            f"vllm:prompt_tokens_cached_total{{engine=\"0\"}} {self.cached}\n")
        if path == "/v1/completions":
            body = json.loads(request.content)
            self.completions.append(body)
            n = len(self.completions)
            if self.fail_every and n % self.fail_every == 0:
                return httpx.Response(500, json={"error": {"message": "engine dead"}})
            prompt = body["prompt"]
            p_len = len(prompt) if isinstance(prompt, list) else len(prompt.split())
            prefix = tuple(prompt[:4]) if isinstance(prompt, list) else ()
            hit = 4 if prefix in self.seen_prefixes else 0
            self.seen_prefixes.add(prefix)
            self.prompt += p_len
            self.cached += hit
            lines: list[dict[str, Any]] = []
            if self.stream_error:
                lines.append({"error": {"message": "overloaded"}})
            for _ in range(body["max_tokens"]):
                lines.append({"choices": [{"index": 0, "text": "x"}]})
            usage: dict[str, Any] = {"prompt_tokens": p_len, "completion_tokens": body["max_tokens"]}
            if self.usage_details:
                usage["prompt_tokens_details"] = {"cached_tokens": hit}
            lines.append({"choices": [], "usage": usage})
            text = "".join(f"data: {json.dumps(x)}\n\n" for x in lines) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(404)


def _bench(fake: FakeVllm, tmp_path: Path, **kw: Any) -> BenchResult:
    w = Workload(requests=6, concurrency=3, prompt_tokens=8, output_tokens=5, shared_prefix=0.5, warmup=1, **kw)
    return run_bench("http://127.0.0.1:9", w, run_dir=tmp_path / "run", echo=lambda _l: None,
                     transport=httpx.MockTransport(fake.handler))


def test_client_sends_exact_token_prompts_and_counts_tokens(tmp_path: Path) -> None:
    fake = FakeVllm()
    b = _bench(fake, tmp_path)
    assert len(fake.completions) == 7  # 1 warm-up + 6
    warm, *measured = fake.completions
    assert all(isinstance(c["prompt"], list) and len(c["prompt"]) == 8 for c in fake.completions)
    assert len({tuple(c["prompt"][:4]) for c in measured}) == 1  # the shared prefix
    assert tuple(warm["prompt"][:4]) != tuple(measured[0]["prompt"][:4])  # warm-up does not prime it
    assert all(c["max_tokens"] == 5 and c["ignore_eos"] and c["stream"] for c in measured)
    assert not any("min_tokens" in c for c in measured)  # vLLM's min-tokens processor would cost every step
    assert (b.errors, b.prompt_tokens, b.completion_tokens, b.short_responses) == (0, 48, 30, 0)
    assert b.prompt_mode == "token-ids" and b.model == "fake"
    assert b.cached_tokens == 20 and b.cache_source.startswith("/metrics vllm:prompt_tokens_cached_total")
    assert all(r.ttft is not None and r.latency is not None and r.ttft <= r.latency for r in b.results)
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["summary"]["completion_tokens"] == 30 and len(data["requests"]) == 6
    assert data["score_weights"] == {"output_tps": 16.796, "uncached_input_tps": 2.799, "cache_tps": 0.56}
    verdict(b)


def test_client_prefers_usage_cached_tokens(tmp_path: Path) -> None:
    b = _bench(FakeVllm(usage_details=True), tmp_path)
    assert b.cache_source == "usage.prompt_tokens_details.cached_tokens" and b.cached_tokens == 20


def test_client_falls_back_to_text_prompts_without_tokenize(tmp_path: Path) -> None:
    fake = FakeVllm(tokenize=False)
    b = _bench(fake, tmp_path)
    assert b.prompt_mode == "text" and isinstance(fake.completions[1]["prompt"], str)
    assert any("no /tokenize" in n for n in b.notes)
    assert b.completion_tokens == 30


def test_client_error_path_counts_failures_and_fails_the_verdict(tmp_path: Path) -> None:
    fake = FakeVllm(fail_every=2)  # the 2nd, 4th, 6th call (warm-up is the 1st)
    b = _bench(fake, tmp_path)
    assert b.errors == 3 and b.completion_tokens == 15
    assert {r.error for r in b.results if not r.ok} == {"HTTP 500: engine dead"}
    with pytest.raises(SmokeError, match=r"3 of 6 bench requests failed \(error rate 50.0% > 0.0%\)"):
        verdict(b)
    verdict(_bench(FakeVllm(fail_every=2), tmp_path, max_error_rate=0.5))
    stream = _bench(FakeVllm(stream_error=True), tmp_path, max_error_rate=1.0)
    assert stream.errors == 6 and all(r.error == "stream error: overloaded" for r in stream.results)


def test_client_rejects_lengths_beyond_max_model_len_and_bad_urls(tmp_path: Path) -> None:
    w = Workload(requests=1, prompt_tokens=4000, output_tokens=200)
    with pytest.raises(ConfigError, match="exceeds the server's max_model_len 4096"):
        run_bench("http://127.0.0.1:9", w, transport=httpx.MockTransport(FakeVllm().handler), write=False)
    with pytest.raises(ConfigError, match="not an http URL"):
        run_bench("ftp://x", Workload(), write=False)


def test_client_reports_an_unreachable_server(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(SmokeError, match="no server answers"):
        run_bench("http://127.0.0.1:9", Workload(requests=1), transport=httpx.MockTransport(refuse), write=False)


def test_duration_limit_cuts_slow_requests(tmp_path: Path) -> None:
    import asyncio

    fake = FakeVllm()

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and len(fake.completions) >= 1:
            await asyncio.sleep(30)
        return fake.handler(request)

    w = Workload(requests=3, concurrency=3, prompt_tokens=8, output_tokens=2, warmup=1, duration=0.5)
    b = run_bench("http://127.0.0.1:9", w, transport=httpx.MockTransport(slow), write=False,
                  echo=lambda _l: None)
    assert b.cancelled == 3 and b.results == [] and 0.4 < b.wall_seconds < 5
    assert any("cut by the duration limit" in n for n in b.notes)
    with pytest.raises(SmokeError, match="3 cut by the duration limit"):
        verdict(b)


# ----------------------------------------------------------------------------- sweep orchestration (stubbed)

SWEEP_MANIFEST = manifest_text("""\
    image: test/t
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1, max-num-batched-tokens: 512}
    default_profile: small
    profiles:
      small: {args: {max-num-seqs: 2}}
""")


def test_sweep_continues_past_failing_points_and_builds_under_a_sweep_image(
        write_manifest: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from imageforge.manifest.load import load_manifest
    from imageforge.steps import StepResult

    manifest = load_manifest(write_manifest(SWEEP_MANIFEST))
    built: list[tuple[str, Any]] = []

    class Built:
        def __init__(self, image_id: str) -> None:
            self.image_id = image_id
            self.steps = (StepResult("verify", "verify", "HIT", "", 0.1, stage="verify", key="k1", image_id="sha256:v"),
                          StepResult("serving-config", "config", "BUILT", "", 0.2, stage="config", key="k2",
                                     image_id=image_id))
            self.built, self.tags = 1, ("test/t-sweep:small",)

    def fake_build(resolved: Any, *, environ: Any, echo: Any) -> Built:
        built.append((resolved.target.image, resolved.serving_args()["max-num-seqs"]))
        return Built(f"sha256:{len(built)}")

    def fake_bench(resolved: Any, workload: Workload, runtime: Any, **kw: Any) -> BenchResult:
        seqs = resolved.serving_args()["max-num-seqs"]
        if seqs == 4:
            raise SmokeError("the server of t:small stopped before it was ready", found="exit code 1")
        out = {1: 100.0, 8: 198.0, 16: 200.0}[seqs]
        results = [RequestResult(0, ok=True, prompt_tokens=10, completion_tokens=int(out), ttft=0.1, latency=1.0,
                                 usage=True)]
        b = BenchResult(run_id=f"b{seqs}", url="u", model="m", workload=workload, started_at="now",
                        wall_seconds=1.0, results=results, cached_tokens=0, startup_seconds=30.0)
        b.json_path = tmp_path / f"b{seqs}.json"
        return b

    from imageforge.serve import container

    monkeypatch.setattr(container, "build_target", fake_build)  # the container runtime's prepare builds
    monkeypatch.setattr(bench_mod.sweeps, "bench_target", fake_bench)
    lines: list[str] = []
    result = bench_mod.sweep(manifest, "t", None, [("max-num-seqs", [1, 4, 8, 16])],
                             Workload(requests=1, concurrency=16, output_tokens=100, max_error_rate=1.0),
                             container.ContainerRuntime(), sets=["max-num-batched-tokens=1024"], environ={},
                             echo=lines.append)
    assert built == [("test/t-sweep", 1), ("test/t-sweep", 4), ("test/t-sweep", 8), ("test/t-sweep", 16)]
    assert [p.status for p in result.points] == ["ok", "no-start", "ok", "ok"]
    assert result.points[0].build == "1 of 2 layers built (serving-config)"
    assert "exit code 1" in (result.points[1].error or "")
    assert result.best == 3 and result.plateau == 2  # 198 >= 0.95 * 200
    assert (result.run_dir / "sweep.json").exists() and (result.run_dir / "sweep.md").exists()
    assert any("build: 1 of 2 layers built (serving-config)" in line for line in lines)
    with pytest.raises(ConfigError, match="unknown key 'max-num-seq'"):
        bench_mod.sweep(manifest, "t", None, [("max-num-seq", [1])], Workload(), container.ContainerRuntime(),
                        environ={}, echo=lines.append)



def test_sweep_in_place_serves_each_point_one_at_a_time_and_leaves_the_root_as_before(
        tmp_path: Path, write_manifest: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweep --in-place` over two serving values, through the command in process: the steps applied once, each
    point served as a process (the fake vLLM of test_equiv_record answering the bench itself), measured and
    stopped before the next starts; the root's listing after the sweep equals the one before, no journal left.
    (Moved from tests/integration/test_inplace_box.py, where it took two real vLLM starts, ~100 s.)"""
    from imageforge import inplace
    from imageforge.bench import runner
    from imageforge.serve.ports import free_port
    from imageforge.serve.process import ProcessRuntime, running_records
    from tests.cli import imageforge

    from .test_equiv_record import FAKE_VLLM
    from .test_inplace import make_root

    (tmp_path / "fake_vllm.py").write_text(FAKE_VLLM)
    (tmp_path / "weights").mkdir()
    manifest = write_manifest(manifest_text(textwrap.indent(textwrap.dedent(f"""\
        steps:
          - id: fix
            kind: patch
            file: vllm/y.py
            old: "A = 1"
            new: "A = 2"
        run: {{port: {free_port()}, volumes: [{{source: weights, target: /model, read_only: true}}]}}
        serving:
          config_path: /x.yaml
          style: argv
          command: [python3, {tmp_path / "fake_vllm.py"}]
          args: {{model: /model, max-model-len: 512, max-num-seqs: 8}}
        smoke: {{startup_timeout: 20}}
    """), "    ")))
    root = make_root(tmp_path)  # a vllm 1.0 package under root/site: the patch's file
    monkeypatch.setenv("PYTHONPATH", str(root / "site"))  # the target interpreter finds it there
    before = list(inplace.listing(root))
    seen: list[tuple[str, list[dict[str, Any]], str]] = []  # per bench: its URL, the servers up, the patched file
    real = runner.run_bench  # the name bench_target calls

    def bench(url: str, workload: Workload, **kw: Any) -> BenchResult:
        seen.append((url, running_records(tmp_path), (root / "site/vllm/y.py").read_text()))
        return real(url, workload, **kw)

    monkeypatch.setattr(runner, "run_bench", bench)
    proc = imageforge("sweep", "--manifest", str(manifest), "--target", "t", "--in-place", "--root", str(root),
                      "--python", sys.executable, "--param", "max-num-seqs=1,2", "--requests", "2", "--repeat", "1",
                      cwd=Path.cwd())
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert f"in place on {root}: 2 server start(s), one at a time; the steps applied 1 time(s)" in text, text
    run_id = re.search(r"  run (\S+)  ", text)
    assert run_id, text
    doc = json.loads((tmp_path / ".imageforge" / "runs" / run_id.group(1) / "sweep.json").read_text())
    points = doc["points"]
    assert [p["params"] for p in points] == [{"max-num-seqs": 1}, {"max-num-seqs": 2}]
    for p in points:
        assert p["status"] == "ok", p
        assert p["summary"]["requests"] == 2 and p["summary"]["errors"] == 0 and p["summary"]["output_tps"] > 0
        assert p["startup_seconds"] and p["startup_seconds"] > 0
    assert points[0]["build"] != points[1]["build"] == "the applied files reused (serving flags only)"
    # while each point's bench ran: exactly one server up (the one before was stopped), a new process each time,
    # started with the point's flag, and the patch applied under the root
    assert len(seen) == 2
    for (url, up, patched), seqs in zip(seen, (1, 2), strict=True):
        [server] = up
        argv = server["argv"]
        assert server["url"] == url and argv[argv.index("--max-num-seqs") + 1] == str(seqs), server
        assert patched == "A = 2\n"
    assert seen[0][1][0]["pid"] != seen[1][1][0]["pid"]
    # none is left: every server the sweep recorded is marked stopped and gone
    servers = [json.loads(path.read_text()) for path in (tmp_path / ".imageforge" / "runs").glob("*/server.json")]
    assert len(servers) == 2 and all(s.get("stopped") for s in servers), servers
    assert running_records(tmp_path) == []
    # the root as before: the same listing (the patched file and its .pyc back), no journal
    after = list(inplace.listing(root))
    assert ([r for r in after if r not in before], [r for r in before if r not in after]) == ([], [])
    assert ProcessRuntime(root=root, python=sys.executable).applied_state() is None
    assert not (root / "var/lib/imageforge/journal.json").exists()

def test_repeat_reports_the_median_run_and_never_hides_a_failing_one(tmp_path: Path) -> None:
    fake = FakeVllm()
    b = _bench(fake, tmp_path, repeat=3)
    assert len(fake.completions) == 1 + 3 * 6  # one warm-up, then three runs
    prompts = [tuple(c["prompt"]) for c in fake.completions[1:]]
    assert len(set(prompts[:6]) & set(prompts[6:12])) == 0  # seed, seed+1: other prompts each run
    assert [r["seed"] for r in b.repeats] == [0, 1, 2]
    rates = sorted(r["weighted_tps"] for r in b.repeats)
    assert b.summary()["weighted_tps"] == rates[1]
    assert any(n.startswith("median of 3 runs by weighted_tps") for n in b.notes)
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert len(data["repeats"]) == 3

    ok = _result(1.0, completions=[4], prompts=[8], cached=None)
    ok.repeats = [ok.summary(), {**ok.summary(), "error_rate": 0.25}]
    assert ok.worst_error_rate == 0.25
    with pytest.raises(SmokeError, match=r"a run of the 2 repeats had failed requests \(error rate 25.0%"):
        verdict(ok)


def test_median_run_of_an_even_count_is_the_lower_middle() -> None:
    runs = [_result(1.0, completions=[c], prompts=[1], cached=0) for c in (40, 10, 30, 20)]
    assert bench_mod.median_run(runs).completion_tokens == 20
    single = _result(1.0, completions=[5], prompts=[1], cached=0)
    assert bench_mod.median_run([single]) is single and single.repeats == []


def test_duration_bounds_all_repeats_together(tmp_path: Path) -> None:
    import asyncio

    fake = FakeVllm()

    async def slowish(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and len(fake.completions) >= 1:
            await asyncio.sleep(0.4)
        return fake.handler(request)

    w = Workload(requests=1, concurrency=1, prompt_tokens=8, output_tokens=2, warmup=1, duration=1.0, repeat=10)
    b = run_bench("http://127.0.0.1:9", w, transport=httpx.MockTransport(slowish), write=False, echo=lambda _l: None)
    # the first run takes >= 0.4 s: less than the 1 s a run needs is left, so the other nine are skipped
    assert b.repeats == [] and b.completion_tokens == 2
    assert "9 of 10 repeats skipped: the duration limit (1s) was spent" in b.notes


def test_sweep_table_shows_requests_cut_by_the_duration_limit(tmp_path: Path) -> None:
    point = _point({"max-num-seqs": 4}, "ok", 50.0, 900.0)
    assert point.summary is not None
    point.summary.update(errors=1, requests=64, cancelled=32)
    result = SweepResult(run_id="s", target="cpu", profile="p", base_sets=[], workload=Workload(), points=[point],
                         run_dir=tmp_path, started_at="now")
    header, rows = result.rows()
    assert rows[0][header.index("errors")] == "1/64, 32 cut"


# ----------------------------------------------------------------------------- interleaved sweeps


def test_rotations_interleave_and_rotate_the_first_point() -> None:
    from imageforge.bench.sweeps import rotations

    assert rotations(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]  # ABBAAB...: no point always first
    assert rotations(3, 3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert rotations(0, 3) == [] and rotations(2, 0) == []


def test_paired_ratios_are_per_round_against_the_first_point() -> None:
    from imageforge.bench.sweeps import paired_ratios

    # point B is 10 % above A in round 0, 30 % in round 1, 20 % in round 2 (drift of the machine cancels)
    ratios = paired_ratios([[100.0, 50.0, 80.0], [110.0, 65.0, 96.0], [None, 40.0, None]])
    assert ratios[0] == (1.0, 1.0, 1.0)
    assert ratios[1] == pytest.approx((1.2, 1.1, 1.3))
    assert ratios[2] == pytest.approx((0.8, 0.8, 0.8))  # only round 1 has both
    assert paired_ratios([[100.0], [None]])[1] is None


def test_sweep_plot_points_one_dot_per_run_and_aa_values_kept_apart(tmp_path: Path) -> None:
    from imageforge.bench.sweeps import SweepResult

    a, b = _point({"max-num-seqs": 8}, "ok", 10.0, 100.0), _point({"max-num-seqs": 8}, "ok", 11.0, 110.0)
    a.runs = [{"weighted_tps": 100.0, "output_tps_p10": 3.0, "ttft_p90_s": 0.5}, {"weighted_tps": 90.0}]
    result = SweepResult("r", "cpu", "conservative", [], Workload(repeat=2), [a, b], tmp_path, "now",
                         interleaved=True)
    points = result.plot_points()
    assert [p["value"] for p in points] == ["#1 max-num-seqs=8", "#1 max-num-seqs=8", "#2 max-num-seqs=8"]
    assert [p["weighted_tps"] for p in points] == [100.0, 90.0, 110.0]  # b has no runs: its summary is one dot
    png = result.plot()
    assert png == tmp_path / "sweep.png" and png.read_bytes()[:4] == b"\x89PNG"
    header, _rows = result.rows()
    assert "weighted / first (median, range)" in header


def test_itl_and_p99_pool_the_gaps_of_successful_requests() -> None:
    b = _result(2.0, completions=[3, 3], prompts=[10, 10], cached=None)
    b.results[0].itl = [0.01, 0.03]
    b.results[1].itl = [0.02, 0.04]
    s = b.summary()
    # numpy.percentile([0.01, 0.02, 0.03, 0.04], [50, 99]) by hand: rank 1.5 -> 0.025; rank 2.97 -> 0.0397
    assert s["itl_p50_s"] == pytest.approx(0.025) and s["itl_p99_s"] == pytest.approx(0.0397)
    # TTFTs 0.1, 0.2: rank 0.99 -> 0.199; latencies 1, 2 -> 1.99
    assert s["ttft_p99_s"] == pytest.approx(0.199) and s["latency_p99_s"] == pytest.approx(1.99)
    rows = dict(bench_rows(b))
    assert rows["inter-token latency p50 / p99"].startswith("25 ms / 40 ms")


def test_streamed_chunks_give_one_itl_gap_fewer_than_chunks(tmp_path: Path) -> None:
    b = _bench(FakeVllm(), tmp_path)
    assert all(len(r.itl) == 4 and all(g >= 0 for g in r.itl) for r in b.results)  # 5 chunks of one token
    assert b.summary()["itl_p99_s"] is not None


def test_request_rate_sends_poisson_arrivals(tmp_path: Path) -> None:
    w = Workload(requests=200, request_rate=50.0, seed=3)
    at = w.arrivals()
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert at[0] == 0.0 and at == sorted(at) and at == Workload(requests=200, request_rate=50.0, seed=3).arrivals()
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.2)  # exponential gaps of mean 1/rate
    assert statistics.pstdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.3)  # sd = mean: exponential
    assert Workload(requests=3).arrivals() == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="request rate must be >= 0"):
        Workload(request_rate=-1).validate()
    fake = FakeVllm()
    began = time.monotonic()
    b = _bench(fake, tmp_path, request_rate=20.0)
    assert b.errors == 0 and len(fake.completions) == 7
    assert time.monotonic() - began >= Workload(requests=6, request_rate=20.0).arrivals()[-1]
