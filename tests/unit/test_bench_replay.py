"""The replay workload, the JSONL loader and the one-at-a-time runner (runner: httpx.MockTransport, no sockets;
`bench --in-place --replay`'s own server: the fake vLLM of test_equiv_record, as a process).

The token counter in these tests is a fake (whitespace words); the real ones (``/tokenize``, ``tokenizer.json``)
are used by the cpu-server trial.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.bench.replay import (
    ReplayOptions,
    RetryPolicy,
    prepare_body,
    replay_bench,
    replay_options,
    replay_verdict,
    run_replay,
)
from imageforge.bench.replay_loading import dataset_format, load_jsonl
from imageforge.bench.replay_workload import META_KEY, ReplayRequest, ReplaySpec, generate, stats, write_jsonl
from imageforge.errors import ConfigError, SmokeError


def words(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- generator


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    spec = ReplaySpec(requests=60, max_model_len=2048, seed=7)
    a = write_jsonl(generate(spec, words), tmp_path / "a.jsonl").read_bytes()
    b = write_jsonl(generate(spec, words), tmp_path / "b.jsonl").read_bytes()
    c = write_jsonl(generate(ReplaySpec(requests=60, max_model_len=2048, seed=8), words),
                    tmp_path / "c.jsonl").read_bytes()
    assert a == b
    assert a != c
    assert a.count(b"\n") == 60


def test_shape_matches_the_evaluators() -> None:
    requests = generate(ReplaySpec(requests=881, max_model_len=2048, seed=0), words)
    s = stats(requests)
    assert s["requests"] == 881
    assert abs(s["with_tools"] / 881 - 0.78) < 0.02  # 690 of 881
    assert 20 <= s["several_system_messages"] <= 50  # 34 of 881
    assert abs(s["max_completion_tokens"] / 881 - 0.18) < 0.01  # 162 of 881
    assert 1 <= s["reasoning_effort"] <= 15  # "a few"
    assert 50 <= s["input_output_ratio"] <= 70  # ~60:1
    assert 0.55 <= s["designed_prefix_reuse"] <= 0.75  # ~65.6 % token-weighted
    assert 0.2 <= s["input_tokens_mean"] / 2048 <= 0.32  # 25.7K of 100K
    assert s["input_tokens_max"] + max(r.planned_output or 0 for r in requests) <= 0.85 * 2048


def test_lengths_are_the_counters_tokens_and_scale_with_max_model_len() -> None:
    small = generate(ReplaySpec(requests=40, max_model_len=2048), words)
    large = generate(ReplaySpec(requests=40, max_model_len=8192), words)
    assert stats(large)["input_tokens_mean"] > 3 * stats(small)["input_tokens_mean"]
    for r in small:
        meta = r.meta or {}
        content = [m["content"] for m in r.body["messages"] if isinstance(m.get("content"), str)]
        args = [c["function"]["arguments"] for m in r.body["messages"] for c in m.get("tool_calls") or []]
        tools = words(json.dumps(r.body["tools"], ensure_ascii=False)) if "tools" in r.body else 0
        # the planned count is exactly the counter's count of every text part
        assert meta["input_tokens"] == sum(words(t) for t in content + args) + tools


def test_later_turns_extend_earlier_ones() -> None:
    requests = generate(ReplaySpec(requests=120, max_model_len=2048, seed=3), words)
    extended = 0
    for prev, cur in itertools.pairwise(requests):
        if (cur.meta or {}).get("turn", 0) > 0:
            assert cur.meta is not None and prev.meta is not None
            assert cur.meta["session"] == prev.meta["session"]
            n = len(prev.body["messages"])
            assert cur.body["messages"][:n] == prev.body["messages"]
            assert cur.body.get("tools") == prev.body.get("tools")
            assert cur.meta["shared_tokens"] == prev.meta["input_tokens"]
            extended += 1
    assert extended > 20


def test_every_generated_line_loads(tmp_path: Path) -> None:
    requests = generate(ReplaySpec(requests=30, seed=1), words)
    loaded = load_jsonl(write_jsonl(requests, tmp_path / "w.jsonl"))
    assert [r.body for r in loaded] == [r.body for r in requests]
    assert [r.meta for r in loaded] == [r.meta for r in requests]
    assert loaded[4].source is not None and loaded[4].source.line == 5


def test_spec_is_checked() -> None:
    with pytest.raises(ConfigError, match="tools fraction"):
        ReplaySpec(tools_fraction=1.5).validate()
    with pytest.raises(ConfigError, match="max-model-len"):
        ReplaySpec(max_model_len=10).validate()


# --------------------------------------------------------------------------- loader


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loader_accepts_plain_chat_requests(tmp_path: Path) -> None:
    path = _write(tmp_path, [
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "",
        json.dumps({"model": "x", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                               {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                                               {"role": "tool", "tool_call_id": "1", "content": "r"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}], "max_completion_tokens": 8}),
    ])
    loaded = load_jsonl(path)
    assert len(loaded) == 2 and loaded[1].source is not None and loaded[1].source.line == 3
    assert loaded[0].meta is None


@pytest.mark.parametrize(("line", "where", "what"), [
    ("{not json", ":2:2", "not JSON"),
    ("[1, 2]", ":2", "not a replay request"),
    (json.dumps({"messages": []}), ":2", "non-empty list"),
    (json.dumps({"messages": [{"content": "x"}]}), "messages[0].role", "role"),
    (json.dumps({"messages": [{"role": "user"}]}), "messages[0].content", "missing content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), "max_tokens", "positive"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": ["f"]}), "tools", "tools must be"),
])
def test_loader_names_file_and_line(tmp_path: Path, line: str, where: str, what: str) -> None:
    path = _write(tmp_path, [json.dumps({"messages": [{"role": "user", "content": "ok"}]}), line])
    with pytest.raises(ConfigError) as info:
        load_jsonl(path)
    text = info.value.render()
    assert f"{path}:2" in text and where in text and what in text


def test_loader_reports_every_bad_line(tmp_path: Path) -> None:
    path = _write(tmp_path, ["{", json.dumps({"messages": [{"role": "user", "content": "ok"}]}), "[]"])
    with pytest.raises(ConfigError) as info:
        load_jsonl(path)
    text = info.value.render()
    assert "2 problems" in text and f"{path}:1" in text and f"{path}:3" in text


def test_loader_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="no request"):
        load_jsonl(_write(tmp_path, ["", "  "]))


# --------------------------------------------------------------------------- runner


def test_prepare_body() -> None:
    r = ReplayRequest({"model": "llm", "messages": [{"role": "user", "content": "x"}], "stream": False},
                      {"output_tokens": 9})
    body = prepare_body(r, "tiny", planned_output=True)
    assert body["model"] == "tiny" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9 and META_KEY not in body
    assert "max_tokens" not in prepare_body(r, "tiny", planned_output=False)
    limited = ReplayRequest({**r.body, "max_completion_tokens": 3}, r.meta)
    assert "max_tokens" not in prepare_body(limited, "tiny", planned_output=True)
    assert r.body["model"] == "llm"  # the request itself is not changed


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


SSE = {"content-type": "text/event-stream"}  # what vLLM sends; the shared client refuses a stream without it


def _server(sent: list[dict[str, Any]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 2048}]})
        body = json.loads(request.content)
        sent.append(body)
        i = len(sent)
        if i == 2:
            return httpx.Response(400, json={"message": "This model's maximum context length is 2048 tokens."})
        if i == 3:
            return httpx.Response(200, headers=SSE, content=_sse({"choices": [{"delta": {"content": "a"}}]},
                                                                 done=False))
        return httpx.Response(200, headers=SSE, content=_sse(
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"reasoning_content": "hm"}}]},
            {"choices": [{"delta": {"content": "ok"}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 64}}}))
    return httpx.MockTransport(handler)


NO_RETRIES = RetryPolicy(retries=0)


def test_runner_one_at_a_time_with_classes() -> None:
    requests = [ReplayRequest({"messages": [{"role": "user", "content": f"q{i}"}]}, {"output_tokens": 2,
                                                                                     "input_tokens": 90})
                for i in range(5)]
    sent: list[dict[str, Any]] = []
    run = run_replay(requests, "http://127.0.0.1:9", transport=_server(sent), max_requests=4)
    assert run.model == "tiny" and run.stopped_by == "request count"
    assert len(sent) == 4 and all(b["model"] == "tiny" and b["stream"] for b in sent)
    # the 400 is not retried; a 200 stream cut before its finish reason is a success, unfinished (the harness's)
    assert [r.error_class for r in run.records] == [None, "ctx_overflow", None, None]
    assert [r.finished for r in run.records] == [True, True, False, True]
    first = run.records[0]
    assert (first.prompt_tokens, first.completion_tokens, first.cached_tokens) == (100, 2, 64)
    assert first.ttft_s is not None and first.total_s is not None and 0 <= first.ttft_s <= first.total_s
    assert first.input_tokens_planned == 90 and first.attempts == 1
    m = run.report.metrics
    assert (m["attempted_requests"], m["successful_requests"], m["unfinished_requests"]) == (4, 3, 1)
    assert m["cache_hit_rate"] == pytest.approx(128 / 200)  # the unfinished one reported no usage
    assert m["cached_tokens_missing"] == 1
    assert run.to_json()["report"]["error_class_counts"] == {"ctx_overflow": 1}
    assert run.wall_s > 0


class FakeTime:
    """An injected clock and sleep: sleeping moves the clock, and so does each answer (``per_request``)."""

    def __init__(self, per_request: float = 0.0) -> None:
        self.now = 1000.0
        self.per_request = per_request
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _answers(statuses: list[int], sent: list[dict[str, Any]], fake: FakeTime) -> httpx.MockTransport:
    """Each chat request gets the next status (the last one repeats); a 200 is a finished stream."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        sent.append(json.loads(request.content))
        fake.now += fake.per_request
        status = statuses[min(len(sent), len(statuses)) - 1]
        if status != 200:
            return httpx.Response(status, json={"message": "busy"})
        return httpx.Response(200, headers=SSE, content=_sse(
            {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
                                      "prompt_tokens_details": {"cached_tokens": 0}}}))
    return httpx.MockTransport(handler)


