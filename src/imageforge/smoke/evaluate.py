"""Whether a check's expectations hold for what came back: pure functions, no I/O.

:func:`evaluate` takes a check's :class:`~.suite.Expectations`, one :class:`~.results.Exchange` and the
names its expressions see (:func:`namespace`), and returns every expectation that does not hold, one
message each (empty: all hold): status, the stream's shape, JSON Schema of the body and of each chunk,
the ``expect.json`` items (:func:`evaluate_path`, comparisons in :mod:`.operators`), regular expressions
(:func:`evaluate_regex`), relations, and stream == non-stream.  ``/metrics`` counters are compared by
:func:`metric_deltas` and :func:`metric_misses` over snapshots the runner scrapes.  The runner
(:mod:`.runner`) sends the requests and calls these.
"""

from __future__ import annotations

import math
import re
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpath

from ..serve.openai_wire import MetricRow, comparable_choices, metric_value, short
from .expr import ExprError, json_type, render
from .operators import compare, schema_errors
from .results import Exchange
from .suite import Expectations, MetricExpectation, PathExpectation, RegexExpectation


def namespace(request_body: Any, ex: Exchange, bodies: Sequence[Any], non_stream: Exchange | None,
              reference: tuple[Any, Any] = (None, None),
              vars: dict[str, Any] | None = None) -> Mapping[str, Any]:
    """The names a check's expressions see for ``ex``: the special names, then the suite's variables
    (``vars``), then the top-level fields of the response body."""
    names = vars if vars is not None else {}
    special = {
        "request": request_body,
        "response": ex.body,
        "responses": list(bodies),
        "status": ex.status,
        "headers": ex.headers,
        "text": ex.text,
        "chunks": ex.chunks or [],
        "non_stream": non_stream.body if non_stream is not None else None,
        "reference_request": reference[0],
        "reference": reference[1],
        "vars": names,
    }
    layers: list[dict[str, Any]] = [special, names]
    if isinstance(ex.body, dict):
        layers.append(ex.body)
    return ChainMap(*layers)


def evaluate(expect: Expectations, ex: Exchange, names: Mapping[str, Any], *, stream: bool = False,
             non_stream: Exchange | None = None) -> list[str]:
    """Every expectation that does not hold for ``ex`` (empty: all hold).

    ``stream``: the request asked for a stream; ``non_stream``: the same request without streaming, for
    ``stream_equals_non_stream`` (None: not sent, or it failed and that failure is reported already).
    """
    out: list[str] = []
    if ex.status not in expect.status:
        want = " or ".join(map(str, expect.status))
        detail = ""
        if isinstance(ex.body, Mapping) and isinstance(ex.body.get("error"), Mapping):
            detail = f": {short(ex.body['error'].get('message', ''), 200)}"
        elif ex.text:
            detail = f": {short(ex.text.strip(), 200)}"
        out.append(f"status {ex.status}, expected {want}{detail}")
        return out
    if stream and ex.status == 200:
        if ex.chunks is None:
            out.append(f"expected a stream (text/event-stream), got {ex.headers.get('content-type')}")
            return out
        problems = ex.body.get("stream_problems") if isinstance(ex.body, Mapping) else None
        if problems:
            out.extend(f"stream: {p}" for p in problems)
    elif ex.body is None and (expect.schema or expect.paths or expect.relations):
        out.append(f"the body is not JSON: {short(ex.text.strip(), 200)}")
        return out
    if expect.schema is not None:
        out.extend(f"schema: {m}" for m in schema_errors(ex.body, expect.schema))
    if expect.chunk_schema is not None and ex.chunks is not None:
        for i, chunk in enumerate(ex.chunks):
            errors = schema_errors(chunk, expect.chunk_schema)
            if errors:
                out.append(f"chunk {i}: {errors[0]}")
                break
    for pe in expect.paths:
        message = evaluate_path(pe, ex.body, names, jsonpath.findall)
        if message:
            out.append(message)
    for rx in expect.regex:
        message = evaluate_regex(rx, ex)
        if message:
            out.append(message)
    for rel in expect.relations:
        try:
            value = rel.expr.evaluate(names)
        except ExprError as exc:
            out.append(f"relation `{rel.expr.text}` could not be evaluated: {exc}")
            continue
        if not value:
            out.append(f"relation `{rel.expr.text}` does not hold: {rel.expr.explain(names)}")
    if expect.stream_equals_non_stream and non_stream is not None:
        streamed = comparable_choices(ex.body)
        plain = comparable_choices(non_stream.body)
        if streamed != plain:
            out.append("stream != non-stream: " + describe_difference(streamed, plain))
    return out


