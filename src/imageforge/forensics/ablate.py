"""``invoke ablate``: which step is worth its risk -- the plan, the interleaved schedule, the table.

Planning (pure): for each chosen step, one variant = the full step list without that step and
without every step that ``requires:`` it, transitively (:func:`graph.dependents`).  A step marked
``required: true`` is listed and skipped, and so is a step whose removal would drop a required
dependent.  Default choice: every step of the chain (shared, then the profile's).

In place (one server at a time): :func:`one_at_a_time_slots` -- full, each variant, full again -- and
:func:`bracketed_results` pairs each variant with the geometric mean of the full runs before and after it.

Schedule (ABAB): one block per variant; in a block the full image and the
variant alternate ``full, variant, full, variant, ...`` for ``repeats`` rounds.  The full image's
server stays up for the whole ablation and each variant's server is started once, for its block,
so at most two servers run at a time (this machine: 2 cores, 24 GiB).  A variant's deltas are
medians of the paired ratios (variant run r / the full run just before it), so slow drift of a
shared machine cancels; the spread is the min..max of those paired weighted_tps ratios.

How ``ablate_runner`` wires it: ``plan = plan_ablation(chain_steps, chosen, repeats)``; build every
``variant.steps`` image (the kept steps in order, the profile's serving config on top; cache hits
up to the first removed step); for each ``plan.schedule`` run bench the named server with the SAME
bench options and turn its BenchResult into :class:`Metrics`; optionally run equiv for each variant
against the full image (or the base) and pass ``{variant step: "pass"|"FAIL"}``; then
``table = summarize(plan, results, equiv)`` and print ``table.text()``, writing ``table.to_json()``
and ``table.csv()`` under ``--out``.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from .graph import StepLike, check_ids, dependents

Role = Literal["full", "variant"]
FULL = "(full)"


@dataclass(frozen=True)
class Variant:
    step: str  # the step ablated
    dropped: tuple[str, ...]  # it and every step that requires it, in manifest order
    steps: tuple[str, ...]  # the steps the variant image keeps, in order


@dataclass(frozen=True)
class Skipped:
    step: str
    reason: str


@dataclass(frozen=True)
class ScheduledRun:
    index: int
    block: int  # which variant's block
    round: int
    role: Role
    variant: str  # the ablated step of the block

    @property
    def image(self) -> str:
        """What this run benches: FULL or the ablated step's id."""
        return FULL if self.role == "full" else self.variant


@dataclass(frozen=True)
class AblationPlan:
    full: tuple[str, ...]
    variants: tuple[Variant, ...]
    skipped: tuple[Skipped, ...]
    repeats: int
    schedule: tuple[ScheduledRun, ...]

    def text(self) -> str:
        lines = [f"ablate: {len(self.variants)} variant(s) x {self.repeats} rounds, ABAB against the full image "
                 f"({len(self.schedule)} bench runs)"]
        for v in self.variants:
            extra = f" (and its dependents {', '.join(v.dropped[1:])})" if len(v.dropped) > 1 else ""
            lines.append(f"  without {v.step}{extra}: {len(v.steps)} of {len(self.full)} steps")
        for s in self.skipped:
            lines.append(f"  skipped {s.step}: {s.reason}")
        return "\n".join(lines)


def plan_ablation(steps: Sequence[StepLike], chosen: Iterable[str] | None = None, repeats: int = 3) -> AblationPlan:
    """Variants, skipped steps and the interleaved schedule (see the module docstring)."""
    if repeats < 1:
        raise ConfigError("ablate --repeat must be at least 1", found=str(repeats))
    ids = [s.id for s in steps]
    picked = ids if chosen is None else check_ids(steps, chosen, "ablate --steps")
    required = {s.id for s in steps if s.required}
    variants: list[Variant] = []
    skipped: list[Skipped] = []
    for ident in picked:
        if ident in required:
            skipped.append(Skipped(ident, "required: true"))
            continue
        deps = dependents(steps, ident)
        needed = [d for d in deps if d in required]
        if needed:
            skipped.append(Skipped(ident, f"required step(s) {', '.join(needed)} require it"))
            continue
        dropped = (ident, *deps)
        variants.append(Variant(ident, dropped, tuple(i for i in ids if i not in dropped)))
    schedule: list[ScheduledRun] = []
    for block, variant in enumerate(variants):
        for r in range(repeats):
            roles: tuple[Role, Role] = ("full", "variant")
            for role in roles:
                schedule.append(ScheduledRun(len(schedule), block, r, role, variant.step))
    return AblationPlan(tuple(ids), tuple(variants), tuple(skipped), repeats, tuple(schedule))


