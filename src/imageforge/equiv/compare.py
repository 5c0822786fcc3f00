"""The pure comparison of two servers' evidence, the gate, and its reports.

Definitions (teacher-forced: both servers scored the SAME token sequence, so one early
difference cannot cascade; every measure is over the REFERENCE's top-k at each position):

* **|delta logprob|** of one (position, token) pair: ``|ref_logprob - cand_logprob|`` for each of
  the reference's top-k tokens.  A reference top-k token the candidate did not return is scored
  at the candidate's smallest returned logprob at that position (an upper bound of its true
  logprob) and counted in ``missing``.
* **max / mean / p95**: over every pair of a prompt (per prompt) or of all prompts (overall,
  pooled).  p95 is the nearest-rank percentile: the ``ceil(0.95 n)``-th smallest of n values.
* **top-1 agreement**: fraction of positions where the reference's best token is also a best
  token of the candidate (its candidate logprob equals the candidate's best: ties agree).
* **KL estimate**: per position, KL(ref || cand) between the two distributions coarse-grained to
  k + 1 outcomes -- the reference's top-k tokens and one lumped "tail" bucket holding the rest
  of the mass (``1 - sum p``, ``1 - sum q``; the candidate's tail is floored at 1e-12, a result
  below 0 from rounding reads 0).  By the data-processing inequality this never exceeds the
  full-vocabulary KL, so it is a lower bound; reported as mean and max over positions.
* **first divergence**: index of the first token where the two greedy continuations differ
  (None: identical); informational, never gated (one bf16 flip may fork a continuation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import Problem, SmokeError
from ..manifest.tolerances import Tolerance
from .evidence import Evidence, Position, PromptEvidence, same_sequences

TAIL_FLOOR = 1e-12


class EquivError(SmokeError):
    """The image under test does not compute what the reference does within tolerance (exit 4)."""

    kind = "equivalence failure"


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class PositionDelta:
    """One position's measures."""

    deltas: tuple[float, ...]  # |delta| per reference top-k token, in the reference's order
    missing: int
    top1_agree: bool
    kl: float


def compare_position(ref: Position, cand: Position, k: int) -> PositionDelta:
    """Measures of one teacher-forced position (see the module docstring)."""
    top = ref.top(k)
    floor = cand.smallest_logprob()
    deltas: list[float] = []
    missing = 0
    p_sum = q_sum = kl = 0.0
    for token, r in top:
        c = cand.logprob(token)
        if c is None:
            missing += 1
            c = floor
        deltas.append(abs(r - c))
        p, q = math.exp(r), math.exp(c)
        p_sum += p
        q_sum += q
        kl += p * (r - c)
    p_tail = max(0.0, 1.0 - p_sum)
    q_tail = max(TAIL_FLOOR, 1.0 - q_sum)
    if p_tail > 0.0:
        kl += p_tail * (math.log(p_tail) - math.log(q_tail))
    ref_best = top[0][0]
    c_best = cand.logprob(ref_best)
    agree = c_best is not None and c_best >= cand.best_logprob()
    return PositionDelta(tuple(deltas), missing, agree, max(0.0, kl))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a shorter prefix diverges at its length); None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Stats:
    """Aggregates over a set of positions."""

    positions: int
    pairs: int
    max_abs: float
    mean_abs: float
    p95_abs: float
    top1_agree: int
    top1: float  # fraction 0..1
    kl_mean: float
    kl_max: float
    missing: int

    @staticmethod
    def of(rows: Sequence[PositionDelta]) -> Stats:
        deltas = [d for row in rows for d in row.deltas]
        agree = sum(1 for row in rows if row.top1_agree)
        kls = [row.kl for row in rows]
        return Stats(
            positions=len(rows),
            pairs=len(deltas),
            max_abs=max(deltas, default=0.0),
            mean_abs=sum(deltas) / len(deltas) if deltas else 0.0,
            p95_abs=nearest_rank(deltas, 0.95) if deltas else 0.0,
            top1_agree=agree,
            top1=agree / len(rows) if rows else 1.0,
            kl_mean=sum(kls) / len(kls) if kls else 0.0,
            kl_max=max(kls, default=0.0),
            missing=sum(row.missing for row in rows),
        )


@dataclass(frozen=True)
class PromptComparison:
    name: str
    stats: Stats
    first_divergence: int | None
    greedy_tokens: int
    worst_position: int | None  # index into the teacher-forced sequence of the largest |delta|


@dataclass(frozen=True)
class Comparison:
    reference: str
    candidate: str
    top_k: int
    prompts: tuple[PromptComparison, ...]
    overall: Stats

    @property
    def diverged(self) -> int:
        return sum(1 for p in self.prompts if p.first_divergence is not None)


