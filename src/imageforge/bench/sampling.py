"""Short replays that predict the full one: whole sessions, stratified, and the full replay's score with an interval.

* :func:`sessions` -- a replay file's sessions, found by content: a request joins the session of the latest earlier
  request whose messages are a proper prefix of its own (with the same tools): an agent's next turn.  Prefix reuse
  inside a session stays intact when the sample takes whole sessions.
* :func:`choose` -- ``n`` requests' worth of whole sessions, stratified by the session's input-length bucket (the
  harness's TTFT buckets), tools, images and several system messages: each stratum gets its share of ``n`` by
  its share of the file's requests, its sessions drawn at random (``seed``); the chosen ones replay in file order.
* :func:`predict` -- from the sampled run's records, the full replay's weighted_tps (and platform_score), the three
  per-minute rates and the wall time, each with a 95 % interval: a stratified ratio estimator over sessions
  (clusters), its interval a delete-a-group jackknife over contiguous groups of sessions in run order with
  Student's t (:func:`predict`: the sample's composition and the server's drift while it ran).
  **Passes**: the sample can run several times (``--passes R``), each pass on a prefix cache of its own
  (:func:`cold_cache`); the spread between the passes is the run-to-run spread of the machine, which no single
  run can show, and goes into the interval with the jackknife's (Welch-Satterthwaite degrees of freedom).
  **Reuse across sessions**: sessions of one agent kind share a head (system messages and tools); in the full
  replay only the first session of a head prefills it, in a sample the first *sampled* one does.  Such a
  request's head tokens (measured as what later sampled sessions of that head got from the cache) are moved
  from the uncached to the cached term, and its time shortened by their share of its prefill, before scaling
  up; the correction shrinks as N grows.  The predicted wall time says whether the time cap would cut the
  replay.

Pure functions over requests and records: the runner (``replay.py``) sends the chosen requests.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .evaluator import RequestRecord, bucket_of
from .metrics import CACHED_WEIGHT, OUTPUT_WEIGHT, UNCACHED_INPUT_WEIGHT, platform_score
from .replay_workload import ReplayRequest


def cold_cache(requests: Sequence[ReplayRequest], tag: str) -> list[ReplayRequest]:
    """The requests with ``[tag] `` in front of their first message's text: a prefix cache of their own (no
    earlier run on the server, and no other pass, shares a block with them), while the sharing inside the run
    (a session's turns, the heads sessions share) stays as it is. A few tokens more per request."""
    out = []
    for r in requests:
        body = copy.deepcopy(r.body)
        messages = body.get("messages") or []
        if messages:
            first = next((m for m in messages if m.get("role") == "system"), messages[0])
            content = first.get("content")
            if isinstance(content, list):
                first["content"] = [{"type": "text", "text": f"[{tag}]"}, *content]
            else:
                first["content"] = f"[{tag}] {content or ''}"
        out.append(ReplayRequest(body, r.meta, r.source))
    return out


@dataclass(frozen=True)
class Pass:
    """One run of the sampled requests: their records (``index`` = position in the run) and its wall time."""

    records: Sequence[RequestRecord]
    wall_s: float


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


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, the Cornish-Fisher expansion above (within
    0.2 % of the tables from 3 on)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * v ** 4))


MAX_GROUPS = 10