def test_503_503_200_is_one_success_whose_time_holds_the_back_off() -> None:
    fake, sent = FakeTime(), list[dict[str, Any]]()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})], "http://127.0.0.1:9",
                     transport=_answers([503, 503, 200], sent, fake), clock=fake.clock, sleep=fake.sleep)
    [record] = run.records
    assert len(sent) == 3 and fake.slept == [5.0, 10.0]  # the harness's 5 s doubling back-off
    assert record.ok and record.attempts == 3 and record.retry_wait_s == 15.0
    assert record.total_s == pytest.approx(15.0) and record.ttft_s == pytest.approx(15.0)  # the clock ran on
    m = run.report.metrics
    assert (m["attempted_requests"], m["successful_requests"], m["retried_requests"]) == (1, 1, 1)
    assert run.wall_s == pytest.approx(15.0)  # back-off inside the wall time too


def test_retries_end_after_three_and_a_4xx_is_not_retried() -> None:
    fake, sent = FakeTime(), list[dict[str, Any]]()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})], "http://127.0.0.1:9",
                     transport=_answers([429], sent, fake), clock=fake.clock, sleep=fake.sleep)
    assert len(sent) == 4 and fake.slept == [5.0, 10.0, 20.0]
    assert run.records[0].error_class == "rate_limited" and run.records[0].attempts == 4
    fake, sent = FakeTime(), list[dict[str, Any]]()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})], "http://127.0.0.1:9",
                     transport=_answers([400], sent, fake), clock=fake.clock, sleep=fake.sleep)
    assert len(sent) == 1 and fake.slept == [] and run.records[0].error_class == "http_400"


