"""The numbers of a bench: the competition's score, percentiles, the Output-TPS plateau, vLLM's /metrics counters."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from ..serve.openai_wire import parse_metrics

#: Score = Output TPS x 16.796 + Input TPS x 2.799 + Cache TPS x 0.56 (the competition's published weights:
#: generated tokens/s, prompt tokens processed/s, prompt tokens served from the prefix cache/s).
SCORE_OUTPUT_WEIGHT = 16.796
SCORE_INPUT_WEIGHT = 2.799
SCORE_CACHE_WEIGHT = 0.56

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


def score(output_tps: float, input_tps: float, cache_tps: float) -> float:
    """The competition's score of one measurement."""
    return output_tps * SCORE_OUTPUT_WEIGHT + input_tps * SCORE_INPUT_WEIGHT + cache_tps * SCORE_CACHE_WEIGHT


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