def time_groups(count: int) -> list[range]:
    """The sampled sessions, in the order they ran, cut into contiguous groups for the jackknife: half as many
    groups as sessions, at most :data:`MAX_GROUPS`, at least 2."""
    g = max(2, min(MAX_GROUPS, count // 2))
    bounds = [round(k * count / g) for k in range(g + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(g) if bounds[k + 1] > bounds[k]]


Row = tuple[str, float, float, float, float]  # stratum; output, uncached, cached tokens; seconds


def _welch_df(parts: Sequence[tuple[float, int]]) -> int:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates (variance, its df); at least 1."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if df > 0 and v > 0)
    return max(1, int(total * total / denom)) if denom > 0 else max(1, min(df for _, df in parts))


def predict(chosen: Sequence[Session], population: Sequence[Session], passes: Sequence[Pass], *,
            time_cap: float | None = None) -> dict[str, Any]:
    """The full replay's figures from the sampled run's passes (each replaying the chosen sessions' requests in
    order).

    Each figure is a stratified ratio (expanded tokens / expanded seconds), averaged over the passes. Its
    interval is for one full replay on the same server, with Student's t over two variance terms:

    * a delete-a-group jackknife over contiguous groups of sessions in the order they ran (:func:`time_groups`),
      each replicate averaged over the passes: the groups differ by what was sampled *and* by when they ran, so
      this carries the sample's composition and the server's drift within a run;
    * with two passes or more, the variance between the passes' figures, times ``1 + 1/R``: the machine's
      run-to-run spread, once for the passes' mean and once for the full replay being predicted.

    With one pass the second term is missing (``interval_covers`` says so): a change of the machine's state
    slower than the run is then not in the interval."""
    if len(chosen) < 2:
        raise ConfigError(f"a sampled replay needs at least 2 whole sessions (got {len(chosen)}): raise --sample")
    if not passes:
        raise ConfigError("a sampled replay needs at least one pass")
    order = [i for s in chosen for i in s.requests]
    sizes: dict[str, int] = {}
    for s in population:
        sizes[s.stratum] = sizes.get(s.stratum, 0) + 1

    def pass_rows(one: Pass) -> tuple[list[Row], float, int]:
        by_file = {order[r.index]: r for r in one.records if r.index < len(order)}
        fix = _head_correction(chosen, population, by_file)
        rows: list[Row] = []
        for s in chosen:
            out, unc, cac, sec = _terms([by_file[i] for i in s.requests if i in by_file])
            moved, saved = fix.get(s.index, (0.0, 0.0))
            rows.append((s.stratum, out, unc - moved, cac + moved, max(0.0, sec - saved)))
        measured_seconds = sum(r.total_s or 0.0 for r in one.records)
        gaps = one.wall_s / measured_seconds if measured_seconds > 0 else 1.0  # wall / the sum of request times
        return rows, gaps, len(fix)

    runs = [pass_rows(one) for one in passes]

    def expanded(part: Sequence[Row]) -> tuple[float, float, float, float]:
        """Output, uncached, cached tokens and seconds of the full replay, from ``part``'s strata (a stratum
        missing from ``part`` is left out of both sides of every ratio)."""
        counts: dict[str, int] = {}
        for row in part:
            counts[row[0]] = counts.get(row[0], 0) + 1
        totals = [0.0, 0.0, 0.0, 0.0]
        for stratum, *values in part:
            factor = sizes[stratum] / counts[stratum]
            for k, value in enumerate(values):
                totals[k] += factor * value
        return totals[0], totals[1], totals[2], totals[3]

    def rates(part: Sequence[Row], gaps: float) -> tuple[float, float, float, float]:
        """Weighted tokens, output, uncached and cached tokens per second of wall time."""
        out, unc, cac, sec = expanded(part)
        wall = sec * gaps
        if wall <= 0:
            return 0.0, 0.0, 0.0, 0.0
        return ((OUTPUT_WEIGHT * out + UNCACHED_INPUT_WEIGHT * unc + CACHED_WEIGHT * cac) / wall,
                out / wall, unc / wall, cac / wall)

    def mean_over_passes(per: Sequence[tuple[float, float, float, float]]) -> list[float]:
        return [statistics.fmean(p[k] for p in per) for k in range(4)]

    per_pass = [rates(rows, gaps) for rows, gaps, _ in runs]
    whole = mean_over_passes(per_pass)
    groups = time_groups(len(chosen))
    replicates = [mean_over_passes([rates([row for j, row in enumerate(rows) if j not in g], gaps)
                                    for rows, gaps, _ in runs]) for g in groups]
    r = len(passes)

    def interval(k: int, scale: float) -> Interval:
        values = [rep[k] for rep in replicates]
        mean = statistics.fmean(values)
        jack = (len(values) - 1) / len(values) * sum((v - mean) ** 2 for v in values)
        parts = [(jack, len(groups) - 1)]
        if r > 1:
            parts.append((statistics.variance([p[k] for p in per_pass]) * (1 + 1 / r), r - 1))
        half = t_quantile(0.975, _welch_df(parts)) * math.sqrt(sum(v for v, _ in parts))
        return Interval(whole[k] * scale, max(0.0, (whole[k] - half) * scale), (whole[k] + half) * scale)

    weighted = interval(0, 1.0)
    wall = statistics.fmean(expanded(rows)[3] * gaps for rows, gaps, _ in runs)
    return {
        "sessions_sampled": len(chosen), "sessions_total": len(population),
        "requests_sampled": len(order), "requests_total": sum(len(s.requests) for s in population),
        "strata": {h: {"sampled": sum(1 for row in runs[0][0] if row[0] == h), "sessions": sizes[h]}
                   for h in sorted({row[0] for row in runs[0][0]})},
        "head_corrections": runs[0][2],
        "interval_groups": len(groups),
        "passes": r,
        "passes_weighted_tps": [p[0] for p in per_pass],
        "interval_covers": ("the sample's composition, the server's drift within a run"
                            + (f" and the run-to-run spread of {r} passes" if r > 1 else
                               "; not the run-to-run spread (--passes 3 adds it)")),
        "weighted_tps": weighted.to_json(),
        "platform_score": Interval(platform_score(weighted.value), platform_score(weighted.low),
                                   platform_score(weighted.high)).to_json(),
        "output_tpm": interval(1, 60.0).to_json(),
        "uncached_input_tpm": interval(2, 60.0).to_json(),
        "cached_tpm": interval(3, 60.0).to_json(),
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
        f"the interval covers {p['interval_covers']}"
        + ("" if p["passes"] < 2 else " (passes' weighted_tps: "
           + ", ".join(f"{v:,.1f}" for v in p["passes_weighted_tps"]) + ")"),
    ]
