"""The competition evaluator's replay metrics, defined as its logs define them: pure functions over records.

Facts (``shared/notes/bi100-vendor-facts.md``, "The evaluator"): the replay sends its requests **one at a
time**, streamed; per request, *Output TPS* = completion tokens / the request's **total time, time to first
token included**, and the harness reports its **p10**; input tokens **include** the prompt tokens served from
the prefix cache.  Score = Output TPS x 16.796 + Input TPS x 2.799 + Cache TPS x 0.56; the targets are Output
TPS p10 >= 20, TTFT p90 <= 5 s, prefix-cache hit rate >= 50 %, success >= 99 % and total-time p99 <=
999,999 ms.  Its error classes: ctx_overflow, http_400, connection, request_validation, server_error,
stream_aborted.

Where the logs say nothing, this module chooses and says so (the README's "invoke bench --replay" section
lists every choice):

* Input TPS and Cache TPS per request use the same denominator as Output TPS (the total time);
* the score cannot be reproduced from the evaluator's logged figures, so :func:`evaluate` reports an
  **estimate** and names the aggregates it used (means of the per-request rates), with a second figure that
  uses Output TPS p10 instead of the mean (the reading some teams use);
* percentiles interpolate linearly between ranks (numpy's default; :func:`.metrics.percentile`).

Score weights and the percentile are the bench's (:mod:`.metrics`): one definition each.

Nothing here does I/O: the runner (``replay.py``) produces :class:`RequestRecord` values, and tests feed
hand-made ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .metrics import SCORE_CACHE_WEIGHT, SCORE_INPUT_WEIGHT, SCORE_OUTPUT_WEIGHT, mean, percentile, score

# --------------------------------------------------------------------------- constants (facts note)

SCORE_TARGET = 8000.0

TARGET_OUTPUT_TPS_P10 = 20.0  # tokens/s, at least
TARGET_TTFT_P90_S = 5.0  # seconds, at most
TARGET_CACHE_HIT = 0.50  # fraction, at least
TARGET_SUCCESS = 0.99  # fraction, at least
TARGET_TOTAL_P99_MS = 999_999.0  # milliseconds, at most (the redline: the replay fails above it)

ErrorClass = Literal["ctx_overflow", "http_400", "connection", "request_validation", "server_error",
                     "stream_aborted"]
ERROR_CLASSES: tuple[ErrorClass, ...] = ("ctx_overflow", "http_400", "connection", "request_validation",
                                         "server_error", "stream_aborted")

# A 400 whose message says the prompt (plus the asked completion) does not fit the context window.
# vLLM 0.6.3: "This model's maximum context length is 80000 tokens. However, you requested 94467 tokens ...";
# vLLM 0.32 adds "'max_tokens' or 'max_completion_tokens' is too large: ..." and "... longer than the maximum model
# length ...".
_CTX_PATTERNS = re.compile(
    r"maximum context length|context length is|context window|max_model_len|maximum model length"
    r"|prompt is too long|input is too long|too many tokens|exceeds? the max|is too large",
    re.IGNORECASE)
# A 400/422 produced by request-schema validation (pydantic / FastAPI), not by the engine: unknown fields
# rejected by ``extra="forbid"`` (the baseline protocol's 400s for max_completion_tokens / reasoning_effort),
# missing or mistyped fields.
_VALIDATION_PATTERNS = re.compile(
    r"extra_forbidden|extra inputs are not permitted|extra fields not permitted|validation error"
    r"|field required|missing required|value_error|type_error|input should be|literal_error|json_invalid",
    re.IGNORECASE)


def classify_error(status: int | None, body: str | None = None, exception: BaseException | None = None, *,
                   completed: bool = True) -> ErrorClass | None:
    """The evaluator's class of one request's failure, or None when the request succeeded.

    ``status``: the HTTP status (None when no response came); ``body``: the error response's text, or the
    ``error`` event found in the stream; ``exception``: what the client raised (None when nothing);
    ``completed``: the stream reached its end (``data: [DONE]``, or a final chunk with usage).

    * no status and an exception (refused, reset, DNS, a connect or read timeout before the headers):
      ``connection``;
    * 200 then an exception, an ``error`` event or no end of stream: ``stream_aborted`` (an error event that
      names the context length: ``ctx_overflow``);
    * 4xx whose message names the context length: ``ctx_overflow``; 422, or a 4xx whose message is a schema
      validation error: ``request_validation``; any other 4xx: ``http_400``;
    * 5xx: ``server_error``; any other status (1xx/3xx): ``http_400`` (the request was not served).
    """
    text = body or ""
    if status is None:
        if exception is None and not text:
            raise ValueError("classify_error needs a status, a body or an exception")
        return "connection"
    if 200 <= status < 300:
        if exception is None and not text and completed:
            return None
        if text and _CTX_PATTERNS.search(text):
            return "ctx_overflow"
        return "stream_aborted"
    if 500 <= status < 600:
        return "server_error"
    if 400 <= status < 500:
        if _CTX_PATTERNS.search(text):
            return "ctx_overflow"
        if status == 422 or _VALIDATION_PATTERNS.search(text):
            return "request_validation"
        return "http_400"
    return "http_400"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request as measured by the client (times in seconds, from just before the POST)."""

    index: int
    status: int | None
    error_class: ErrorClass | None = None
    error: str | None = None
    ttft_s: float | None = None  # first generated token (content, reasoning or a tool call)
    total_s: float | None = None  # the last byte of the stream (or the failure)
    prompt_tokens: int = 0  # usage.prompt_tokens: cached tokens included
    completion_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: not reported
    input_tokens_planned: int | None = None  # the generator's count, when the request came from it

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def output_tps(self) -> float | None:
        """Completion tokens / total time (TTFT included): the evaluator's per-request Output TPS."""
        return _rate(self.completion_tokens, self.total_s)

    @property
    def input_tps(self) -> float | None:
        """Prompt tokens (cached included) / total time."""
        return _rate(self.prompt_tokens, self.total_s)

    @property
    def uncached_input_tps(self) -> float | None:
        """Prompt tokens the server computed (prompt - cached) / total time; None without a cache figure."""
        if self.cached_tokens is None:
            return None
        return _rate(max(0, self.prompt_tokens - self.cached_tokens), self.total_s)

    @property
    def cache_tps(self) -> float | None:
        if self.cached_tokens is None:
            return None
        return _rate(self.cached_tokens, self.total_s)

    @property
    def input_length(self) -> int:
        """Prompt length for plots: the server's count, else the planned one."""
        return self.prompt_tokens or (self.input_tokens_planned or 0)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "status": self.status, "error_class": self.error_class, "error": self.error,
                "ttft_s": _round(self.ttft_s), "total_s": _round(self.total_s),
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "input_tokens_planned": self.input_tokens_planned,
                "output_tps": _round(self.output_tps, 3)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        error_class = data.get("error_class")
        if error_class is not None and error_class not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {error_class!r}")
        return cls(index=int(data["index"]), status=data.get("status"), error_class=error_class,
                   error=data.get("error"), ttft_s=data.get("ttft_s"), total_s=data.get("total_s"),
                   prompt_tokens=int(data.get("prompt_tokens") or 0),
                   completion_tokens=int(data.get("completion_tokens") or 0),
                   cached_tokens=data.get("cached_tokens"), input_tokens_planned=data.get("input_tokens_planned"))


