"""What one bench measured: each request's result and the whole run's rates, weighted rate and summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..workload import Workload
from .metrics import (
    CACHED_WEIGHT,
    OUTPUT_WEIGHT,
    UNCACHED_INPUT_WEIGHT,
    percentile,
    platform_score,
    score_shares,
    weighted_tps,
)


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str | None = None
    status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # from usage.prompt_tokens_details, when the server reports it
    usage: bool = False  # the server sent a usage block (else completion_tokens counts streamed chunks)
    ttft: float | None = None
    latency: float | None = None
    started: float = 0.0
    finished: float = 0.0
    itl: list[float] = field(default_factory=list)  # seconds between consecutive streamed chunks

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first."""
        if self.ttft is None or self.latency is None or self.completion_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.completion_tokens - 1)

    @property
    def output_tps(self) -> float | None:
        """The evaluator's per-request Output TPS: completion tokens / the request's latency, TTFT included."""
        if self.latency is None or self.latency <= 0:
            return None
        return self.completion_tokens / self.latency

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "ok": self.ok, "error": self.error, "status": self.status,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "usage": self.usage,
                "ttft_s": rounded(self.ttft), "latency_s": rounded(self.latency), "tpot_s": rounded(self.tpot, 6)}


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class BenchResult:
    run_id: str
    url: str
    model: str
    workload: Workload
    started_at: str
    wall_seconds: float
    results: list[RequestResult]
    cancelled: int = 0  # requests cut by the duration limit (never sent, or not finished)
    prompt_mode: str = "token-ids"  # token-ids (exact lengths) or text (approximate)
    cached_tokens: int | None = None
    cache_source: str = "unavailable"
    metrics_delta: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    target: str | None = None
    profile: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    startup_seconds: float | None = None
    host: dict[str, Any] = field(default_factory=dict)
    repeats: list[dict[str, Any]] = field(default_factory=list)  # every run's summary when workload.repeat > 1
    run_dir: Path | None = None
    json_path: Path | None = None

    # ---- counts
    @property
    def ok_results(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    @property
    def attempted(self) -> int:
        return len(self.results)

    @property
    def error_rate(self) -> float:
        return self.errors / self.attempted if self.attempted else 0.0

    @property
    def worst_error_rate(self) -> float:
        """The highest error rate of every run (repeats included): a failing run is never hidden by the median."""
        return max([self.error_rate, *(float(r.get("error_rate") or 0.0) for r in self.repeats)])

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.ok_results)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.ok_results)

    @property
    def short_responses(self) -> int:
        """Successful responses with another number of tokens than requested (ignore_eos not honoured?)."""
        return sum(1 for r in self.ok_results if r.completion_tokens != self.workload.output_tokens)

    # ---- rates
    def _per_second(self, tokens: float | None) -> float:
        if not tokens or self.wall_seconds <= 0:
            return 0.0
        return tokens / self.wall_seconds

    @property
    def output_tps(self) -> float:
        return self._per_second(self.completion_tokens)

    @property
    def input_tps(self) -> float:
        return self._per_second(self.prompt_tokens)

    @property
    def cache_tps(self) -> float:
        return self._per_second(self.cached_tokens)

    @property
    def uncached_input_tps(self) -> float:
        """Prompt tokens the server computed (prompt - cached) per wall second."""
        return self._per_second(max(0, self.prompt_tokens - (self.cached_tokens or 0)))

    @property
    def weighted_tps(self) -> float:
        """The replay score's formula on this run's wall-clock rates (weighted tokens per wall second)."""
        return weighted_tps(self.output_tps, self.uncached_input_tps, self.cache_tps)

    def _pct(self, attr: str, q: float) -> float | None:
        values = [v for r in self.ok_results if (v := getattr(r, attr)) is not None]
        return percentile(values, q)

    def itl_pct(self, q: float) -> float | None:
        """A percentile of every inter-token latency of the successful requests, pooled (as vllm bench serve)."""
        return percentile([gap for r in self.ok_results for gap in r.itl], q)

    def summary(self) -> dict[str, Any]:
        """The numbers a table or a sweep shows (rates rounded to 0.01, times in seconds)."""
        return {
            "requests": self.workload.requests, "ok": len(self.ok_results), "errors": self.errors,
            "cancelled": self.cancelled, "error_rate": round(self.error_rate, 4),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "cache_source": self.cache_source,
            "short_responses": self.short_responses, "wall_s": round(self.wall_seconds, 3),
            "output_tps": round(self.output_tps, 2), "input_tps": round(self.input_tps, 2),
            "uncached_input_tps": round(self.uncached_input_tps, 2), "cache_tps": round(self.cache_tps, 2),
            "weighted_tps": round(self.weighted_tps, 2), "platform_score": round(platform_score(self.weighted_tps), 1),
            "score_shares": score_shares(self.output_tps, self.uncached_input_tps, self.cache_tps),
            "ttft_p50_s": rounded(self._pct("ttft", 50)), "ttft_p90_s": rounded(self._pct("ttft", 90)),
            "ttft_p95_s": rounded(self._pct("ttft", 95)), "ttft_p99_s": rounded(self._pct("ttft", 99)),
            "output_tps_p10": rounded(self._pct("output_tps", 10), 2),
            "latency_p50_s": rounded(self._pct("latency", 50)), "latency_p95_s": rounded(self._pct("latency", 95)),
            "latency_p99_s": rounded(self._pct("latency", 99)),
            "tpot_p50_s": rounded(self._pct("tpot", 50), 6), "tpot_p99_s": rounded(self._pct("tpot", 99), 6),
            "itl_p50_s": rounded(self.itl_pct(50), 6), "itl_p99_s": rounded(self.itl_pct(99), 6),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "url": self.url, "model": self.model, "started_at": self.started_at,
            "target": self.target, "profile": self.profile, "params": self.params,
            "startup_seconds": rounded(self.startup_seconds, 2), "host": self.host,
            "workload": self.workload.to_json(), "prompt_mode": self.prompt_mode,
            "score_weights": {"output_tps": OUTPUT_WEIGHT, "uncached_input_tps": UNCACHED_INPUT_WEIGHT,
                              "cache_tps": CACHED_WEIGHT},
            "summary": self.summary(), "repeats": self.repeats, "metrics_delta": self.metrics_delta,
            "notes": self.notes,
            "requests": [r.to_json() for r in self.results],
        }