def test_requests_not_started_by_the_time_cap_add_nothing() -> None:
    fake, sent = FakeTime(per_request=10.0), list[dict[str, Any]]()
    requests = [ReplayRequest({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(6)]
    run = run_replay(requests, "http://127.0.0.1:9", transport=_answers([200], sent, fake), time_cap=30.0,
                     clock=fake.clock, sleep=fake.sleep)
    # sent at 0, 10, 20 (each takes 10 s, the third ends right at the cap); at 30 the cap has passed: 3 never start
    assert len(sent) == 3 and run.stopped_by == "time cap" and run.not_started == 3
    m = run.report.metrics
    assert (m["attempted_requests"], m["not_started_requests"], m["total_requests"]) == (3, 3, 6)
    assert m["total_output_tokens"] == 3 and run.wall_s == pytest.approx(30.0)


def test_a_request_running_at_the_cap_is_dropped() -> None:
    fake, sent = FakeTime(per_request=10.0), list[dict[str, Any]]()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})] * 2, "http://127.0.0.1:9",
                     transport=_answers([200], sent, fake), time_cap=5.0, clock=fake.clock, sleep=fake.sleep)
    # the first answer ends at 10 s, after the 5 s cap: dropped, and the second never starts
    assert len(sent) == 1 and run.records == [] and run.not_started == 2 and run.stopped_by == "time cap"
    assert run.wall_s == 5.0