# --------------------------------------------------------------------------- in place: one server at a time


@dataclass(frozen=True)
class ServerSlot:
    """One server of the in-place schedule: which steps are applied, what its bench runs are."""

    index: int
    role: Role
    label: str  # "full (before)", "without STEP", "full (after)"
    steps: tuple[str, ...]  # the steps applied for it
    block: int | None  # the variant's block (None: a full server)


def one_at_a_time_slots(plan: AblationPlan) -> tuple[ServerSlot, ...]:
    """In place the machine serves one thing at a time: full, each variant, full again (``n + 2`` starts).

    Each server gets ``plan.repeats`` bench runs in a row (round r of each server uses the same seed as round r
    of the ABAB schedule); a variant's run r is paired with the geometric mean of the full runs r before and
    after (:func:`bracketed_results`), so a drift of the machine over the whole ablation cancels to first order.
    """
    slots = [ServerSlot(0, "full", f"{FULL[1:-1]} (before)", plan.full, None)]
    for block, variant in enumerate(plan.variants):
        slots.append(ServerSlot(len(slots), "variant", f"without {variant.step}", variant.steps, block))
    slots.append(ServerSlot(len(slots), "full", f"{FULL[1:-1]} (after)", plan.full, None))
    return tuple(slots)


def _geomean(a: float, b: float) -> float:
    return float((a * b) ** 0.5) if a > 0 and b > 0 else (a + b) / 2


def bracket(before: Metrics | None, after: Metrics | None) -> Metrics | None:
    """The full image's numbers at a point between two full runs: their geometric means (one of them alone)."""
    if before is None or after is None:
        return before or after
    return Metrics(*(_geomean(getattr(before, m), getattr(after, m)) for m in METRICS))


def bracketed_results(plan: AblationPlan, before: Sequence[Metrics | None], after: Sequence[Metrics | None],
                      variants: Mapping[int, Sequence[Metrics | None]]) -> list[RunResult]:
    """The runs of the in-place schedule as :func:`summarize` reads the ABAB ones (same blocks and rounds)."""
    out: list[RunResult] = []
    for run in plan.schedule:
        if run.role == "full":
            a = before[run.round] if run.round < len(before) else None
            b = after[run.round] if run.round < len(after) else None
            out.append(RunResult(run, bracket(a, b)))
        else:
            got = variants.get(run.block, ())
            out.append(RunResult(run, got[run.round] if run.round < len(got) else None))
    return out


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Metrics:
    """What ablate needs of one bench run (``ablate_runner`` maps a BenchResult onto it)."""

    weighted_tps: float  # the replay score's formula on the bench's wall-clock rates
    output_tps: float
    uncached_input_tps: float
    cache_tps: float


@dataclass(frozen=True)
class RunResult:
    run: ScheduledRun
    metrics: Metrics | None  # None: the run (or its server) failed


METRICS = ("weighted_tps", "output_tps", "uncached_input_tps", "cache_tps")


@dataclass(frozen=True)
class Row:
    step: str
    dropped: tuple[str, ...]
    weighted_tps: float | None  # median over the image's runs
    deltas: Mapping[str, float | None]  # metric -> median paired ratio - 1 (None: no pair, or full value 0)
    spread: tuple[float, float] | None  # min, max of the paired weighted_tps ratios - 1
    pairs: int
    failed_runs: int
    equiv: str


