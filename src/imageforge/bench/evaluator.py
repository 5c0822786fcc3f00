"""The competition evaluator's replay metrics, as its public harness and the platform compute them.

Facts (``shared/notes/bi100-vendor-facts.md``, "The evaluator" and "The replay's score"; the harness
``modelsphere/llm-bench``, ``bench/tests/functional/replay.py``):

* per request: **Output TPS** = completion tokens / total time (TTFT included); **Input TPS** = prompt tokens /
  TTFT (a prefill rate; 0 without a first token, as the harness); both as mean, p10, p50, p90 over the
  **successful** requests;
* TTFT and total-time percentiles over the successful requests only, linear interpolation
  (:func:`.metrics.percentile`); TTFT per input-length bucket (:data:`TTFT_BUCKETS`, the harness's);
* aggregate rates over the run's **wall time** (first request sent to the last stream's end, gaps and retry
  back-off included, never the sum of request times): output, input, uncached input (prompt - cached) and
  cached tokens per second and per minute (``output_tpm``, ``uncached_input_tpm``, ``cached_tpm``, ...);
* **the score**: ``weighted_tps`` = 16.796 x output + 2.799 x uncached input + 0.56 x cached tokens per wall
  second (:func:`.metrics.weighted_tps`); the platform prints it times 38.582 (``platform_score``);
  ``score_shares`` says how much each term contributes;
* success = no transport or HTTP failure after the retries; a 200 stream without a finish reason is a success
  and counts as **unfinished**; ``uptime`` = successes / attempted requests (requests never started, cut by
  the time cap, count in neither); a missing ``cached_tokens`` counts as 0 (and the report says how many);
* the failure's class (:func:`classify_http`, :func:`classify_transport`): the server's own error message
  first (ctx_overflow, image_load, tool_schema, multi_system_template, request_validation), else the status
  (auth, not_found, payload_too_large, request_validation for 422, rate_limited, server_error, ``http_<code>``),
  and for no response ``timeout`` / ``connection``, for a broken stream ``stream_aborted``.

Redlines and targets are data (:mod:`.redlines`).  Nothing here does I/O: the runner (``replay.py``) produces
:class:`RequestRecord` values, and tests feed hand-made ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .metrics import (
    CACHED_WEIGHT,
    OUTPUT_WEIGHT,
    PLATFORM_FACTOR,
    UNCACHED_INPUT_WEIGHT,
    mean,
    percentile,
    platform_score,
    score_shares,
    weighted_tps,
)
from .redlines import REDLINES, RedlineResult, check

# --------------------------------------------------------------------------- error classes

#: (class, lower-case phrases of the server's message), first hit wins: the harness's table of causes.
MESSAGE_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ctx_overflow", ("longer than the model", "requested token count exceeds", "maximum context length",
                      "context length exceeded", "context_length_exceeded")),
    ("image_load", ("loading image data", "while loading data imagedata", "cannot identify image",
                    "failed to fetch image", "error in loading image")),
    ("tool_schema", ("'parameters' schema", "invalid tool", "tool call validation")),
    ("multi_system_template", ("system message must be", "multiple system messages",
                               "conversation roles must alternate")),
    ("request_validation", ("validation error", "input should be", "field required", "must be one of")),
)
STATUS_CLASSES = {401: "auth", 403: "auth", 404: "not_found", 413: "payload_too_large", 422: "request_validation",
                  429: "rate_limited"}
#: Every class a failure can get, besides ``http_<status>`` for any other status.
ERROR_CLASSES: tuple[str, ...] = (
    *(name for name, _ in MESSAGE_CLASSES), "auth", "not_found", "payload_too_large", "rate_limited",
    "server_error", "timeout", "connection", "stream_aborted",
)


def server_message(body: str | None) -> str:
    """The server's error message: ``message`` or ``error.message`` of a JSON envelope, else the text."""
    text = (body or "").strip()
    if not text:
        return ""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict):
        message = data.get("message")
        if not message and isinstance(data.get("error"), dict):
            message = data["error"].get("message")
        if message:
            return str(message)
    return text