def test_a_back_off_past_the_cap_drops_the_request() -> None:
    fake, sent = FakeTime(), list[dict[str, Any]]()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})], "http://127.0.0.1:9",
                     transport=_answers([503, 200], sent, fake), time_cap=4.0, clock=fake.clock, sleep=fake.sleep)
    # the 503's retry would wait 5 s, past the 4 s cap: no sleep, the request is dropped
    assert len(sent) == 1 and fake.slept == [] and run.records == [] and run.not_started == 1


def test_a_stream_still_running_at_the_cap_is_cut_in_real_time() -> None:
    import time

    def slow_chunks() -> Any:
        yield b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
        time.sleep(0.5)  # the cap (0.2 s) passes between two chunks
        yield b'data: {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, headers=SSE, content=slow_chunks())

    started = time.perf_counter()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})] * 2, "http://127.0.0.1:9",
                     transport=httpx.MockTransport(handler), time_cap=0.2, policy=NO_RETRIES)
    assert run.records == [] and run.not_started == 2 and run.stopped_by == "time cap" and run.wall_s == 0.2
    assert time.perf_counter() - started < 2.0  # the second request was never sent


def test_runner_connection_refused() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        raise httpx.ConnectError("refused", request=request)

    fake = FakeTime()
    run = run_replay([ReplayRequest({"messages": [{"role": "user", "content": "q"}]})], "http://127.0.0.1:9",
                     transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep)
    assert run.records[0].error_class == "connection" and run.records[0].status is None
    assert run.records[0].attempts == 4  # a connection failure is retried, as the harness does


# --------------------------------------------------------------------------- invoke bench --replay


def test_replay_options_from_the_task() -> None:
    assert replay_options("", "") is None
    generated = replay_options(True, "w.jsonl", requests=8, seed=3, max_model_len=0)
    assert generated is not None and generated.file is None and generated.out == Path("w.jsonl")
    assert generated.max_model_len is None and (generated.requests, generated.seed) == (8, 3)
    mine = replay_options("mine.jsonl", "", max_model_len=4096)
    assert mine is not None and mine.file == Path("mine.jsonl") and mine.max_model_len == 4096
    with pytest.raises(ConfigError, match="--replay-out keeps a generated"):
        replay_options("", "w.jsonl")
    with pytest.raises(ConfigError, match="only keeps a generated workload"):
        replay_options("mine.jsonl", "w.jsonl")
    with pytest.raises(ConfigError, match="max-model-len must be >= 256"):
        replay_options(True, "", max_model_len=100)


def _matched(i: int, body: dict[str, Any] | str) -> str:
    """One line of the harness's matched-request JSONL (``log_replay_tool.py extract``)."""
    return json.dumps({"source_file": "oneapi-20260801000000.log", "line_no": 10 + i, "level": "INFO",
                       "timestamp": "2026/08/01 - 00:00:00", "request_id": f"req-{i}", "channel_id": None,
                       "token_name": "eval", "request_body": body if isinstance(body, str) else json.dumps(body),
                       "request_json": None, "raw_payload": {}})