def _rate(tokens: int, seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0:
        return None
    return tokens / seconds


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- statistics


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class TargetLine:
    """One of the evaluator's targets, checked: ``PASS``, ``FAIL`` or ``N/A`` (no value to check)."""

    name: str
    value: float | None
    op: Literal[">=", "<="]
    threshold: float
    unit: str

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "N/A"
        ok = self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold
        return "PASS" if ok else "FAIL"

    def render(self) -> str:
        shown = "unknown" if self.value is None else _fmt(self.value, self.unit)
        return f"{self.verdict:4}  {self.name} {self.op} {_fmt(self.threshold, self.unit)}: {shown}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "op": self.op, "threshold": self.threshold,
                "unit": self.unit, "verdict": self.verdict}


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.2f}%"
    if unit == "ms":
        return f"{value:,.0f} ms"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.2f} {unit}".rstrip()


@dataclass(frozen=True)
class EvalReport:
    """The evaluator's figures over a replay's records (rates in tokens/s, fractions 0..1)."""

    attempted: int
    succeeded: int
    errors: dict[str, int]
    output_tps_mean: float | None
    output_tps_p10: float | None
    input_tps_mean: float | None  # cached tokens included
    uncached_input_tps_mean: float | None  # computed prompt tokens only (information)
    cache_tps_mean: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    total_p50_ms: float | None
    total_p99_ms: float | None
    cache_hit_rate: float | None  # sum(cached) / sum(prompt), successful requests
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    score_estimate: float | None
    score_estimate_p10: float | None
    cache_reported: bool
    targets: tuple[TargetLine, ...] = field(default=())

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.attempted if self.attempted else None

    @property
    def passed(self) -> bool:
        """Every target PASSes (an N/A target is not a pass)."""
        return all(t.verdict == "PASS" for t in self.targets)

    def lines(self) -> list[str]:
        """The printed report: figures, the score estimate with its aggregates, the target lines."""
        def f(value: float | None, digits: int = 2) -> str:
            return "-" if value is None else f"{value:,.{digits}f}"

        errors = ", ".join(f"{k}={v}" for k, v in self.errors.items() if v) or "none"
        cache_note = "" if self.cache_reported else " (the server reported no cached_tokens: Cache TPS unknown)"
        out = [
            f"requests: {self.succeeded}/{self.attempted} succeeded; errors: {errors}",
            f"Output TPS (completion tokens / total time incl. TTFT, per request): mean {f(self.output_tps_mean)}"
            f", p10 {f(self.output_tps_p10)}",
            f"Input TPS (prompt tokens incl. cached / total time, per request, mean): {f(self.input_tps_mean)}"
            f"; uncached only: {f(self.uncached_input_tps_mean)}",
            f"Cache TPS (cached prompt tokens / total time, per request, mean): {f(self.cache_tps_mean)}"
            + cache_note,
            "cache hit rate (sum cached / sum prompt tokens): "
            + ("-" if self.cache_hit_rate is None else f"{self.cache_hit_rate * 100:.2f}%"),
            f"TTFT p50 {f(self.ttft_p50_s, 3)} s, p90 {f(self.ttft_p90_s, 3)} s; total time p50 "
            f"{f(self.total_p50_ms, 0)} ms, p99 {f(self.total_p99_ms, 0)} ms",
            f"tokens: prompt {self.prompt_tokens:,}, cached "
            + ("-" if self.cached_tokens is None else f"{self.cached_tokens:,}")
            + f", completion {self.completion_tokens:,}",
            f"Score (ESTIMATE; the evaluator's own cannot be reproduced from its logs): {f(self.score_estimate)}"
            f" = {SCORE_OUTPUT_WEIGHT} x Output TPS mean + {SCORE_INPUT_WEIGHT} x Input TPS mean + "
            f"{SCORE_CACHE_WEIGHT} x Cache TPS mean; with Output TPS p10 instead of the mean: "
            f"{f(self.score_estimate_p10)} (target >= {SCORE_TARGET:,.0f})",
        ]
        out.extend(t.render() for t in self.targets)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted, "succeeded": self.succeeded, "success_rate": self.success_rate,
            "errors": dict(self.errors),
            "output_tps_mean": self.output_tps_mean, "output_tps_p10": self.output_tps_p10,
            "input_tps_mean": self.input_tps_mean, "uncached_input_tps_mean": self.uncached_input_tps_mean,
            "cache_tps_mean": self.cache_tps_mean, "cache_hit_rate": self.cache_hit_rate,
            "ttft_p50_s": self.ttft_p50_s, "ttft_p90_s": self.ttft_p90_s,
            "total_p50_ms": self.total_p50_ms, "total_p99_ms": self.total_p99_ms,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens, "cache_reported": self.cache_reported,
            "score_estimate": self.score_estimate, "score_estimate_p10": self.score_estimate_p10,
            "score_aggregates": "means of per-request rates (total time incl. TTFT as denominator); "
                                "score_estimate_p10 uses Output TPS p10 instead of its mean",
            "score_weights": {"output_tps": SCORE_OUTPUT_WEIGHT, "input_tps": SCORE_INPUT_WEIGHT,
                              "cache_tps": SCORE_CACHE_WEIGHT},
            "targets": [t.to_json() for t in self.targets], "passed": self.passed,
        }


