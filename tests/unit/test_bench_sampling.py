"""Sampled replays: sessions found by content, stratified whole-session samples, the full replay predicted.

The prediction is checked against a simulated server (a prefix cache over whole messages; time = a fixed cost +
uncached tokens / a prefill rate + output tokens / a decode rate), whose full replay is the truth.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.bench.evaluator import RequestRecord, evaluate
from imageforge.bench.replay import ReplayOptions, replay_bench, replay_options
from imageforge.bench.replay_workload import ReplayRequest, ReplaySpec, generate, write_jsonl
from imageforge.bench.sampling import Pass, choose, cold_cache, predict, prediction_lines, sessions
from imageforge.errors import ConfigError


def words(text: str) -> int:
    return len(text.split())


def _tokens(messages: Sequence[dict[str, Any]]) -> int:
    return sum(words(str(m.get("content") or "")) + sum(words(c["function"]["arguments"])
                                                        for c in m.get("tool_calls") or []) for m in messages)


def _key(messages: Sequence[dict[str, Any]], tools: Any) -> str:
    return hashlib.sha256(json.dumps([list(messages), tools], sort_keys=True).encode()).hexdigest()


def simulate(requests: Sequence[ReplayRequest], order: Sequence[int],
             speed: Callable[[], float] = lambda: 1.0) -> list[RequestRecord]:
    """One record per sent request: a prefix cache of whole messages, times from a fixed cost model divided by
    ``speed()`` (the server's speed when the request runs)."""
    seen: set[str] = set()
    out = []
    for k, i in enumerate(order):
        body = requests[i].body
        messages, tools = body["messages"], body.get("tools")
        tool_tokens = words(json.dumps(tools)) if tools else 0
        prompt = _tokens(messages) + tool_tokens
        cached = next((_tokens(messages[:cut]) + tool_tokens for cut in range(len(messages), 0, -1)
                       if _key(messages[:cut], tools) in seen), 0)
        seen.update(_key(messages[:cut], tools) for cut in range(1, len(messages) + 1))
        completion = requests[i].planned_output or 1
        now = speed()
        ttft = (0.02 + (prompt - cached) / 4000) / now
        out.append(RequestRecord(k, 200, ttft_s=ttft, total_s=ttft + completion / 40 / now, prompt_tokens=prompt,
                                 completion_tokens=completion, cached_tokens=cached))
    return out


def one_pass(records: Sequence[RequestRecord]) -> Pass:
    return Pass(records, sum(r.total_s or 0 for r in records))


@pytest.fixture(scope="module")
def workload() -> list[ReplayRequest]:
    return generate(ReplaySpec(requests=300, max_model_len=4096, seed=11), words)


def test_sessions_are_found_by_content(workload: list[ReplayRequest]) -> None:
    found = sessions(workload)
    # the generator's own session numbers are the truth: every found session is exactly one of them
    truth: dict[int, list[int]] = {}
    for i, r in enumerate(workload):
        truth.setdefault(int((r.meta or {})["session"]), []).append(i)
    assert sorted(s.requests for s in found) == sorted(tuple(v) for v in truth.values())
    assert [s.index for s in found] == list(range(len(found)))
    assert all(s.stratum.count("/") == 3 for s in found)
    assert len({s.head for s in found}) <= 8  # 4 agent kinds, with and without tools


def test_a_sample_is_whole_sessions_stratified_and_seeded(workload: list[ReplayRequest]) -> None:
    found = sessions(workload)
    a, b, c = choose(found, 60, 1), choose(found, 60, 1), choose(found, 60, 2)
    assert a == b and a != c
    assert [s.index for s in a] == sorted(s.index for s in a)  # replayed in file order
    assert 45 <= sum(len(s.requests) for s in a) <= 80
    assert {s.stratum for s in a} == {s.stratum for s in found}  # every stratum is in the sample
    assert choose(found, 10_000, 0) == found


def test_the_prediction_holds_against_the_full_replay(workload: list[ReplayRequest]) -> None:
    population = sessions(workload)
    full = simulate(workload, range(len(workload)))
    truth_wall = sum(r.total_s or 0 for r in full)
    truth = evaluate(full, truth_wall).metrics
    hits, widths = 0, []
    for seed in range(20):
        chosen = choose(population, 80, seed)
        order = [i for s in chosen for i in s.requests]
        records = simulate(workload, order)
        p = predict(chosen, population, [one_pass(records)], time_cap=3600.0)
        w = p["weighted_tps"]
        hits += w["low"] <= truth["weighted_tps"] <= w["high"]
        widths.append((w["high"] - w["low"]) / 2 / truth["weighted_tps"])
        assert p["cut_by_time_cap"] is False and p["requests_sampled"] == len(order)
        assert p["platform_score"]["value"] == pytest.approx(w["value"] * 38.582)
    assert hits >= 17, f"{hits} of 20 intervals hold the full replay's weighted_tps"
    assert max(widths) < 0.25
    # the wall-time prediction is near the truth, and a cap below it is said to cut the replay
    chosen = choose(population, 80, 0)
    records = simulate(workload, [i for s in chosen for i in s.requests])
    p = predict(chosen, population, [one_pass(records)], time_cap=truth_wall / 2)
    assert p["wall_time_s"] == pytest.approx(truth_wall, rel=0.25) and p["cut_by_time_cap"] is True
    assert any("WOULD cut it" in line for line in prediction_lines(p))


def drifting(seed: int) -> Callable[[], float]:
    """A server whose speed wanders: log-speed an AR(1) process (correlation ~20 requests, 8 % spread) times a
    per-request jitter of 5 %, like a shared machine's."""
    rng = random.Random(seed)
    state = [0.0]

    def speed() -> float:
        state[0] = 0.95 * state[0] + rng.gauss(0.0, 0.08 * math.sqrt(1 - 0.95 ** 2))
        return math.exp(state[0] + rng.gauss(0.0, 0.05))
    return speed


def test_the_interval_carries_the_servers_drift_during_the_sampled_run(workload: list[ReplayRequest]) -> None:
    """On a drifting server the truth is the mean of full replays (an A/A among them); the interval still holds
    (the jackknife's groups ran at different moments of the drift)."""
    population = sessions(workload)
    fulls = []
    for run in range(5):
        records = simulate(workload, range(len(workload)), drifting(1000 + run))
        fulls.append(evaluate(records, sum(r.total_s or 0 for r in records)).metrics["weighted_tps"])
    truth = sum(fulls) / len(fulls)
    assert max(fulls) / min(fulls) > 1.02  # the A/A: full replays themselves differ
    hits, widths = 0, []
    for seed in range(20):
        chosen = choose(population, 80, seed)
        records = simulate(workload, [i for s in chosen for i in s.requests], drifting(seed))
        w = predict(chosen, population, [one_pass(records)])["weighted_tps"]
        hits += w["low"] <= truth <= w["high"]
        widths.append((w["high"] - w["low"]) / 2 / truth)
    assert hits >= 18, f"{hits} of 20 intervals hold the full replays' mean weighted_tps"
    assert max(widths) < 0.3


def test_passes_put_the_run_to_run_spread_into_the_interval(workload: list[ReplayRequest]) -> None:
    """A machine whose speed also has a level of its own per run (4 %, on top of the drift): one pass cannot see
    it and its interval misses the full replays' mean often; three passes, each at its own level, carry it."""
    population = sessions(workload)

    def machine(seed: int) -> Callable[[], float]:
        level = math.exp(random.Random(seed).gauss(0.0, 0.04))
        drift = drifting(seed + 7)
        return lambda: drift() * level

    fulls = []
    for run in range(5):
        records = simulate(workload, range(len(workload)), machine(1000 + run))
        fulls.append(evaluate(records, sum(r.total_s or 0 for r in records)).metrics["weighted_tps"])
    truth = sum(fulls) / len(fulls)
    held: dict[int, int] = {}
    for r in (1, 3):
        held[r], widths = 0, []
        for seed in range(20):
            chosen = choose(population, 80, seed)
            order = [i for s in chosen for i in s.requests]
            p = predict(chosen, population, [one_pass(simulate(workload, order, machine(seed * 10 + k)))
                                             for k in range(r)])
            w = p["weighted_tps"]
            held[r] += w["low"] <= truth <= w["high"]
            widths.append((w["high"] - w["low"]) / 2 / truth)
            assert p["passes"] == r and len(p["passes_weighted_tps"]) == r
            assert ("run-to-run spread of 3 passes" in p["interval_covers"]) == (r == 3)
        if r == 3:
            assert max(widths) < 0.6
    assert held[1] <= 15 and held[3] >= 18, held


def test_cold_cache_tags_the_first_message_text_only(workload: list[ReplayRequest]) -> None:
    tagged = cold_cache(workload[:3], "pass 2")
    for before, after in zip(workload[:3], tagged, strict=True):
        first = next(m for m in after.body["messages"] if m.get("role") == "system")
        assert str(first["content"]).startswith("[pass 2] ")
        assert after.body["messages"][1:] == before.body["messages"][1:] and after.meta == before.meta
    assert not str(workload[0].body["messages"][0]["content"]).startswith("[pass 2]")  # a copy, not the original
    parts = ReplayRequest({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert cold_cache([parts], "t")[0].body["messages"][0]["content"][0] == {"type": "text", "text": "[t]"}


def test_a_sample_of_one_session_is_refused(workload: list[ReplayRequest]) -> None:
    population = sessions(workload)
    one = [population[0]]
    with pytest.raises(ConfigError, match="at least 2 whole sessions"):
        predict(one, population, [Pass(simulate(workload, one[0].requests), 1.0)])


def test_the_shared_head_correction_moves_cold_heads_to_the_cached_term(workload: list[ReplayRequest]) -> None:
    population = sessions(workload)
    chosen = choose(population, 40, 3)
    records = simulate(workload, [i for s in chosen for i in s.requests])
    corrected = predict(chosen, population, [one_pass(records)])
    assert corrected["head_corrections"] >= 1
    truth = evaluate(simulate(workload, range(len(workload))), 1.0).metrics
    # uncached tokens per request are over-counted by a sample's cold heads unless corrected: the corrected
    # uncached_input_tpm is below the plain expansion of the sample's own rates
    plain = evaluate(records, sum(r.total_s or 0 for r in records)).metrics
    assert corrected["uncached_input_tpm"]["value"] < plain["uncached_input_tpm"]
    assert truth["total_cached_tokens"] > 0


def test_bench_replay_file_sample(tmp_path: Path) -> None:
    path = write_jsonl(generate(ReplaySpec(requests=60, max_model_len=2048, seed=2), words), tmp_path / "w.jsonl")
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 2048}]})
        body = json.loads(request.content)
        sent.append(body)
        prompt = _tokens(body["messages"])
        chunks = [{"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": body["max_tokens"]
                                            if "max_tokens" in body else body["max_completion_tokens"],
                                            "prompt_tokens_details": {"cached_tokens": prompt // 2}}}]
        content = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    options = replay_options(str(path), "", sample=20, seed=4)
    assert options is not None and options.sample == 20
    lines: list[str] = []
    result = replay_bench("http://127.0.0.1:9", options, tmp_path / "run", echo=lines.append,
                          transport=httpx.MockTransport(handler))
    assert result.prediction is not None and result.workload["sample"]["seed"] == 4
    assert len(sent) == result.prediction["requests_sampled"] < 60
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["report"]["prediction"]["weighted_tps"]["low"] <= data["report"]["prediction"]["weighted_tps"]["high"]
    assert any(line.startswith("PREDICTED full replay: weighted_tps") for line in result.lines())
    with pytest.raises(ConfigError, match="--sample N takes"):
        ReplayOptions(sample=5).validate()
    with pytest.raises(ConfigError, match="--passes R"):
        ReplayOptions(file=path, passes=2).validate()
    twice = replay_options(str(path), "", sample=20, seed=4, passes=2)
    assert twice is not None
    passes = replay_bench("http://127.0.0.1:9", twice, tmp_path / "run2", echo=lines.append,
                          transport=httpx.MockTransport(handler))
    assert passes.prediction is not None and passes.prediction["passes"] == 2
    assert len(sent) == 3 * result.prediction["requests_sampled"]  # the second run sent the sample twice
    tags = {json.dumps(b["messages"][0]["content"])[:40] for b in sent[-2 * result.prediction["requests_sampled"]:]}
    assert any("pass 1" in t for t in tags) and any("pass 2" in t for t in tags), tags