def test_loader_reads_the_harness_matched_requests(tmp_path: Path) -> None:
    body = {"model": "llm", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    path = _write(tmp_path, [_matched(0, body), "", _matched(1, {**body, "max_completion_tokens": 9})])
    loaded = load_jsonl(path)
    assert [r.body for r in loaded] == [body, {**body, "max_completion_tokens": 9}]
    assert loaded[0].meta == {"request_id": "req-0", "format": "matched-request", "timestamp": "2026/08/01 - 00:00:00",
                              "source_file": "oneapi-20260801000000.log", "line_no": 10}
    assert dataset_format(loaded) == "matched-request" and loaded[1].source is not None
    assert loaded[1].source.line == 3
    assert dataset_format(load_jsonl(_write(tmp_path, [json.dumps(body)]))) == "chat-request"


@pytest.mark.parametrize(("lines", "where", "what"), [
    ([_matched(0, "{not json")], ":1", "request_body is not JSON"),
    ([_matched(0, {"messages": []})], "request_body.messages", "non-empty list"),
    ([json.dumps({"request_id": "r", "request_body": {"messages": []}})], "request_body", "JSON text (a string)"),
    ([json.dumps({"request_body": "{}"})], "request_id", "needs its request_id"),
    ([_matched(0, {"messages": [{"role": "user", "content": "x"}]}),
      json.dumps({"messages": [{"role": "user", "content": "x"}]})], ":2", "a chat-request line in a matched"),
    ([json.dumps({"prompt": "x"})], ":1", "not a replay request"),
])
def test_loader_errors_name_the_line_and_both_formats(tmp_path: Path, lines: list[str], where: str,
                                                      what: str) -> None:
    path = _write(tmp_path, lines)
    with pytest.raises(ConfigError) as info:
        load_jsonl(path)
    text = info.value.render()
    assert f"{path}:" in text and where in text and what in text


def test_an_unknown_line_says_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_jsonl(_write(tmp_path, [json.dumps({"input": "x", "output": "y"})]))
    text = info.value.render()
    assert ":1" in text and "request_body" in text and "messages" in text and "['input', 'output']" in text


def _tokenizing_server(sent: list[dict[str, Any]]) -> httpx.MockTransport:
    """/v1/models (max_model_len 2048), /tokenize (one token per word) and a streamed chat whose usage counts the
    prompt's words, every third request a 400."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 2048}]})
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": len(body["prompt"].split())})
        sent.append(body)
        if len(sent) % 3 == 0:
            return httpx.Response(400, json={"message": "top_p must be in (0, 1], got 1.1."})
        words = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
        out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)
        return httpx.Response(200, headers=SSE, content=_sse(
            {"choices": [{"delta": {"content": "x"}}]},
            {"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": out,
                                      "prompt_tokens_details": {"cached_tokens": words // 2}}}))
    return httpx.MockTransport(handler)


def test_replay_bench_generates_keeps_and_reports(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    lines: list[str] = []
    options = ReplayOptions(requests=6, seed=1, out=tmp_path / "kept.jsonl", max_error_rate=1.0)
    result = replay_bench("http://127.0.0.1:9", options, tmp_path / "run", echo=lines.append,
                          transport=_tokenizing_server(sent))
    kept = load_jsonl(tmp_path / "kept.jsonl")  # the generated workload is kept where asked
    assert len(kept) == len(sent) == 6 and result.workload["source"] == "generated"
    assert result.workload["spec"]["max_model_len"] == 2048  # scaled to the server's max-model-len
    assert [b["messages"] for b in sent] == [r.body["messages"] for r in kept]  # sent as kept, one at a time
    m = result.run.report.metrics
    assert (m["attempted_requests"], m["successful_requests"], m["error_class_counts"]["http_400"]) == (6, 4, 2)
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["kind"] == "replay" and data["concurrency"] == 1 and len(data["requests"]) == 6
    assert data["report"]["weighted_tps"] == pytest.approx(m["weighted_tps"]) and m["weighted_tps"] > 0
    assert (tmp_path / "run" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = "\n".join(result.lines())
    for needed in ("Output TPS p10 >= 20.00 tok/s", "TTFT p90 <= 5,000 ms", "success rate >= 99.00%: 66.67%",
                   "total time p99 <= 999,999 ms: ", "[competition]", "[harness]", "[organisers]",
                   "PLATFORM'S SCORE: weighted_tps", "platform_score (x 38.582)", "score shares: output"):
        assert needed in text
    assert "FAIL  success rate" in text and "FAIL  uptime >= 95.00%: 66.67%  [harness]" in text
    replay_verdict(result, options)  # max_error_rate 1.0, no gate: the failing lines are reported only
    with pytest.raises(SmokeError, match="2 of 6 replayed requests failed"):
        replay_verdict(result, ReplayOptions(max_error_rate=0.0))
    with pytest.raises(SmokeError, match="fails the organisers' targets"):
        replay_verdict(result, ReplayOptions(max_error_rate=1.0, require_targets=True))
    with pytest.raises(SmokeError, match="fails the evaluator harness's defaults"):
        replay_verdict(result, ReplayOptions(max_error_rate=1.0, gate=("harness",)))
    replay_verdict(result, ReplayOptions(max_error_rate=1.0, gate=("competition",)))  # p99 far below 999,999 ms


def test_replay_bench_a_users_file(tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q {i} a b"}],
                                        "max_tokens": 3}) + "\n" for i in range(4)))
    sent: list[dict[str, Any]] = []
    result = replay_bench("http://127.0.0.1:9", ReplayOptions(file=mine, requests=2, max_error_rate=1.0),
                          tmp_path / "run", echo=lambda _l: None, transport=_tokenizing_server(sent))
    assert [b["messages"][0]["content"] for b in sent] == ["q 0 a b", "q 1 a b"]  # --requests 2 of the file's 4
    assert result.workload == {"source": "file", "path": str(mine), "format": "chat-request",
                               "stats": result.workload["stats"]}
    assert not (tmp_path / "run" / "replay.jsonl").exists()
    assert result.run.records[0].prompt_tokens == 4 and result.run.records[0].completion_tokens == 3


def test_a_bad_replay_file_is_exit_2_before_any_server(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        replay_bench("http://127.0.0.1:9", ReplayOptions(file=tmp_path / "none.jsonl"), tmp_path / "run")


def test_invoke_bench_replay_flags(tmp_path: Path) -> None:
    import subprocess

    from tests.cli import imageforge

    def invoke(*args: str) -> subprocess.CompletedProcess[str]:
        return imageforge("bench", *args)

    missing = invoke("--url", "http://127.0.0.1:9", "--replay", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    lonely = invoke("--url", "http://127.0.0.1:9", "--replay-out", str(tmp_path / "w.jsonl"))
    assert lonely.returncode == 2 and "add --replay" in lonely.stderr
    # bare --replay (followed by another flag) means "generate"; nothing listens on port 9: exit 4
    bare = invoke("--replay", "--url", "http://127.0.0.1:9")
    assert bare.returncode == 4 and "no server answers at http://127.0.0.1:9" in bare.stderr


def test_replay_on_a_core_install_writes_its_json_and_says_there_is_no_png(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The card's box gets the core install (no `plots` extra): bench --replay still reports, without its PNG."""
    import importlib.util

    from imageforge.bench import plots
    from imageforge.bench.runner import replay_report

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert not plots.available()
    options = ReplayOptions(requests=3, seed=2, max_error_rate=1.0)
    lines: list[str] = []
    result = replay_bench("http://127.0.0.1:9", options, tmp_path / "run", echo=lines.append,
                          transport=_tokenizing_server([]))
    assert result.png_path is None and not (tmp_path / "run" / "bench.png").exists()
    assert json.loads((tmp_path / "run" / "bench.json").read_text())["kind"] == "replay"
    replay_report(result, options, lines.append)
    assert f"plot: {plots.NO_PLOTS}" in lines


# --------------------------------------------------------------------------- bench --in-place --replay


def test_bench_in_place_replay_starts_and_stops_its_own_server_in_place(
        tmp_path: Path, write_manifest: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench --in-place --replay` applies the target in place, starts its own server as a process, replays on
    it, stops it and leaves the root as before (the claim of tests/integration/test_inplace_serve.py's old bench
    test; its replay now runs there on the module's first server through `bench --url`). The server is the fake
    vLLM of test_equiv_record, a real process started and stopped by the ProcessRuntime; the replay's HTTP goes to a
    MockTransport at the replay's boundary."""
    import sys

    from imageforge import app
    from imageforge.bench import Workload, runner
    from imageforge.serve.process import ProcessRuntime, records, running_records

    from .test_equiv_record import fake_vllm_manifest

    manifest = fake_vllm_manifest(tmp_path, write_manifest)
    (tmp_path / "root").mkdir()
    where = ProcessRuntime(root=tmp_path / "root", python=sys.executable)
    sent: list[dict[str, Any]] = []
    up: list[tuple[str, list[dict[str, Any]]]] = []
    real = replay_bench  # the name bench.runner calls

    def replay(url: str, options: ReplayOptions, run_dir: Path, **kw: Any) -> Any:
        up.append((url, running_records(manifest.parent)))  # what is serving while the replay runs
        return real(url, options, run_dir, transport=_tokenizing_server(sent), **kw)

    monkeypatch.setattr(runner, "replay_bench", replay)
    lines: list[str] = []
    options = ReplayOptions(requests=2, seed=5)
    result = app.bench(app.settings(manifest=str(manifest)), "p", None, [], url=None, port=None,
                       workload=Workload(), echo=lines.append, replay=options, runtime=where)
    text = "\n".join(lines)
    assert f"in place on {tmp_path / 'root'}: 1 server start(s), one at a time" in text
    [(url, serving)] = up  # one server, up during the replay, and the replay went to it
    [server] = serving
    assert url == server["url"] and server["target"] == "p" and url.startswith("http://127.0.0.1:")
    assert f"started pid {server['pid']}" in text and f"stopped pid {server['pid']}" in text
    assert running_records(manifest.parent) == []  # stopped
    assert all(data.get("stopped") for _, data in records(manifest.parent))
    assert len(sent) == 2 and "PASS  success rate >= 99.00%: 100.00%  [organisers]" in text
    for line in ("TTFT p90", "Output TPS p10", "PLATFORM'S SCORE"):
        assert line in text
    report = json.loads(result.json_path.read_text())
    assert report["kind"] == "replay" and len(report["requests"]) == 2
    assert result.json_path.parent.parent == manifest.parent / ".imageforge" / "runs"
    assert where.applied_state() is None  # the root as before: nothing applied


# --------------------------------------------------------------------------- the target's replay: block


def test_the_targets_replay_settings_give_the_cap_and_the_gate(bi100: Any, cpu: Any,
                                                               write_manifest: Callable[[str], Path]) -> None:
    from imageforge.bench.runner import with_target
    from imageforge.errors import ConfigError as Err
    from imageforge.manifest.load import load_manifest

    from .conftest import manifest_text

    assert bi100.target.replay.time_cap == 13 * 3600 and bi100.target.replay.gate == ("competition",)
    assert cpu.target.replay.time_cap is None and cpu.target.replay.gate == ()
    options = ReplayOptions(duration=300.0)
    on_bi100 = with_target(options, bi100.target.replay)
    assert (on_bi100.cap, on_bi100.gate) == (46800.0, ("competition",))
    assert with_target(ReplayOptions(time_cap=60.0), bi100.target.replay).cap == 60.0  # --time-cap wins
    assert with_target(options, cpu.target.replay).cap == 300.0  # no cap of its own: --duration
    with pytest.raises(Err) as info:
        load_manifest(write_manifest(manifest_text("    replay: {time_cap: 0, gate: [organisers]}\n")))
    text = info.value.render()
    assert "replay.time_cap" in text and "replay.gate" in text


def test_time_cap_from_the_command() -> None:
    options = replay_options(True, "", time_cap=120.0)
    assert options is not None and options.time_cap == 120.0 and options.cap == 120.0
    unset = replay_options(True, "", time_cap=0, duration=300.0)
    assert unset is not None and unset.time_cap is None and unset.cap == 300.0
    with pytest.raises(ConfigError, match="time cap"):
        ReplayOptions(time_cap=-1.0).validate()


def test_bench_url_replay_with_a_target_takes_its_replay_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench --url U --replay --target bi100` (the card job): bi100's time cap and gate, nothing built."""
    from imageforge import app
    from imageforge.bench import Workload, replay

    from .conftest import REPO

    seen: list[ReplayOptions] = []

    class Seen(Exception):
        pass

    def fake(url: str, options: ReplayOptions, run_dir: Path, **_kw: Any) -> Any:
        seen.append(options)
        raise Seen

    monkeypatch.setattr(replay, "replay_bench", fake)
    settings = app.settings(manifest=str(REPO / "build.yaml"))
    with pytest.raises(Seen):
        app.bench(settings, "bi100", None, [], url="http://127.0.0.1:9", port=None, workload=Workload(),
                  replay=ReplayOptions(duration=300.0), echo=lambda _l: None)
    assert (seen[0].cap, seen[0].gate) == (46800.0, ("competition",))
    with pytest.raises(ConfigError, match="do not apply"):
        app.bench(settings, "bi100", None, [], url="http://127.0.0.1:9", port=None, workload=Workload(),
                  replay=None, echo=lambda _l: None)
