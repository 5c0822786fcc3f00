"""The smoke runner without a server: suite loading, expressions, expectations, reports.

HTTP goes through httpx.MockTransport (no sockets), so whole suites run in milliseconds.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.errors import ConfigError, SmokeError
from imageforge.smoke import (
    Expr,
    ExprError,
    LiveTable,
    SmokeReport,
    assemble_stream,
    comparable_choices,
    compare,
    interesting_lines,
    load_suite,
    metric_value,
    parse_metrics,
    parse_sse,
    parse_tags,
    render,
    run_suite,
    summary_line,
    template_parts,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:9"  # never contacted: every test passes a MockTransport

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def suite_file(tmp_path: Path) -> Callable[..., Path]:
    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    return info.value


# ============================================================================ suite files


def test_unknown_key_names_file_line_and_suggestion(suite_file: Callable[..., Path]) -> None:
    path = suite_file("""\
        version: 1
        checks:
          - id: health
            request: {endpoint: /health}
            expect:
              staus: 200
        """)
    err = config_error(path)
    text = err.render()
    assert f"{path}:6:" in text
    assert "checks[0].expect.staus" in text
    assert "did you mean 'status'?" in text


def test_invalid_yaml_names_the_line(suite_file: Callable[..., Path]) -> None:
    path = suite_file("version: 1\nchecks:\n  - id: x\n    request: {endpoint: /health\n")
    err = config_error(path)
    assert "invalid YAML" in err.message
    assert err.location is not None and err.location.file == str(path) and err.location.line is not None
    assert err.location.line >= 4


def test_several_problems_are_reported_together(suite_file: Callable[..., Path]) -> None:
    path = suite_file("""\
        version: 1
        checks:
          - id: a
            request: {endpoint: /v1/x, body: {n: "${1 +}"}}
            expect:
              relations: ["usage.x <="]
              json:
                - {path: "$.[[", equals: 1}
              regex:
                - {pattern: "(unclosed"}
          - id: a
            request: {endpoint: /health}
            expect: {schema: nope}
        """)
    err = config_error(path)
    text = err.render()
    assert "problems" in err.message
    for fragment in ("invalid ${...} template", "invalid expression", "invalid JSONPath", "invalid regular expression",
                     "duplicate check id 'a'", "unknown schema name 'nope'"):
        assert fragment in text, fragment
    assert f"{path}:4:" in text and f"{path}:6:" in text and f"{path}:11:" in text


def test_semantic_rules(suite_file: Callable[..., Path]) -> None:
    path = suite_file("""\
        version: 1
        checks:
          - id: m
            request: {endpoint: /v1/completions, body: {}}
            expect:
              metrics: [{name: "vllm:x_total", delta: 1}]
          - id: s
            request: {endpoint: /v1/completions, body: {}}
            expect: {stream_equals_non_stream: true, chunk_schema: {type: object}}
          - id: j
            request: {endpoint: /x}
            expect:
              json: [{path: $.a, equals: 1, gt: 0}]
          - id: bad-schema
            request: {endpoint: /x}
            expect: {schema: {type: 12}}
          - id: both-bodies
            request: {endpoint: /x, body: {}, raw_body: "{"}
            expect: {status: 400}
        """)
    text = config_error(path).render()
    assert "metrics expectations need serial: true" in text
    assert "stream_equals_non_stream needs request.stream: true" in text
    assert "chunk_schema needs request.stream: true" in text
    assert "exactly one comparison" in text
    assert "not a valid JSON Schema" in text
    assert "checks[4].request.raw_body: a request has either body or raw_body" in text


def test_include_cycle_and_missing_include(suite_file: Callable[..., Path]) -> None:
    suite_file("version: 1\ninclude: [b.yaml]\nchecks: []\n", "a.yaml")
    b = suite_file("version: 1\ninclude: [a.yaml]\nchecks: []\n", "b.yaml")
    assert "cycle" in config_error(b).message
    c = suite_file("version: 1\ninclude: [missing.yaml]\nchecks: []\n", "c.yaml")
    assert "included suite does not exist" in config_error(c).render()


def test_include_merges_checks_vars_schemas_and_setup(suite_file: Callable[..., Path]) -> None:
    suite_file("""\
        version: 1
        vars: {a: 1}
        schemas: {thing: {type: object}}
        setup:
          - {id: models, request: {endpoint: /v1/models}, bind: {model: "$.data[0].id"}}
        checks:
          - {id: one, request: {endpoint: /x}, expect: {schema: thing}}
        """, "base.yaml")
    top = suite_file("""\
        version: 1
        include: [base.yaml]
        defaults: {tags: [real-weights]}
        vars: {b: "${a + 1}"}
        checks:
          - {id: two, request: {endpoint: /y}, expect: {schema: thing}}
        """, "top.yaml")
    suite = load_suite(top)
    assert [c.id for c in suite.checks] == ["one", "two"]
    assert [c.tags for c in suite.checks] == [("dummy-ok",), ("real-weights",)]
    assert dict(suite.vars) == {"a": 1, "b": "${a + 1}"}
    assert [s.id for s in suite.setup] == ["models"]
    assert [c.id for c in suite.select(["real-weights"])] == ["two"]
    assert [c.id for c in suite.select(["dummy-ok", "real-weights"])] == ["one", "two"]


def test_shipped_suites_load_and_have_enough_checks() -> None:
    dummy = load_suite(REPO / "smoke" / "dummy.yaml")
    selected = dummy.select(["dummy-ok"])
    assert len(selected) >= 30
    assert len({c.id for c in dummy.checks}) == len(dummy.checks)
    assert any(c.serial for c in selected) and any(not c.serial for c in selected)
    real = load_suite(REPO / "smoke" / "real-weights.yaml")
    assert len(real.select(["real-weights"])) >= 6
    assert len(real.select(["dummy-ok"])) == len(selected)  # included


def test_manifest_points_at_the_suites() -> None:
    from imageforge.manifest.load import load_manifest

    m = load_manifest(REPO / "build.yaml")
    assert m.targets["cpu"].smoke.suite == (REPO / "smoke" / "dummy.yaml").resolve()
    assert m.targets["bi100"].smoke.suite == (REPO / "smoke" / "real-weights.yaml").resolve()
    assert "real-weights" in m.targets["bi100"].smoke.tags


# ============================================================================ expressions


def ns(**kw: Any) -> dict[str, Any]:
    return kw


def test_relation_reads_response_fields_and_request_fields() -> None:
    body = {"usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}}
    names = {"request": {"max_tokens": 7}, **body}
    assert Expr.parse("usage.total_tokens == usage.prompt_tokens + usage.completion_tokens").evaluate(names) is True
    assert Expr.parse("usage.completion_tokens <= request.max_tokens").evaluate(names) is True
    expr = Expr.parse("usage.completion_tokens < request.max_tokens")
    assert expr.evaluate(names) is False
    assert expr.explain(names) == "7 < 7 is false"


def test_expression_language_features() -> None:
    names = {"chunks": [{"choices": [{"finish_reason": None}]}, {"choices": [{"finish_reason": "stop"}]},
                        {"choices": [], "usage": {"total_tokens": 4}}],
             "ids": [3, 4], "text": "abc"}
    assert Expr.parse("len([c for c in chunks if c.choices and c.choices[0].finish_reason]) == 1").evaluate(names)
    assert Expr.parse("chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 4").evaluate(names)
    assert Expr.parse("{str(i): -100 for i in ids}").evaluate(names) == {"3": -100, "4": -100}
    assert Expr.parse("text[:2] == 'ab' and fullmatch('[a-c]+', text)").evaluate(names)
    assert Expr.parse("get(chunks[0], 'usage') is None").evaluate(names)
    assert Expr.parse("valid(json('{\"a\": 1}'), {'type': 'object', 'required': ['a']})").evaluate(names)
    assert Expr.parse("sum(x * 2 for x in ids) if true else 0").evaluate(names) == 14
    assert Expr.parse("[1] * 3 + [2]").evaluate(names) == [1, 1, 1, 2]


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os')", "unknown function"),
    ("x.__class__", "may not start with '_'"),
    ("text.upper()", "unknown function"),
    ("lambda: 1", "Lambda is not allowed"),
    ("(x := 1)", "NamedExpr is not allowed"),
    ("2 ** 10", "Pow is not allowed"),
    ("len(x, key=1)", "keyword arguments"),
    ("a +", "syntax error"),
])
def test_unsafe_or_broken_expressions_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ExprError, match=None) as info:
        Expr.parse(text)
    assert fragment in str(info.value)


def test_evaluation_errors_are_readable() -> None:
    names = {"usage": {"prompt_tokens": 1}, "items": [1]}
    with pytest.raises(ExprError, match="usage has no field 'completion_tokens'"):
        Expr.parse("usage.completion_tokens").evaluate(names)
    with pytest.raises(ExprError, match="unknown name 'nothing'"):
        Expr.parse("nothing + 1").evaluate(names)
    with pytest.raises(ExprError, match="IndexError"):
        Expr.parse("items[5]").evaluate(names)
    with pytest.raises(ExprError, match="longer than"):
        Expr.parse("[1] * 10000000").evaluate(names)


def test_templates_keep_types_and_interpolate() -> None:
    names = {"model": "m", "n": 2048, "ids": [1, 2]}
    assert render("${n - 1}", names) == 2047
    assert render("${[7] * 3}", names) == [7, 7, 7]
    assert render({"model": "${model}", "msg": "len ${n} of ${model}", "keep": 5}, names) == {
        "model": "m", "msg": "len 2048 of m", "keep": 5}
    assert render("${ {str(i): -100 for i in ids} }", names) == {"1": -100, "2": -100}
    assert render("costs $${dollars}", names) == "costs ${dollars}"
    assert template_parts("a ${'}'} b")[1] == Expr.parse("'}'")
    with pytest.raises(ExprError, match="unclosed"):
        template_parts("x ${n + 1")


# ============================================================================ comparisons, streams, metrics


@pytest.mark.parametrize("op, value, want, ok", [
    ("equals", [0, 1, 2], [0, 1, 2], True),
    ("equals", "a", "b", False),
    ("not_equals", 1, 2, True),
    ("one_of", "beta", ["alpha", "beta"], True),
    ("contains", ["a", "m"], "m", True),
    ("contains", 5, "m", False),
    ("not_contains", "abc", "z", True),
    ("matches", "code abc-12 x", r"[a-z]{3}-\d\d", True),
    ("full_match", "abc-12 x", r"[a-z]{3}-\d\d", False),
    ("ge", 5, 5, True),
    ("lt", 5, 5, False),
    ("type", 3, "number", True),
    ("type", True, "integer", False),
    ("length", [1, 2], 2, True),
    ("min_length", "", 1, False),
    ("valid", {"a": 1}, {"type": "object", "required": ["a"]}, True),
    ("parses_as", '{"city": "x"}', {"type": "object", "required": ["city"]}, True),
    ("parses_as", '{"city": ', {"type": "object"}, False),
])
def test_compare(op: str, value: Any, want: Any, ok: bool) -> None:
    assert (compare(op, value, want) is None) is ok


SSE_CHAT = "".join(f"data: {json.dumps(c)}\n\n" for c in [
    {"id": "c1", "object": "chat.completion.chunk", "model": "m",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk", "model": "m",
     "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk", "model": "m",
     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                                                          "function": {"name": "get_weather"}}]},
                  "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk", "model": "m",
     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\""}}]},
                  "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk", "model": "m",
     "choices": [{"index": 0, "delta": {"content": "lo", "tool_calls": [{"index": 0, "function": {
         "arguments": ": \"Rome\"}"}}]}, "finish_reason": "stop"}]},
    {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
     "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}},
]) + "data: [DONE]\n\n"


def test_stream_assembles_like_a_non_stream_answer() -> None:
    chunks, done, problems = parse_sse(SSE_CHAT)
    assert done and not problems and len(chunks) == 6
    answer = assemble_stream(chunks, done)
    message = answer["choices"][0]["message"]
    assert message["content"] == "Hello" and message["role"] == "assistant"
    assert message["tool_calls"] == [{"id": "t1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]
    assert answer["usage"]["total_tokens"] == 6 and answer["finish_reason_chunks"] == 1
    plain: dict[str, Any] = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "Hello", "reasoning": None,
        "tool_calls": [{"id": "x", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]}}]}
    assert comparable_choices(answer) == comparable_choices(plain)
    plain["choices"][0]["message"]["content"] = "Hellp"
    assert comparable_choices(answer) != comparable_choices(plain)


def test_sse_problems_are_reported() -> None:
    chunks, done, problems = parse_sse("data: {\"a\": 1}\n\ndata: not json\n\ndata: [DONE]\n\ndata: {}\n\n")
    assert done and len(chunks) == 2
    assert any("not JSON" in p for p in problems) and "data after [DONE]" in problems


def test_metrics_parse_and_sum_by_labels() -> None:
    text = textwrap.dedent("""\
        # HELP vllm:request_success_total Count
        # TYPE vllm:request_success_total counter
        vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
        vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0
        vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e+09
        vllm:prompt_tokens_total{engine="0",model_name="m"} 600.0
        """)
    rows = parse_metrics(text)
    assert metric_value(rows, "vllm:request_success_total") == 5.0
    assert metric_value(rows, "vllm:request_success_total", {"finished_reason": "length"}) == 3.0
    assert metric_value(rows, "vllm:prompt_tokens_total") == 600.0
    assert metric_value(rows, "vllm:nothing_total") is None


def test_log_tail_drops_access_lines() -> None:
    lines = ["Traceback (most recent call last):", 'INFO:     172.17.0.1:3500 - "GET /health HTTP/1.1" 200 OK',
             "RuntimeError: boom"]
    assert interesting_lines(lines) == ["Traceback (most recent call last):", "RuntimeError: boom"]


def test_summary_line_and_tags() -> None:
    assert summary_line(3, 0) == "3 passed, 0 failed"
    assert summary_line(3, 1, 2) == "3 passed, 1 failed, 2 skipped"
    assert parse_tags("dummy-ok, real-weights,") == ("dummy-ok", "real-weights")
    assert parse_tags("") is None


# ============================================================================ the runner on a mock server


class FakeServer:
    """A tiny OpenAI-ish server behind httpx.MockTransport, with counters in /metrics."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generated = 0
        self.healthy = True
        self.requests: list[tuple[str, str, Any]] = []
        self.delay = 0.0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        with self.lock:
            self.requests.append((request.method, request.url.path, body))
        path = request.url.path
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny", "max_model_len": 64}]})
        if path == "/metrics":
            return httpx.Response(200, text=f'vllm:prompt_tokens_total{{model_name="tiny"}} {self.prompt_tokens}\n'
                                            f'vllm:generation_tokens_total{{model_name="tiny"}} {self.generated}\n')
        if path == "/v1/completions":
            if self.delay:
                time.sleep(self.delay)
            assert isinstance(body, dict)
            prompt = body["prompt"]
            n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
            if n_prompt > 64:
                return httpx.Response(400, json={"error": {"message": "maximum context length is 64"}})
            n = int(body.get("max_tokens", 4))
            with self.lock:
                self.prompt_tokens += n_prompt
                self.generated += n
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
            if body.get("stream"):
                chunks = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]} for _ in range(n - 1)]
                chunks.append({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})
                text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
            return httpx.Response(200, json={"object": "text_completion", "model": "tiny", "usage": usage,
                                             "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}]})
        return httpx.Response(404, json={"error": {"message": f"no route {path}"}})


SUITE = """\
version: 1
name: mock
vars:
  max_len: "${server_max}"
setup:
  - id: models
    request: {endpoint: /v1/models}
    bind: {model: "$.data[0].id", server_max: "$.data[0].max_model_len"}
checks:
  - id: health
    request: {endpoint: /health}
    expect: {status: 200}
  - id: lengths
    request:
      endpoint: /v1/completions
      body: {model: "${model}", prompt: "a b c", max_tokens: 5}
    expect:
      json:
        - {path: $.model, equals: "${model}"}
        - {path: "$.choices[*].index", equals: 0}
      relations:
        - usage.completion_tokens == request.max_tokens
        - usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
  - id: too-long
    request:
      endpoint: /v1/completions
      body: {model: "${model}", prompt: "${[1] * (max_len + 1)}", max_tokens: 1}
    expect:
      status: 400
      json: [{path: $.error.message, matches: "context length"}]
  - id: metrics
    serial: true
    request:
      endpoint: /v1/completions
      body: {model: "${model}", prompt: "one two", max_tokens: 3}
      repeat: 3
      concurrency: 3
    expect:
      metrics:
        - {name: "vllm:prompt_tokens_total", delta: "sum(r.usage.prompt_tokens for r in responses)"}
        - {name: "vllm:generation_tokens_total", min_delta: 9}
  - id: stream
    request:
      endpoint: /v1/completions
      body: {model: "${model}", prompt: "s", max_tokens: 4}
      stream: true
    expect:
      stream_equals_non_stream: true
      relations: [done, "finish_reason_chunks == 1", "len(chunks) == 4"]
  - id: later
    skip: not today
    request: {endpoint: /health}
    expect: {status: 200}
  - id: real-only
    tags: [real-weights]
    request: {endpoint: /health}
    expect: {status: 500}
"""


def run_mock(tmp_path: Path, server: Handler, suite_text: str = SUITE, **kw: Any) -> tuple[SmokeReport, list[str]]:
    path = tmp_path / "mock.yaml"
    path.write_text(suite_text)
    lines: list[str] = []
    report = run_suite(load_suite(path), URL, tags=("dummy-ok",), run_dir=tmp_path / "run", echo=lines.append,
                       live=False, transport=httpx.MockTransport(server), **kw)
    return report, lines


def test_suite_passes_on_a_good_server(tmp_path: Path) -> None:
    server = FakeServer()
    report, lines = run_mock(tmp_path, server)
    assert [r.status for r in report.results] == ["passed"] * 5 + ["skipped"]
    assert "5 passed, 0 failed, 1 skipped" in lines
    # serial checks ran before the others, the setup before everything
    paths = [p for _, p, _ in server.requests]
    assert paths[0] == "/health" and paths[1] == "/v1/models"
    bodies = [b for _, p, b in server.requests if p == "/v1/completions" and b and b.get("prompt") == "one two"]
    assert len(bodies) == 3
    assert all(b["model"] == "tiny" for _, p, b in server.requests if p == "/v1/completions")


def test_reports_are_written_and_junit_parses(tmp_path: Path) -> None:
    from junitparser import JUnitXml

    report, _ = run_mock(tmp_path, FakeServer())
    assert report.json_path is not None and report.junit_path is not None
    data = json.loads(report.json_path.read_text())
    assert data["summary"] == "5 passed, 0 failed, 1 skipped" and data["ok"] is True
    # every check of the suite is listed: the one the tags left out as skipped, saying why
    assert {c["id"] for c in data["checks"]} == {"health", "lengths", "too-long", "metrics", "stream", "later",
                                               "real-only"}
    left_out = next(c for c in data["checks"] if c["id"] == "real-only")
    assert left_out["status"] == "skipped" and data["not_selected"] == 1
    assert left_out["why"] == "not selected: tagged real-weights, the run selected dummy-ok"
    xml = JUnitXml.fromfile(str(report.junit_path))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert suite.tests == 6 and suite.failures == 0 and suite.skipped == 1
    verdict(report)  # no exception: all passed


class BrokenServer(FakeServer):
    """Generates one token too many, never counts prompt tokens, and streams a different text."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        response = super().__call__(request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text='vllm:prompt_tokens_total{model_name="tiny"} 0\n'
                                            f'vllm:generation_tokens_total{{model_name="tiny"}} {self.generated}\n')
        if request.url.path == "/v1/completions" and response.status_code == 200:
            if response.headers.get("content-type") == "text/event-stream":
                return httpx.Response(200, text=response.text.replace('"x"', '"y"', 1),
                                      headers={"content-type": "text/event-stream"})
            data = response.json()
            data["usage"]["completion_tokens"] += 1
            return httpx.Response(200, json=data)
        return response


def test_failures_show_request_response_and_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("imageforge.smoke.runner.METRICS_SETTLE", 0.3)  # counters that never catch up
    report, lines = run_mock(tmp_path, BrokenServer(), hooks=None)
    by_id = {r.check.id: r for r in report.results}
    assert by_id["lengths"].status == "failed"
    assert any("usage.completion_tokens == request.max_tokens` does not hold: 6 == 5 is false" in f
               for f in by_id["lengths"].failures)
    assert any("vllm:prompt_tokens_total grew by 0, expected exactly 6" in f for f in by_id["metrics"].failures)
    assert any("stream != non-stream" in f for f in by_id["stream"].failures)
    text = "\n".join(lines)
    assert "request:  POST http://127.0.0.1:9/v1/completions" in text
    assert '"prompt": "a b c"' in text and "response: HTTP 200" in text
    assert lines[-2] == "2 passed, 3 failed, 1 skipped"
    with pytest.raises(SmokeError) as info:
        verdict(report)
    assert info.value.exit_code == 4
    assert "lengths" in info.value.message


def test_server_gone_mid_suite_fails_the_rest_fast(tmp_path: Path) -> None:
    server = FakeServer()
    state = {"calls": 0}

    def dying(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            state["calls"] += 1
            if state["calls"] > 1:
                raise httpx.ConnectError("connection refused")
        if request.url.path == "/health" and state["calls"] > 1:
            raise httpx.ConnectError("connection refused")
        return server(request)

    text = SUITE.replace("    concurrency: 3\n", "    concurrency: 1\n")
    report, lines = run_mock(tmp_path, dying, suite_text=text,
                             hooks=None)
    assert report.server_problem is not None and "connection refused" in report.server_problem
    statuses = {r.check.id: r.status for r in report.results}
    assert statuses["metrics"] == "failed" and statuses["health"] == "failed"
    assert any("the server is down" in f or "not run" in f
               for r in report.results for f in r.failures)
    assert "the server went away during the suite" in "\n".join(lines)


def test_check_timeout_is_reported(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            raise httpx.ReadTimeout("read timed out", request=request)
        return FakeServer()(request)

    suite = """\
    version: 1
    checks:
      - id: slow
        request: {endpoint: /v1/completions, body: {prompt: "a", max_tokens: 2}, timeout: 0.5}
        expect: {status: 200}
    """
    report, _ = run_mock(tmp_path, slow, suite_text=textwrap.dedent(suite))
    result = report.results[0]
    assert result.status == "failed"
    assert "timed out after" in result.failures[0] and "timeout is 0.5s" in result.failures[0]
    assert report.server_problem is None  # a timeout alone does not declare the server dead


def test_a_timeout_may_be_a_template(tmp_path: Path, suite_file: Callable[..., Path]) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            time.sleep(0.4)
        return FakeServer()(request)

    suite = """\
    version: 1
    params:
      wait_s: {default: 5, description: seconds, schema: {type: number, exclusiveMinimum: 0}}
    vars:
      word: soon
    checks:
      - id: patient
        request: {endpoint: /v1/completions, body: {prompt: "a", max_tokens: 2}, timeout: "${wait_s}"}
        expect: {status: 200}
      - id: not_a_number
        request: {endpoint: /v1/completions, body: {prompt: "a", max_tokens: 2}, timeout: "${word}"}
        expect: {status: 200}
    """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    report, _ = run_mock(tmp_path / "a", slow, suite_text=textwrap.dedent(suite))
    patient, not_a_number = report.results
    assert patient.status == "passed", patient.failures
    assert not_a_number.status == "failed" and "timeout ${word} gave 'soon'" in not_a_number.failures[0]
    report, _ = run_mock(tmp_path / "b", slow, suite_text=textwrap.dedent(suite), params=["wait_s=0.1"])
    assert "timeout is 0.1s" in report.results[0].failures[0]
    # a text that is not one template is refused at load, as a timeout <= 0 is
    err = config_error(suite_file("""\
        version: 1
        checks:
          - id: a
            request: {endpoint: /health, timeout: "soon"}
            expect: {status: 200}
        """))
    assert "timeout" in str(err)


def test_setup_failure_explains_unrendered_requests(tmp_path: Path) -> None:
    def no_models(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(500, text="Internal Server Error")
        return FakeServer()(request)

    report, lines = run_mock(tmp_path, no_models)
    lengths = next(r for r in report.results if r.check.id == "lengths")
    assert lengths.status == "failed"
    assert "unknown name 'model'" in lengths.failures[0]
    assert "setup models (GET /v1/models) failed: HTTP 500" in lengths.failures[0]
    assert any("warning: setup models" in line for line in lines)


def test_provided_vars_win_over_setup(tmp_path: Path) -> None:
    server = FakeServer()
    report, _ = run_mock(tmp_path, server, vars={"model": "from-manifest"})
    lengths = next(r for r in report.results if r.check.id == "lengths")
    assert lengths.status == "failed"  # the fake server answers model "tiny"
    assert any("'tiny' != 'from-manifest'" in f for f in lengths.failures)


def test_unreachable_url_is_a_smoke_error(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with pytest.raises(SmokeError, match="no server answers at"):
        run_mock(tmp_path, refuse)


def test_live_table_plain_lines() -> None:
    from imageforge.errors import Location
    from imageforge.smoke import Check, CheckResult, Expectations, Request

    check = Check("c1", Request("/health"), Expectations(), ("dummy-ok",), Location("s.yaml", 3))
    lines: list[str] = []
    with LiveTable([check], echo=lines.append, live=False) as table:
        table.running(check)
        result = CheckResult(check, status="failed", latency=0.012, failures=["status 500, expected 200"])
        table.done(result)
    assert lines and lines[0].split()[:2] == ["FAIL", "c1"] and "12 ms" in lines[0] and "status 500" in lines[0]


def test_live_table_fits_the_terminal_then_prints_everything() -> None:
    import io

    from rich.console import Console

    from imageforge.errors import Location
    from imageforge.smoke import Check, CheckResult, Expectations, Request

    checks = [Check(f"check-{i:02d}", Request("/health"), Expectations(), ("dummy-ok",), Location("s.yaml", i + 1))
              for i in range(40)]
    out = io.StringIO()
    console = Console(file=out, height=20, width=100, force_terminal=True)
    with LiveTable(checks, echo=lambda _l: None, console=console, live=True) as table:
        for check in checks[:30]:
            table.done(CheckResult(check, status="passed", latency=0.01))
        table.done(CheckResult(checks[3], status="failed", failures=["boom"]))
        window = table.render()
        assert window.row_count <= 13
        assert window.caption == "1 failed, 29 passed, 10 waiting"
        shown = list(window.columns[0].cells)
        assert "check-03" in shown and "check-29" in shown and "check-39" not in shown
    text = out.getvalue()
    assert all(c.id in text for c in checks)  # the whole table once at the end


def test_every_json_operator_is_in_the_schema_and_compare_knows_it() -> None:
    """A new operator needs three places (see CONTRIBUTING.md): this catches one that was forgotten."""
    from imageforge.smoke import PATH_OPS

    schema = json.loads((REPO / "schema" / "smoke.schema.json").read_text())
    in_schema = set(schema["$defs"]["path_expectation"]["properties"]) - {"path", "each"}
    assert in_schema == set(PATH_OPS)
    for op in set(PATH_OPS) - {"exists", "count"}:  # those two read the list of matches (evaluate_path)
        try:
            compare(op, "x", "x" if op not in ("valid", "parses_as") else {})
        except ValueError as exc:
            raise AssertionError(f"compare() does not know {op!r}") from exc


# ============================================================================ parameters, skip rules, merge, files


PARAM_SUITE = """\
    version: 1
    params:
      budget: {default: 8, description: tokens asked, schema: {type: integer, minimum: 1}}
      mode: {default: "on", description: a word, schema: {enum: ["on", "off"]}}
    tags:
      real-weights: needs a trained model
    files:
      blob: blob.bin
    vars:
      extra: {temperature: 0, chat_template_kwargs: {enable_thinking: false}}
    setup:
      - id: probe
        optional: true
        request: {endpoint: /missing}
        bind: {probed: $.x}
    checks:
      - id: sized
        request:
          endpoint: /v1/completions
          body: {prompt: "${blob}", max_tokens: "${budget}", chat_template_kwargs: {other: 1}}
          merge: "${extra}"
          delay: 0.01
        skip_if:
          - {before: true, when: "mode == 'off'", why: "mode is ${mode}"}
          - {when: "status == 200 and choices[0].text == 'maybe'", why: "inconclusive: ${choices[0].text}"}
        expect:
          relations: ["choices[0].text == 'yes'", "get(vars, 'probed') is None"]
      - id: real
        tags: [real-weights]
        request: {endpoint: /health}
        expect: {status: 200}
    """


def param_server(text: str, seen: list[Any]) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            seen.append(json.loads(request.content))
            return httpx.Response(200, json={"choices": [{"text": text}]})
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(404, json={"error": {"message": "no"}})
    return handle


def run_params(tmp_path: Path, text: str, params: list[str] | None = None) -> tuple[SmokeReport, list[Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(PARAM_SUITE))
    (tmp_path / "blob.bin").write_bytes(b"\x00\xffhi")
    seen: list[Any] = []
    report = run_suite(load_suite(path), URL, tags=("dummy-ok",), run_dir=tmp_path / "run", echo=lambda _: None,
                       live=False, transport=httpx.MockTransport(param_server(text, seen)), params=params)
    return report, seen


def test_parameters_merge_files_and_optional_setup(tmp_path: Path) -> None:
    report, seen = run_params(tmp_path, "yes", ["budget=32"])
    assert report.ok and report.results[0].status == "passed", report.results[0].failures
    assert seen == [{"prompt": "AP9oaQ==", "max_tokens": 32, "temperature": 0,
                     "chat_template_kwargs": {"other": 1, "enable_thinking": False}}]
    assert report.params == {"budget": 32, "mode": "on"}
    # the check the tags left out is listed, with what its tag means
    assert report.not_selected[0].message == ("not selected: tagged real-weights, the run selected dummy-ok "
                                              "(real-weights: needs a trained model)")


def test_skip_rules_before_and_after(tmp_path: Path) -> None:
    report, seen = run_params(tmp_path / "a", "maybe")
    assert report.results[0].status == "skipped" and report.results[0].message == "inconclusive: maybe"
    assert report.ok and report.skipped == 1 and len(seen) == 1
    report, seen = run_params(tmp_path / "b", "yes", ["mode=off"])
    assert report.results[0].status == "skipped" and report.results[0].message == "mode is off" and seen == []
    report, _ = run_params(tmp_path / "c", "no")
    assert report.results[0].status == "failed"


def test_parameter_values_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(PARAM_SUITE))
    (tmp_path / "blob.bin").write_bytes(b"x")
    suite = load_suite(path)
    with pytest.raises(ConfigError, match="has no parameter 'budgt'") as info:
        suite.resolve_params(["budgt=3"])
    assert "budget" in str(info.value.hint)
    with pytest.raises(ConfigError, match="budget=0"):
        suite.resolve_params(["budget=0"])
    with pytest.raises(ConfigError, match="mode=maybe"):
        suite.resolve_params(["mode=maybe"])
    assert suite.resolve_params(["mode=off", "budget=5"]) == {"budget": 5, "mode": "off"}  # `off` stays a word


def test_new_keys_are_checked_at_load(suite_file: Callable[..., Path]) -> None:
    err = config_error(suite_file("""\
        version: 1
        params:
          n: {default: 0, description: a count, schema: {type: integer, minimum: 1}}
        files:
          image: nowhere.png
        vars:
          n: 3
        checks:
          - id: a
            request: {endpoint: /health, body: [1], merge: {x: 1}}
            skip_if:
              - {when: "status ==", why: x}
            expect: {status: 200}
        """))
    text = str(err)
    assert "the default does not satisfy the parameter's schema" in text
    assert "file does not exist" in text
    assert "'n' is a parameter of the suite and a variable" in text
    assert "merge needs a JSON object body" in text
    assert "invalid expression" in text


def test_smoke_refuses_an_unknown_param_before_sending(tmp_path: Path) -> None:
    from tests.cli import imageforge

    proc = imageforge("smoke", "--url", URL, "--suite", str(REPO / "smoke" / "evaluator.yaml"), "--param",
                      "max_context=5")
    assert proc.returncode == 2, proc.stderr
    assert "no parameter 'max_context'" in proc.stderr and "max_context_tokens" in proc.stderr
