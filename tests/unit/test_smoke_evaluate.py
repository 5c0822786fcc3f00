"""smoke.evaluate without a server or a runner: expectations against hand-made exchanges, messages by hand."""

from __future__ import annotations

from typing import Any

import pytest

from imageforge.errors import Location
from imageforge.serve.openai_wire import MetricRow
from imageforge.smoke import Exchange, Expectations, Expr, MetricExpectation, PathExpectation, RegexExpectation
from imageforge.smoke.evaluate import (
    MetricDelta,
    evaluate,
    labels_text,
    metric_deltas,
    metric_misses,
    namespace,
)
from imageforge.smoke.suite import Relation

HERE = Location("s.yaml", 1)
ANSWER = {"object": "text_completion", "choices": [{"index": 0, "text": "Hello world", "finish_reason": "length"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def exchange(body: Any = None, *, status: int = 200, text: str | None = None, chunks: list[Any] | None = None,
             content_type: str = "application/json") -> Exchange:
    import json

    ex = Exchange("POST", "http://127.0.0.1:1/v1/completions", {"prompt": "hi"}, None)
    ex.status = status
    ex.headers = {"content-type": content_type}
    ex.body = body
    ex.chunks = chunks
    ex.text = text if text is not None else (json.dumps(body) if body is not None else "")
    return ex


def names_for(ex: Exchange, request: Any = None, non_stream: Exchange | None = None,
              vars: dict[str, Any] | None = None) -> Any:
    return namespace(request or {"prompt": "hi", "max_tokens": 2}, ex, [ex.body], non_stream, vars=vars)


def path(p: str, op: str, value: Any, each: bool = False) -> PathExpectation:
    return PathExpectation(p, op, value, each, HERE)


def relation(text: str) -> Relation:
    return Relation(Expr.parse(text), HERE)


def test_all_hold_gives_no_message() -> None:
    expect = Expectations(
        schema={"type": "object", "required": ["choices"]},
        paths=(path("$.choices[0].text", "equals", "Hello world"), path("$.choices[*].index", "exists", True),
               path("$.choices[*]", "count", 1)),
        regex=(RegexExpectation(r"Hello \w+", "$.choices[0].text", True, False, HERE),),
        relations=(relation("usage.completion_tokens <= request.max_tokens"),))
    ex = exchange(ANSWER)
    assert evaluate(expect, ex, names_for(ex)) == []


def test_wrong_status_stops_there_and_quotes_the_servers_error() -> None:
    body = {"error": {"message": "max_tokens must be at least 1"}}
    expect = Expectations(paths=(path("$.choices", "exists", True),))
    ex = exchange(body, status=400)
    assert evaluate(expect, ex, names_for(ex)) == ["status 400, expected 200: 'max_tokens must be at least 1'"]
    plain = exchange(None, status=503, text="  overloaded \n")
    assert evaluate(Expectations(status=(200, 201)), plain, names_for(plain)) == [
        "status 503, expected 200 or 201: 'overloaded'"]


def test_a_body_that_is_not_json_is_one_message_when_something_reads_it() -> None:
    ex = exchange(None, text="<html>oops</html>")
    assert evaluate(Expectations(), ex, names_for(ex)) == []  # nothing reads the body
    expect = Expectations(paths=(path("$.x", "equals", 1),))
    assert evaluate(expect, ex, names_for(ex)) == ["the body is not JSON: '<html>oops</html>'"]


def test_stream_checks() -> None:
    plain = exchange(ANSWER)
    assert evaluate(Expectations(), plain, names_for(plain), stream=True) == [
        "expected a stream (text/event-stream), got application/json"]
    chunks = [{"choices": [{"index": 0, "text": "Hello"}]}, {"choices": [{"index": 0, "text": 7}]}]
    body = {**ANSWER, "stream_problems": ["chunk 2 is not JSON"]}
    streamed = exchange(body, chunks=chunks, content_type="text/event-stream")
    expect = Expectations(chunk_schema={"type": "object", "properties": {"choices": {"type": "array", "items": {
        "properties": {"text": {"type": "string"}}}}}})
    assert evaluate(expect, streamed, names_for(streamed), stream=True) == [
        "stream: chunk 2 is not JSON", 'chunk 1: $.choices[0].text: "7 is not of type \'string\'"']


def test_stream_equals_non_stream_names_the_first_difference() -> None:
    expect = Expectations(stream_equals_non_stream=True)
    streamed = exchange(ANSWER, chunks=[], content_type="text/event-stream")
    same = exchange(ANSWER)
    assert evaluate(expect, streamed, names_for(streamed, non_stream=same), stream=True, non_stream=same) == []
    other = exchange({**ANSWER, "choices": [{"index": 0, "text": "Hello there", "finish_reason": "length"}]})
    messages = evaluate(expect, streamed, names_for(streamed, non_stream=other), stream=True, non_stream=other)
    assert len(messages) == 1 and messages[0].startswith("stream != non-stream: choice 0 ")
    assert "Hello world" in messages[0] and "Hello there" in messages[0]
    # no non-stream answer (not sent, or it failed and said so already): nothing to compare
    assert evaluate(expect, streamed, names_for(streamed), stream=True) == []


def test_every_failing_expectation_is_reported_in_order() -> None:
    expect = Expectations(
        schema={"type": "object", "required": ["id"]},
        paths=(path("$.choices[0].text", "equals", "Bye"), path("$.missing", "exists", True),
               path("$.choices[*].index", "count", "${want}")),
        regex=(RegexExpectation("world", None, False, True, HERE),),
        relations=(relation("usage.total_tokens == 4"), relation("nothing > 1")))
    ex = exchange(ANSWER)
    messages = evaluate(expect, ex, names_for(ex, vars={"want": 2}))
    assert messages[0] == 'schema: $: "\'id\' is a required property"'
    assert messages[1] == "$.choices[0].text: 'Hello world' != 'Bye'"
    assert messages[2] == "$.missing: missing"
    assert messages[3] == "$.choices[*].index: 1 matches, expected 2"
    assert messages[4].startswith("the response: /world/ found in ")
    assert messages[5].startswith("relation `usage.total_tokens == 4` does not hold: ") and "5" in messages[5]
    assert messages[6].startswith("relation `nothing > 1` could not be evaluated: ")
    assert len(messages) == 7


def test_regex_on_a_path_that_is_not_a_string() -> None:
    ex = exchange(ANSWER)
    rx = RegexExpectation(r"\d+", "$.usage.total_tokens", False, False, HERE)
    assert evaluate(Expectations(regex=(rx,)), ex, names_for(ex)) == [
        "$.usage.total_tokens: 5 is integer, not a string (for /\\d+/)"]


def test_namespace_layers_special_names_then_vars_then_body_fields() -> None:
    ex = exchange({**ANSWER, "text": "a body field called text", "model": "m1"})
    names = namespace({"max_tokens": 2}, ex, [ex.body], None, vars={"model": "from-vars", "n": 3})
    assert names["request"] == {"max_tokens": 2}
    assert names["text"] == ex.text  # the special name wins over the body's field
    assert names["model"] == "from-vars" and names["n"] == 3 and names["vars"] == {"model": "from-vars", "n": 3}
    assert names["usage"]["total_tokens"] == 5 and names["non_stream"] is None and names["chunks"] == []


BEFORE: list[MetricRow] = [("vllm:requests_total", {"model": "m"}, 10.0), ("vllm:tokens_total", {}, 100.0)]


def metric(name: str, delta: str | None = None, least: str | None = None,
           labels: dict[str, str] | None = None) -> MetricExpectation:
    return MetricExpectation(name, labels or {}, Expr.parse(delta) if delta else None,
                             Expr.parse(least) if least else None, HERE)


def test_metric_deltas_compute_from_the_names_and_refuse_what_cannot_be_checked() -> None:
    ex = exchange(ANSWER)
    names = names_for(ex)
    wanted, problems = metric_deltas(
        [metric("vllm:requests_total", "len(responses)", labels={"model": "m"}),
         metric("vllm:tokens_total", least="usage.total_tokens"),
         metric("vllm:absent_total", "1"),
         metric("vllm:tokens_total", "usage.nothing")], names, BEFORE)
    assert [(w.expectation.name, w.exact, w.least) for w in wanted] == [
        ("vllm:requests_total", 1.0, None), ("vllm:tokens_total", None, 5.0)]
    assert problems[0] == "metric vllm:absent_total is not in /metrics"
    assert problems[1].startswith("metric vllm:tokens_total: the expected delta could not be computed: ")
    assert len(problems) == 2


def test_metric_misses_compare_the_two_snapshots() -> None:
    wanted = [MetricDelta(metric("vllm:requests_total", "1", labels={"model": "m"}), 1.0, None),
              MetricDelta(metric("vllm:tokens_total", least="5"), None, 5.0)]
    grown: list[MetricRow] = [("vllm:requests_total", {"model": "m"}, 11.0), ("vllm:tokens_total", {}, 105.0)]
    assert metric_misses(wanted, BEFORE, grown) == []
    short: list[MetricRow] = [("vllm:requests_total", {"model": "m"}, 12.0), ("vllm:tokens_total", {}, 104.0)]
    assert metric_misses(wanted, BEFORE, short) == [
        'metric vllm:requests_total{model="m"} grew by 2, expected exactly 1 (1) [10 -> 12]',
        "metric vllm:tokens_total grew by 4, expected at least 5 [100 -> 104]"]


@pytest.mark.parametrize(("labels", "text"), [({}, ""), ({"a": "1", "b": "x"}, '{a="1",b="x"}')])
def test_labels_text(labels: dict[str, str], text: str) -> None:
    assert labels_text(labels) == text