def classify_http(status: int, body: str | None) -> str:
    """The class of an HTTP failure (status >= 400): by the server's message, else by the status."""
    low = server_message(body).lower()
    for name, phrases in MESSAGE_CLASSES:
        if any(p in low for p in phrases):
            return name
    if status in STATUS_CLASSES:
        return STATUS_CLASSES[status]
    if status >= 500:
        return "server_error"
    return f"http_{status}"


def classify_transport(*, timed_out: bool, got_response: bool) -> str:
    """The class of a failure without an HTTP error status: no answer in time, no connection, a broken stream."""
    if timed_out:
        return "timeout"
    return "stream_aborted" if got_response else "connection"


def retryable_status(status: int) -> bool:
    """429 and 5xx are retried (a 4xx is the request's fault: the same answer would come back)."""
    return status == 429 or status >= 500


def known_class(name: str) -> bool:
    return name in ERROR_CLASSES or (name.startswith("http_") and name[5:].isdigit())


# --------------------------------------------------------------------------- records

#: The harness's input-length buckets for TTFT: (label, lowest prompt tokens, highest + 1); K = 1024.
TTFT_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("lt_6k", 0, 6 * 1024),
    ("6k_16k", 6 * 1024, 16 * 1024),
    ("16k_32k", 16 * 1024, 32 * 1024),
    ("32k_64k", 32 * 1024, 64 * 1024),
    ("64k_128k", 64 * 1024, 128 * 1024),
    ("128k_256k", 128 * 1024, 256 * 1024),
    ("ge_256k", 256 * 1024, float("inf")),
)