def evaluate_path(pe: PathExpectation, body: Any, names: Mapping[str, Any],
                  findall: Callable[[str, Any], list[Any]]) -> str | None:
    """None when the JSONPath expectation holds, else a message."""
    try:
        matches = findall(pe.path, body) if body is not None else []
    except jsonpath.JSONPathError as exc:
        return f"{pe.path}: {str(exc).splitlines()[0]}"
    try:
        want = render(pe.value, names) if pe.op not in ("valid", "parses_as") else pe.value
    except ExprError as exc:
        return f"{pe.path}: cannot render the expected value: {exc}"
    if pe.op == "exists":
        found = bool(matches)
        return None if found == bool(want) else f"{pe.path}: {'missing' if want else 'present'}" + (
            f" (found {short(matches[0])})" if matches else "")
    if pe.op == "count":
        return None if len(matches) == want else f"{pe.path}: {len(matches)} matches, expected {want}"
    if not matches:
        return f"{pe.path}: no match in the response"
    values = matches if pe.each else [matches[0] if len(matches) == 1 else matches]
    for value in values:
        problem = compare(pe.op, value, want)
        if problem:
            return f"{pe.path}: {problem}"
    return None


def evaluate_regex(rx: RegexExpectation, ex: Exchange) -> str | None:
    """None when the regular expression expectation holds for ``ex``, else a message."""
    texts: list[Any]
    if rx.path is None:
        texts = [ex.text]
        where = "the response"
    else:
        matches = jsonpath.findall(rx.path, ex.body) if ex.body is not None else []
        if not matches:
            return f"{rx.path}: no match in the response (for /{rx.pattern}/)"
        texts = matches
        where = rx.path
    for text in texts:
        if not isinstance(text, str):
            return f"{where}: {short(text)} is {json_type(text)}, not a string (for /{rx.pattern}/)"
        hit = re.fullmatch(rx.pattern, text, re.S) if rx.full else re.search(rx.pattern, text)
        if rx.negate and hit:
            return f"{where}: /{rx.pattern}/ found in {short(text)}"
        if not rx.negate and not hit:
            return f"{where}: {short(text)} does not {'fully ' if rx.full else ''}match /{rx.pattern}/"
    return None


def describe_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    """The first difference between the streamed choices ``a`` and the plain ones ``b``."""
    if len(a) != len(b):
        return f"{len(a)} choices streamed, {len(b)} without streaming"
    for x, y in zip(a, b, strict=True):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"choice {x.get('index')} {key}: streamed {short(x.get(key))}, plain {short(y.get(key))}"
    return "differs"  # pragma: no cover


# -- /metrics counters -----------------------------------------------------------


@dataclass(frozen=True)
class MetricDelta:
    """One ``expect.metrics`` item with its expected growth computed: exactly ``exact``, at least ``least``."""

    expectation: MetricExpectation
    exact: float | None
    least: float | None


def metric_deltas(metrics: Sequence[MetricExpectation], names: Mapping[str, Any],
                  before: Sequence[MetricRow]) -> tuple[list[MetricDelta], list[str]]:
    """The expected growth of each counter (computed from ``names``), and the items that cannot be checked:
    a delta that does not compute, a counter that is not in the ``before`` snapshot."""
    wanted: list[MetricDelta] = []
    problems: list[str] = []
    for me in metrics:
        try:
            exact = float(me.delta.evaluate(names)) if me.delta is not None else None
            least = float(me.min_delta.evaluate(names)) if me.min_delta is not None else None
        except (ExprError, TypeError, ValueError) as exc:
            problems.append(f"metric {me.name}: the expected delta could not be computed: {exc}")
            continue
        if metric_value(before, me.name, me.labels) is None:
            problems.append(f"metric {me.name}{labels_text(me.labels)} is not in /metrics")
            continue
        wanted.append(MetricDelta(me, exact, least))
    return wanted, problems


def metric_misses(wanted: Sequence[MetricDelta], before: Sequence[MetricRow],
                  after: Sequence[MetricRow]) -> list[str]:
    """Every counter that did not grow as expected between the two snapshots (empty: all did)."""
    misses: list[str] = []
    for want in wanted:
        me, exact, least = want.expectation, want.exact, want.least
        b = metric_value(before, me.name, me.labels) or 0.0
        a = metric_value(after, me.name, me.labels) or 0.0
        delta = a - b
        if exact is not None and not math.isclose(delta, exact, abs_tol=1e-6):
            misses.append(f"metric {me.name}{labels_text(me.labels)} grew by {delta:g}, expected exactly "
                          f"{exact:g} ({me.delta.text if me.delta else ''}) [{b:g} -> {a:g}]")
        if least is not None and delta < least:
            misses.append(f"metric {me.name}{labels_text(me.labels)} grew by {delta:g}, expected at least "
                          f"{least:g} [{b:g} -> {a:g}]")
    return misses


def labels_text(labels: Mapping[str, str]) -> str:
    """``{k="v",...}`` as /metrics writes labels; empty for none."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