@dataclass(frozen=True)
class AblationTable:
    full: Row
    rows: tuple[Row, ...]
    skipped: tuple[Skipped, ...]
    repeats: int

    def to_json(self) -> dict[str, Any]:
        def row(r: Row) -> dict[str, Any]:
            return {"step": r.step, "dropped": list(r.dropped), "weighted_tps": r.weighted_tps,
                    **{f"delta_{m}": r.deltas.get(m) for m in METRICS},
                    "spread": list(r.spread) if r.spread else None, "pairs": r.pairs, "failed_runs": r.failed_runs,
                    "equiv": r.equiv}

        return {"repeats": self.repeats, "schedule": "ABAB per variant block, paired ratios",
                "full": row(self.full), "variants": [row(r) for r in self.rows],
                "skipped": [{"step": s.step, "reason": s.reason} for s in self.skipped]}

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["step", "dropped", "weighted_tps", "delta_weighted_tps", "delta_output_tps",
                         "delta_uncached_input_tps",
                         "delta_cache_tps", "spread_min", "spread_max", "pairs", "failed_runs", "equiv"])
        for r in (self.full, *self.rows):
            writer.writerow([r.step, " ".join(r.dropped), _num(r.weighted_tps),
                             *(_num(r.deltas.get(m)) for m in METRICS),
                             _num(r.spread[0] if r.spread else None), _num(r.spread[1] if r.spread else None),
                             r.pairs, r.failed_runs, r.equiv])
        for s in self.skipped:
            writer.writerow([s.step, "", "", "", "", "", "", "", "", 0, 0, f"skipped: {s.reason}"])
        return out.getvalue()

    def text(self) -> str:
        head = (f"{'step':<28} {'wtd TPS':>9} {'d wtd':>8} {'d out':>8} {'d in':>8} {'d cache':>8} "
                f"{'spread':>15} {'n':>3} {'equiv':>6}")
        lines = [head]
        for r in (self.full, *self.rows):
            spread = f"{_pct(r.spread[0])}..{_pct(r.spread[1])}" if r.spread else "-"
            rate = "-" if r.weighted_tps is None else f"{r.weighted_tps:.1f}"
            lines.append(f"{r.step:<28} {rate:>9} " + " ".join(f"{_pct(r.deltas.get(m)):>8}" for m in METRICS)
                         + f" {spread:>15} {r.pairs:>3} {r.equiv:>6}")
            if r.failed_runs:
                lines.append(f"{'':<28} {r.failed_runs} run(s) failed and are left out")
        for s in self.skipped:
            lines.append(f"{s.step:<28} skipped: {s.reason}")
        lines.append("deltas: median of paired ratios (variant / the full run just before it) - 1; "
                     "positive = faster without the step")
        return "\n".join(lines)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(plan: AblationPlan, results: Sequence[RunResult],
              equiv: Mapping[str, str] | None = None) -> AblationTable:
    """The table: per variant, median weighted_tps, median paired deltas and their spread."""
    equiv = equiv or {}
    by_key = {(r.run.block, r.run.round, r.run.role): r.metrics for r in results}
    full_runs = [r.metrics for r in results if r.run.role == "full"]
    full_ok = [m for m in full_runs if m is not None]
    full_scores = [m.weighted_tps for m in full_ok]
    full_median = _median(full_scores)
    full_spread = None
    if full_median:
        full_spread = (min(full_scores) / full_median - 1, max(full_scores) / full_median - 1)
    full = Row(FULL, (), full_median, {m: 0.0 for m in METRICS} if full_ok else {}, full_spread, len(full_ok),
               len(full_runs) - len(full_ok), equiv.get(FULL, "ref"))
    rows: list[Row] = []
    for block, variant in enumerate(plan.variants):
        ratios: dict[str, list[float]] = {m: [] for m in METRICS}
        scores: list[float] = []
        failed = pairs = 0
        for r in range(plan.repeats):
            a = by_key.get((block, r, "full"))
            b = by_key.get((block, r, "variant"))
            if (block, r, "variant") in by_key and b is None:
                failed += 1
            if b is not None:
                scores.append(b.weighted_tps)
            if a is None or b is None:
                continue
            pairs += 1
            for m in METRICS:
                base = getattr(a, m)
                if base:
                    ratios[m].append(getattr(b, m) / base - 1)
        deltas = {m: _median(ratios[m]) for m in METRICS}
        spread = (min(ratios["weighted_tps"]), max(ratios["weighted_tps"])) if ratios["weighted_tps"] else None
        rows.append(Row(variant.step, variant.dropped, _median(scores), deltas, spread, pairs, failed,
                        equiv.get(variant.step, "-")))
    return AblationTable(full, tuple(rows), plan.skipped, plan.repeats)
