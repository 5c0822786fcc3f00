"""Short replays that predict the full one: whole sessions, stratified, and the full replay's score with an interval.

* :func:`sessions` -- a replay file's sessions, found by content: a request joins the session of the latest earlier
  request whose messages are a proper prefix of its own (with the same tools): an agent's next turn.  Prefix reuse
  inside a session stays intact when the sample takes whole sessions.
* :func:`choose` -- ``n`` requests' worth of whole sessions, stratified by the session's input-length bucket (the
  harness's TTFT buckets), tools, images and several system messages: each stratum gets its share of ``n`` by
  its share of the file's requests, its sessions drawn at random (``seed``); the chosen ones replay in file order.
* :func:`predict` -- from the sampled run's records, the full replay's weighted_tps (and platform_score), the three
  per-minute rates and the wall time, each with a 95 % interval: a stratified ratio estimator over sessions
  (clusters), its variance by linearisation (a stratum with one sampled session borrows the pooled variance).
  **Reuse across sessions**: sessions of one agent kind share a head (system messages and tools); in the full
  replay only the first session of a head prefills it, in a sample the first *sampled* one does.  Such a
  request's head tokens (measured as what later sampled sessions of that head got from the cache) are moved
  from the uncached to the cached term, and its time shortened by their share of its prefill, before scaling
  up; the correction shrinks as N grows.  The predicted wall time says whether the time cap would cut the
  replay.

Pure functions over requests and records: the runner (``replay.py``) sends the chosen requests.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .evaluator import RequestRecord, bucket_of
from .metrics import CACHED_WEIGHT, OUTPUT_WEIGHT, UNCACHED_INPUT_WEIGHT, platform_score
from .replay_workload import ReplayRequest

Z95 = 1.96


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def approx_tokens(request: ReplayRequest) -> int:
    """The request's input length: the generator's count when it has one, else its text's characters / 4."""
    planned = request.planned_input
    if planned is not None:
        return planned
    body = request.body
    return len(json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False)) // 4


def head_of(request: ReplayRequest) -> str:
    """What sessions of one agent kind share: the system messages before the first other message, and tools."""
    head = []
    for message in request.body.get("messages") or []:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        head.append(message)
    return _digest([head, request.body.get("tools")])


def _has_image(request: ReplayRequest) -> bool:
    for message in request.body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("image_url", "input_image",
                                                                                         "image") for p in content):
            return True
    return False


@dataclass(frozen=True)
class Session:
    index: int  # order of its first request in the file
    requests: tuple[int, ...]  # indexes of its requests in the file, in order
    stratum: str
    head: str


def sessions(requests: Sequence[ReplayRequest]) -> list[Session]:
    """The file's sessions (see the module), in order of their first request."""
    owner: dict[str, int] = {}  # digest of a full message list (+ tools) -> the session that sent it last
    members: list[list[int]] = []
    of_request: list[int] = []
    for i, request in enumerate(requests):
        messages = request.body.get("messages") or []
        tools = request.body.get("tools")
        found = None
        for cut in range(len(messages) - 1, 0, -1):
            found = owner.get(_digest([messages[:cut], tools]))
            if found is not None:
                break
        if found is None:
            found = len(members)
            members.append([])
        members[found].append(i)
        of_request.append(found)
        owner[_digest([messages, tools])] = found
    out = []
    for s, indexes in enumerate(members):
        first = requests[indexes[0]]
        longest = max(approx_tokens(requests[i]) for i in indexes)
        several = sum(1 for m in first.body.get("messages") or [] if isinstance(m, dict)
                      and m.get("role") == "system") > 1
        stratum = "/".join((bucket_of(max(1, longest)) or "lt_6k", "tools" if first.body.get("tools") else "no-tools",
                            "image" if any(_has_image(requests[i]) for i in indexes) else "text",
                            "multi-system" if several else "one-system"))
        out.append(Session(s, tuple(indexes), stratum, head_of(first)))
    return out


def choose(all_sessions: Sequence[Session], n: int, seed: int) -> list[Session]:
    """About ``n`` requests of whole sessions, stratified (see the module), in file order."""
    total = sum(len(s.requests) for s in all_sessions)
    if n >= total:
        return list(all_sessions)
    rng = random.Random(f"imageforge-sample:{seed}")
    by_stratum: dict[str, list[Session]] = {}
    for s in all_sessions:
        by_stratum.setdefault(s.stratum, []).append(s)
    chosen: list[Session] = []
    for name in sorted(by_stratum):
        group = by_stratum[name]
        want = n * sum(len(s.requests) for s in group) / total
        order = list(group)
        rng.shuffle(order)
        taken = 0
        for s in order:
            # take a session while that brings the stratum's count closer to its share (at least one per stratum)
            if chosen and taken and abs(taken + len(s.requests) - want) >= abs(taken - want):
                continue
            chosen.append(s)
            taken += len(s.requests)
            if taken >= want:
                break
    return sorted(chosen, key=lambda s: s.index)


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _terms(records: Sequence[RequestRecord]) -> tuple[float, float, float, float]:
    """Output, uncached, cached tokens and seconds of a session's successful requests."""
    ok = [r for r in records if r.ok]
    return (float(sum(r.completion_tokens for r in ok)), float(sum(r.uncached_tokens for r in ok)),
            float(sum(r.cached for r in ok)), float(sum(r.total_s or 0.0 for r in records)))