def compare(reference: Evidence, candidate: Evidence, k: int | None = None) -> Comparison:
    """Compare two servers' evidence for the same sequences; ``k`` defaults to the reference's top_k."""
    k = k or reference.top_k
    mismatched = same_sequences(reference.prompts, candidate.prompts)
    if mismatched:
        raise EquivError(
            "the two servers did not score the same token sequences",
            expected="identical teacher-forced sequences (collect the candidate with collect_against(reference))",
            found="differs: " + ", ".join(mismatched),
        )
    rows_all: list[PositionDelta] = []
    prompts: list[PromptComparison] = []
    for ref_p, cand_p in zip(reference.prompts, candidate.prompts, strict=True):
        rows = [compare_position(r, c, k) for r, c in zip(ref_p.positions, cand_p.positions, strict=True)]
        rows_all += rows
        worst = max(range(len(rows)), key=lambda i: max(rows[i].deltas, default=0.0), default=None)
        prompts.append(PromptComparison(
            name=ref_p.name,
            stats=Stats.of(rows),
            first_divergence=first_divergence(ref_p.greedy, cand_p.greedy),
            greedy_tokens=len(ref_p.greedy),
            worst_position=None if worst is None else worst + 1,
        ))
    if not rows_all:
        raise EquivError("equiv compared nothing: no prompt has a scored position",
                         hint="give prompts of at least two tokens (or greedy_tokens >= 1)")
    return Comparison(reference.url, candidate.url, k, tuple(prompts), Stats.of(rows_all))


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class GateCheck:
    name: str
    value: float
    limit: float
    op: str  # "<=" or ">="
    passed: bool


@dataclass(frozen=True)
class Verdict:
    dtype: str
    passed: bool
    checks: tuple[GateCheck, ...]
    comparison: Comparison

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {
            "passed": self.passed,
            "dtype": self.dtype,
            "reference": c.reference,
            "candidate": c.candidate,
            "top_k": c.top_k,
            "checks": [asdict(check) for check in self.checks],
            "overall": asdict(c.overall),
            "greedy_diverged": c.diverged,
            "prompts": [{"name": p.name, **asdict(p.stats), "first_divergence": p.first_divergence,
                         "greedy_tokens": p.greedy_tokens, "worst_position": p.worst_position} for p in c.prompts],
        }

    def text(self) -> str:
        c = self.comparison
        lines = [
            f"equiv: {c.candidate} vs reference {c.reference} (teacher-forced, top-{c.top_k}, {self.dtype})",
            f"{'prompt':<12} {'pos':>5} {'max|d|':>10} {'mean|d|':>10} {'p95|d|':>10} {'top-1':>8} "
            f"{'KL mean':>10} {'miss':>5} {'greedy div':>10}",
        ]

        def row(name: str, s: Stats, div: str) -> str:
            return (f"{name:<12} {s.positions:>5} {s.max_abs:>10.3g} {s.mean_abs:>10.3g} {s.p95_abs:>10.3g} "
                    f"{100 * s.top1:>7.1f}% {s.kl_mean:>10.3g} {s.missing:>5} {div:>10}")

        for p in c.prompts:
            div = "none" if p.first_divergence is None else f"{p.first_divergence}/{p.greedy_tokens}"
            lines.append(row(p.name, p.stats, div))
        lines.append(row("overall", c.overall, f"{c.diverged}/{len(c.prompts)}"))
        lines.append(f"top-1 agreement {c.overall.top1_agree}/{c.overall.positions}; "
                     f"KL estimate max {c.overall.kl_max:.3g} nats")
        for check in self.checks:
            mark = "PASS" if check.passed else "FAIL"
            lines.append(f"{mark} {check.name} {check.value:.4g} {check.op} {check.limit:.4g}")
        if not self.checks:
            lines.append("no gate configured: report only")
        lines.append("equiv " + ("PASSED" if self.passed else "FAILED"))
        return "\n".join(lines)


def gate(comparison: Comparison, tolerance: Tolerance, dtype: str) -> Verdict:
    """Apply the active limits of ``tolerance`` (``top1_min`` is a floor, the others ceilings)."""
    s = comparison.overall
    values = {"max_abs": s.max_abs, "mean_abs": s.mean_abs, "p95_abs": s.p95_abs, "top1_min": s.top1,
              "kl_max": s.kl_mean}
    checks: list[GateCheck] = []
    for name, limit in tolerance.gates().items():
        value = values[name]
        if name == "top1_min":
            checks.append(GateCheck("top1", value, limit, ">=", value >= limit))
        else:
            checks.append(GateCheck("kl_mean" if name == "kl_max" else name, value, limit, "<=", value <= limit))
    return Verdict(dtype, all(c.passed for c in checks), tuple(checks), comparison)


def raise_if_failed(verdict: Verdict) -> None:
    """Exit 4 (EquivError) naming every exceeded limit."""
    if verdict.passed:
        return
    failed = [c for c in verdict.checks if not c.passed]
    problems = [Problem(f"{c.name} {c.value:.4g} not {c.op} {c.limit:.4g}") for c in failed]
    raise EquivError(
        f"outputs differ from the reference beyond the {verdict.dtype} tolerance",
        expected=", ".join(f"{c.name} {c.op} {c.limit:.4g}" for c in failed),
        found=", ".join(f"{c.name} {c.value:.4g}" for c in failed),
        hint="a patch changed the math; `invoke bisect --check equiv` finds the step",
        problems=problems if len(problems) > 1 else (),
    )


__all__ = [
    "Comparison",
    "EquivError",
    "GateCheck",
    "PromptComparison",
    "PromptEvidence",
    "Stats",
    "Verdict",
    "compare",
    "compare_position",
    "first_divergence",
    "gate",
    "nearest_rank",
    "raise_if_failed",
]