def evaluate(records: Sequence[RequestRecord]) -> EvalReport:
    """The evaluator's figures and target lines over ``records`` (one per attempted request).

    Rates, TTFT and the cache hit rate are over the successful requests; the success rate is over every
    attempted one; total-time p99 is over every request that has a total time (a failure that took long counts
    against the redline too).  Cache TPS and the hit rate need ``cached_tokens`` on every successful request:
    when any lacks it they are None (and the cache target reads N/A) rather than a guess.
    """
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {name: sum(1 for r in records if r.error_class == name) for name in ERROR_CLASSES}
    cache_reported = bool(ok) and all(r.cached_tokens is not None for r in ok)

    def rates(attr: str) -> list[float]:
        return [v for r in ok if (v := getattr(r, attr)) is not None]

    output_rates = rates("output_tps")
    out_mean, out_p10 = mean(output_rates), percentile(output_rates, 10)
    in_mean = mean(rates("input_tps"))
    uncached_mean = mean(rates("uncached_input_tps")) if cache_reported else None
    cache_mean = mean(rates("cache_tps")) if cache_reported else None
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    totals_ms = [r.total_s * 1000 for r in records if r.total_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok) if cache_reported else None
    hit = (cached / prompt) if cached is not None and prompt > 0 else None

    est = est_p10 = None
    if out_mean is not None and in_mean is not None and cache_mean is not None:
        est = score(out_mean, in_mean, cache_mean)
        est_p10 = score(out_p10 or 0.0, in_mean, cache_mean)

    ttft_p90 = percentile(ttfts, 90)
    total_p99 = percentile(totals_ms, 99)
    success = len(ok) / len(records) if records else None
    targets = (
        TargetLine("Output TPS p10", out_p10, ">=", TARGET_OUTPUT_TPS_P10, "tok/s"),
        TargetLine("TTFT p90", ttft_p90, "<=", TARGET_TTFT_P90_S, "s"),
        TargetLine("cache hit rate", hit, ">=", TARGET_CACHE_HIT, "%"),
        TargetLine("success rate", success, ">=", TARGET_SUCCESS, "%"),
        TargetLine("total time p99", total_p99, "<=", TARGET_TOTAL_P99_MS, "ms"),
    )
    return EvalReport(
        attempted=len(records), succeeded=len(ok), errors=errors,
        output_tps_mean=out_mean, output_tps_p10=out_p10, input_tps_mean=in_mean,
        uncached_input_tps_mean=uncached_mean, cache_tps_mean=cache_mean,
        ttft_p50_s=percentile(ttfts, 50), ttft_p90_s=ttft_p90,
        total_p50_ms=percentile(totals_ms, 50), total_p99_ms=total_p99,
        cache_hit_rate=hit, prompt_tokens=prompt, cached_tokens=cached,
        completion_tokens=sum(r.completion_tokens for r in ok),
        score_estimate=est, score_estimate_p10=est_p10, cache_reported=cache_reported, targets=targets,
    )