def bucket_of(prompt_tokens: int) -> str | None:
    """The TTFT bucket of a prompt length; None for an unknown (0) length."""
    if prompt_tokens <= 0:
        return None
    return next(label for label, low, high in TTFT_BUCKETS if low <= prompt_tokens < high)


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request as the client measured it (times in seconds from before its first attempt: a retry's
    back-off is inside TTFT and total time, as in the harness)."""

    index: int
    status: int | None
    error_class: str | None = None
    error: str | None = None
    ttft_s: float | None = None  # first generated token (content, reasoning or a tool call)
    total_s: float | None = None  # the end of the stream (or the failure)
    prompt_tokens: int = 0  # usage.prompt_tokens: cached tokens included
    completion_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: not reported (counts 0)
    finished: bool = True  # a finish_reason came (a success without one is "unfinished")
    attempts: int = 1
    retry_wait_s: float = 0.0
    input_tokens_planned: int | None = None  # the generator's count, when the request came from it
    session: str | None = None  # the session the request belongs to (sampled replays)

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def output_tps(self) -> float:
        """Completion tokens / total time, TTFT included (0 without a time): the harness's Output TPS."""
        return self.completion_tokens / self.total_s if self.total_s and self.total_s > 0 else 0.0

    @property
    def input_tps(self) -> float:
        """Prompt tokens / TTFT (0 without a first token): the harness's Input TPS, a prefill rate."""
        return self.prompt_tokens / self.ttft_s if self.ttft_s and self.ttft_s > 0 else 0.0

    @property
    def cached(self) -> int:
        return self.cached_tokens or 0

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached)

    @property
    def input_length(self) -> int:
        """Prompt length for plots: the server's count, else the planned one."""
        return self.prompt_tokens or (self.input_tokens_planned or 0)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "status": self.status, "error_class": self.error_class, "error": self.error,
                "ttft_s": _round(self.ttft_s), "total_s": _round(self.total_s),
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "finished": self.finished, "attempts": self.attempts,
                "retry_wait_s": round(self.retry_wait_s, 3), "input_tokens_planned": self.input_tokens_planned,
                "session": self.session, "output_tps": _round(self.output_tps, 3),
                "input_tps": _round(self.input_tps, 3)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        error_class = data.get("error_class")
        if error_class is not None and not known_class(str(error_class)):
            raise ValueError(f"unknown error class {error_class!r}")
        return cls(index=int(data["index"]), status=data.get("status"), error_class=error_class,
                   error=data.get("error"), ttft_s=data.get("ttft_s"), total_s=data.get("total_s"),
                   prompt_tokens=int(data.get("prompt_tokens") or 0),
                   completion_tokens=int(data.get("completion_tokens") or 0),
                   cached_tokens=data.get("cached_tokens"), finished=bool(data.get("finished", True)),
                   attempts=int(data.get("attempts") or 1), retry_wait_s=float(data.get("retry_wait_s") or 0.0),
                   input_tokens_planned=data.get("input_tokens_planned"), session=data.get("session"))


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class EvalReport:
    """The evaluator's figures over one replay: ``metrics`` holds them under the harness's names."""

    metrics: dict[str, Any]
    redlines: tuple[RedlineResult, ...] = field(default=())

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]

    @property
    def weighted_tps(self) -> float:
        return float(self.metrics["weighted_tps"])

    def lines(self) -> list[str]:
        """The printed report: what each number is, which ones are the platform's, then the redlines."""
        m = self.metrics

        def f(key: str, digits: int = 2) -> str:
            value = m.get(key)
            return "-" if value is None else f"{value:,.{digits}f}"

        errors = ", ".join(f"{k}={v}" for k, v in sorted(m["error_class_counts"].items())) or "none"
        shares = m["score_shares"] or {}
        share_text = ", ".join(f"{k.replace('_', ' ')} {shares.get(k, 0) * 100:.1f}%"
                               for k in ("output", "uncached_input", "cached")) if shares else "-"
        out = [
            f"requests: {m['successful_requests']}/{m['attempted_requests']} succeeded"
            f" ({m['not_started_requests']} never started); uptime {m['uptime'] * 100:.2f}%"
            f"; unfinished {m['unfinished_requests']}; errors: {errors}",
            f"wall time {f('wall_time_s', 1)} s (first request sent to the last stream's end)",
            f"PLATFORM'S SCORE: weighted_tps {f('weighted_tps')} weighted tokens/s = {OUTPUT_WEIGHT} x output "
            f"{f('output_tokens_per_s')} + {UNCACHED_INPUT_WEIGHT} x uncached input "
            f"{f('uncached_input_tokens_per_s')} + {CACHED_WEIGHT} x cached {f('cached_tokens_per_s')} tokens/s; "
            f"platform_score (x {PLATFORM_FACTOR}) {f('platform_score')}",
            f"score shares: {share_text}",
            f"aggregate rates per minute: output_tpm {f('output_tpm', 1)}, input_tpm {f('input_tpm', 1)}, "
            f"uncached_input_tpm {f('uncached_input_tpm', 1)}, cached_tpm {f('cached_tpm', 1)}",
            f"Output TPS (per request, completion / total time incl. TTFT): mean {f('output_tps_mean')}, "
            f"p10 {f('output_tps_p10')}",
            f"Input TPS (per request, prompt / TTFT: prefill rate): mean {f('input_tps_mean')}, "
            f"p10 {f('input_tps_p10')}",
            f"TTFT p50 / p90 / p99: {f('ttft_p50_ms', 0)} / {f('ttft_p90_ms', 0)} / {f('ttft_p99_ms', 0)} ms; "
            f"total time p50 / p99: {f('total_time_p50_ms', 0)} / {f('total_time_p99_ms', 0)} ms",
            f"tokens: prompt {m['total_input_tokens']:,} (cached {m['total_cached_tokens']:,}, uncached "
            f"{m['total_uncached_input_tokens']:,}), completion {m['total_output_tokens']:,}; cache hit "
            + ("-" if m["cache_hit_rate"] is None else f"{m['cache_hit_rate'] * 100:.2f}%"),
        ]
        buckets = [f"{label} n={m[f'ttft_{label}_count']} p90 {f(f'ttft_{label}_p90_ms', 0)} ms"
                   for label, _, _ in TTFT_BUCKETS if m[f"ttft_{label}_count"]]
        if buckets:
            out.append("TTFT by input length: " + "; ".join(buckets))
        if m["cached_tokens_missing"]:
            out.append(f"warning: {m['cached_tokens_missing']} successful responses carried no cached_tokens: "
                       "counted as 0, as the harness does (vLLM reports it with --enable-prompt-tokens-details)")
        out.extend(r.render() for r in self.redlines)
        return out

    def to_json(self) -> dict[str, Any]:
        return {**self.metrics, "redlines": [r.to_json() for r in self.redlines]}