def _head_correction(chosen: Sequence[Session], population: Sequence[Session],
                     records: Mapping[int, RequestRecord]) -> dict[int, tuple[float, float]]:
    """Per sampled session whose first request prefilled a head that the full replay would have had cached:
    (head tokens to move from uncached to cached, seconds to take off)."""
    first_of_head: dict[str, int] = {}
    for s in population:
        first_of_head.setdefault(s.head, s.index)
    seen: dict[str, list[Session]] = {}
    for s in chosen:
        seen.setdefault(s.head, []).append(s)
    out: dict[int, tuple[float, float]] = {}
    for head, group in seen.items():
        cold = group[0]
        if first_of_head[head] == cold.index:
            continue  # the full replay prefills this head here too
        later = [records[g.requests[0]].cached for g in group[1:] if g.requests[0] in records
                 and records[g.requests[0]].ok]
        first = records.get(cold.requests[0])
        if not later or first is None or not first.ok or first.uncached_tokens <= 0:
            continue  # no measure of the head: left as it is (the interval carries it)
        tokens = min(float(statistics.median(later)), float(first.uncached_tokens))
        prefill = first.ttft_s or 0.0
        out[cold.index] = (tokens, prefill * tokens / first.uncached_tokens)
    return out


def predict(chosen: Sequence[Session], population: Sequence[Session], records: Sequence[RequestRecord],
            sample_wall_s: float, *, time_cap: float | None = None) -> dict[str, Any]:
    """The full replay's figures from a sampled run (``records[i].index`` = the position in the sampled run, the
    run replaying the chosen sessions' requests in order)."""
    order = [i for s in chosen for i in s.requests]
    by_file = {order[r.index]: r for r in records if r.index < len(order)}
    fix = _head_correction(chosen, population, by_file)
    strata: dict[str, list[tuple[float, float, float, float]]] = {}
    for s in chosen:
        out, unc, cac, sec = _terms([by_file[i] for i in s.requests if i in by_file])
        moved, saved = fix.get(s.index, (0.0, 0.0))
        strata.setdefault(s.stratum, []).append((out, unc - moved, cac + moved, max(0.0, sec - saved)))
    sizes: dict[str, int] = {}
    for s in population:
        sizes[s.stratum] = sizes.get(s.stratum, 0) + 1
    measured_seconds = sum(r.total_s or 0.0 for r in records)
    gaps = sample_wall_s / measured_seconds if measured_seconds > 0 else 1.0  # wall / the sum of request times

    def expand(values: Mapping[str, list[float]]) -> float:
        return sum(sizes[h] / len(v) * sum(v) for h, v in values.items())

    def column(k: int) -> dict[str, list[float]]:
        return {h: [row[k] for row in rows] for h, rows in strata.items()}

    seconds = expand(column(3))
    wall = seconds * gaps
    weighted_rows = {h: [OUTPUT_WEIGHT * o + UNCACHED_INPUT_WEIGHT * u + CACHED_WEIGHT * c for o, u, c, _ in rows]
                     for h, rows in strata.items()}

    def ratio(numerators: Mapping[str, list[float]], scale: float) -> Interval:
        total = expand(numerators)
        r0 = total / seconds if seconds else 0.0
        residuals = {h: [numerators[h][j] - r0 * strata[h][j][3] for j in range(len(strata[h]))] for h in strata}
        pooled = [e for v in residuals.values() for e in v]
        pooled_var = statistics.variance(pooled) if len(pooled) > 1 else 0.0
        var = 0.0
        for h, e in residuals.items():
            n_h, big_n = len(e), sizes[h]
            s2 = statistics.variance(e) if n_h > 1 else pooled_var
            var += big_n ** 2 * (1 - n_h / big_n) * s2 / n_h
        sd = math.sqrt(var) / seconds if seconds else 0.0
        value = r0 / gaps * scale
        return Interval(value, max(0.0, (r0 - Z95 * sd) / gaps * scale), (r0 + Z95 * sd) / gaps * scale)

    weighted = ratio(weighted_rows, 1.0)
    return {
        "sessions_sampled": len(chosen), "sessions_total": len(population),
        "requests_sampled": len(order), "requests_total": sum(len(s.requests) for s in population),
        "strata": {h: {"sampled": len(v), "sessions": sizes[h]} for h, v in sorted(strata.items())},
        "head_corrections": len(fix),
        "weighted_tps": weighted.to_json(),
        "platform_score": Interval(platform_score(weighted.value), platform_score(weighted.low),
                                   platform_score(weighted.high)).to_json(),
        "output_tpm": ratio(column(0), 60.0).to_json(),
        "uncached_input_tpm": ratio(column(1), 60.0).to_json(),
        "cached_tpm": ratio(column(2), 60.0).to_json(),
        "wall_time_s": wall,
        "time_cap_s": time_cap,
        "cut_by_time_cap": None if time_cap is None else wall > time_cap,
    }


def prediction_lines(p: Mapping[str, Any]) -> list[str]:
    w, ps = p["weighted_tps"], p["platform_score"]
    cap = p["time_cap_s"]
    cut = ("" if cap is None else
           f"; the {cap:,.0f} s time cap {'WOULD cut it' if p['cut_by_time_cap'] else 'would not cut it'}")
    return [
        f"sample: {p['requests_sampled']} of {p['requests_total']} requests, {p['sessions_sampled']} of "
        f"{p['sessions_total']} whole sessions in {len(p['strata'])} strata; {p['head_corrections']} cold shared "
        "heads moved to the cached term",
        f"PREDICTED full replay: weighted_tps {w['value']:,.1f} (95 % interval {w['low']:,.1f} - {w['high']:,.1f}); "
        f"platform_score {ps['value']:,.0f} ({ps['low']:,.0f} - {ps['high']:,.0f})",
        f"predicted wall time {p['wall_time_s']:,.0f} s{cut}",
    ]
