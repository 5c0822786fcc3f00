"""The numbers of a bench: the replay's weighted rate (the platform's score), percentiles, the Output-TPS plateau,
vLLM's /metrics counters."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from ..serve.openai_wire import parse_metrics

#: The replay's score as the platform computes it (facts note, "The replay's score", checked against two
#: official evaluator logs to 5 digits): weighted tokens per wall second =
#: 16.796 x output tokens/s + 2.799 x UNCACHED input tokens/s + 0.56 x cached input tokens/s, every rate an
#: aggregate over the run's wall time (cached tokens are their own term, never inside the input term).  The
#: platform prints that rate times :data:`PLATFORM_FACTOR` (= its ``38.582 x (...tpm...) / 60``).
OUTPUT_WEIGHT = 16.796
UNCACHED_INPUT_WEIGHT = 2.799
CACHED_WEIGHT = 0.56
PLATFORM_FACTOR = 38.582
#: The three terms of the weighted rate, in the order the JSON's ``score_shares`` lists them.
SCORE_TERMS = ("output", "uncached_input", "cached")

#: A sweep point whose Output TPS is within this fraction of the best one is "on the plateau".
PLATEAU_TOLERANCE = 0.05

#: /metrics counters for prompt tokens served from the prefix cache, most specific first (vLLM V1 names;
#: prometheus_client adds ``_total`` to counters, older exporters do not).
CACHED_TOKEN_COUNTERS = (
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_cached",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
)
PROMPT_TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens")
GENERATION_TOKEN_COUNTERS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
METRICS_SETTLE = 5.0  # seconds to wait for /metrics counters to catch up with the last response


def weighted_terms(output_rate: float, uncached_input_rate: float, cached_rate: float) -> dict[str, float]:
    """Each term of the weighted rate (tokens per wall second times its weight), keyed as :data:`SCORE_TERMS`."""
    return {"output": OUTPUT_WEIGHT * output_rate, "uncached_input": UNCACHED_INPUT_WEIGHT * uncached_input_rate,
            "cached": CACHED_WEIGHT * cached_rate}


def weighted_tps(output_rate: float, uncached_input_rate: float, cached_rate: float) -> float:
    """The replay's score in weighted tokens per wall second (the number teams quote, "600 points")."""
    return sum(weighted_terms(output_rate, uncached_input_rate, cached_rate).values())


def platform_score(weighted: float) -> float:
    """The platform's printed figure for a weighted rate: ``weighted x 38.582``."""
    return weighted * PLATFORM_FACTOR


def score_shares(output_rate: float, uncached_input_rate: float, cached_rate: float) -> dict[str, float] | None:
    """Each term's share (0..1) of the weighted rate; None when the rate is 0."""
    terms = weighted_terms(output_rate, uncached_input_rate, cached_rate)
    total = sum(terms.values())
    return None if total <= 0 else {k: v / total for k, v in terms.items()}


def from_tpm(output_tpm: float, uncached_input_tpm: float, cached_tpm: float) -> float:
    """The weighted rate from per-minute aggregates, as the platform's log prints them."""
    return weighted_tps(output_tpm / 60, uncached_input_tpm / 60, cached_tpm / 60)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) interpolated linearly between ranks (numpy's default ``linear``:
    rank ``(n - 1) * q / 100``); None if empty.  The one percentile of the bench, the replay and the sweep."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def mean(values: Iterable[float]) -> float | None:
    data = list(values)
    return sum(data) / len(data) if data else None


def plateau_index(values: Sequence[float | None], tolerance: float = PLATEAU_TOLERANCE) -> int | None:
    """The first point (in sweep order) whose value is within ``tolerance`` of the maximum, if a later point exists.

    With the points ordered by a growing parameter (max-num-seqs 1, 2, 4 ...) that is where the curve
    flattens: going further buys at most ``tolerance`` more.  None when the first such point is the last
    measured one (the curve is still rising: no plateau within the swept values) or nothing was measured.
    """
    known = [i for i, v in enumerate(values) if v is not None]
    if not known:
        return None
    top = max(v for v in values if v is not None)
    first = next(i for i in known if (values[i] or 0.0) >= top * (1 - tolerance))
    return first if first != known[-1] else None


def metrics_counters(text: str) -> dict[str, float]:
    """Prometheus text -> ``{name: value summed over label sets}`` for every ``vllm:`` series."""
    out: dict[str, float] = {}
    for name, _labels, value in parse_metrics(text):
        if name.startswith("vllm:") and not name.endswith("_created"):
            out[name] = out.get(name, 0.0) + value
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float],
                  names: Sequence[str]) -> tuple[str, float] | None:
    """The first of ``names`` present in both snapshots and its growth; None when none is there."""
    for name in names:
        if name in before and name in after:
            return name, max(0.0, after[name] - before[name])
    return None