def _stats(values: Sequence[float], prefix: str, stats: Sequence[str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for stat in stats:
        if stat == "mean":
            out[f"{prefix}_mean"] = mean(values)
        else:
            out[f"{prefix}_{stat}"] = percentile(values, float(stat[1:]))
    return out


def _ms(values: Sequence[float], prefix: str, stats: Sequence[str]) -> dict[str, float | None]:
    return {k + "_ms": v for k, v in _stats([x * 1000 for x in values], prefix, stats).items()}


def evaluate(records: Sequence[RequestRecord], wall_s: float, *, not_started: int = 0) -> EvalReport:
    """The evaluator's figures over ``records`` (one per attempted request) and the run's wall time."""
    ok = [r for r in records if r.ok]
    attempted = len(records)
    counts: dict[str, int] = {}
    for r in records:
        if r.error_class is not None:
            counts[r.error_class] = counts.get(r.error_class, 0) + 1
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    totals = [r.total_s for r in ok if r.total_s is not None]
    unfinished = sum(1 for r in ok if not r.finished)
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.completion_tokens for r in ok)
    cached = sum(r.cached for r in ok)
    uncached = max(0, prompt - cached)
    seconds = wall_s if wall_s > 0 else 0.0

    def per_s(tokens: int) -> float:
        return tokens / seconds if seconds else 0.0

    out_s, in_s, unc_s, cac_s = per_s(output), per_s(prompt), per_s(uncached), per_s(cached)
    weighted = weighted_tps(out_s, unc_s, cac_s)
    metrics: dict[str, Any] = {
        "total_requests": attempted + not_started, "attempted_requests": attempted,
        "not_started_requests": not_started, "successful_requests": len(ok),
        "error_requests": attempted - len(ok),
        "error_rate": (attempted - len(ok)) / attempted if attempted else 0.0,
        "uptime": len(ok) / attempted if attempted else 0.0,
        "unfinished_requests": unfinished, "unfinished_rate": unfinished / attempted if attempted else 0.0,
        "error_class_counts": counts,
        "retried_requests": sum(1 for r in records if r.attempts > 1),
        **_ms(ttfts, "ttft", ("p50", "p90", "p99", "mean")),
        **_ms(totals, "total_time", ("p50", "p90", "p99")),
        **_stats([r.output_tps for r in ok], "output_tps", ("mean", "p10", "p50", "p90")),
        **_stats([r.input_tps for r in ok], "input_tps", ("mean", "p10", "p50", "p90")),
        "total_input_tokens": prompt, "total_output_tokens": output, "total_cached_tokens": cached,
        "total_uncached_input_tokens": uncached,
        "cache_hit_rate": cached / prompt if prompt else None,
        "cached_tokens_missing": sum(1 for r in ok if r.cached_tokens is None),
        "wall_time_s": wall_s,
        "output_tokens_per_s": out_s, "input_tokens_per_s": in_s, "uncached_input_tokens_per_s": unc_s,
        "cached_tokens_per_s": cac_s,
        "output_tpm": out_s * 60, "input_tpm": in_s * 60, "uncached_input_tpm": unc_s * 60,
        "cached_tpm": cac_s * 60,
        "weighted_tps": weighted, "platform_score": platform_score(weighted),
        "score_shares": score_shares(out_s, unc_s, cac_s),
        "ttft_input_unknown_count": sum(1 for r in ok if r.ttft_s is not None and r.prompt_tokens <= 0),
    }
    for label, _, _ in TTFT_BUCKETS:
        values = [r.ttft_s for r in ok if r.ttft_s is not None and bucket_of(r.prompt_tokens) == label]
        metrics.update(_ms(values, f"ttft_{label}", ("p90", "p50")))
        average = mean(values)
        metrics[f"ttft_{label}_avg_ms"] = None if average is None else average * 1000
        metrics[f"ttft_{label}_count"] = len(values)
    return EvalReport(metrics, check(metrics, REDLINES))
