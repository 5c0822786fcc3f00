"""``invoke bisect``: the first step whose image fails a check, as a pure search.

The search knows nothing of Docker: it calls ``probe(k) -> Outcome`` for cut points k in
0..n, where k is the image after step k (0 = the base with the serving config; n = the final
image).  The image after step k holds every step <= k, and ``requires:`` names only earlier
steps, so every cut is a consistent image; a cut list built from chosen steps must come from
:func:`imageforge.forensics.graph.with_predecessors` so it never lacks a required predecessor.

Order of probes: the base (fails -> ``base-fails``, stop: nothing a step did explains it), the
final image (passes -> ``final-passes``, stop), then a binary search on the (pass, fail)
bracket.  Points probed, base and final included, never exceed ``ceil(log2(m)) + 2`` for m
intervals (m = n for all cuts), and no point is probed twice.  For any probe, monotone or not,
a ``found`` result names k with point k-1 passing and point k failing (both probed).

Flaky checks: each point is probed ``repeat`` times.  A point whose runs disagree "flipped";
its flip rate is the minority share of its runs (1 fail in 4 -> 0.25).  With ``flaky="fail"``
(default) a flipped point counts as failing -- the break shows up there at least sometimes, so
the cause is at or before it; the search goes on and the result lists the flipped points.  With
``flaky="unknown"`` the search stops at the first flipped point and reports ``inconclusive``
with the bracket it had (the last passing and first failing cut so far).

How ``bisect_runner`` wires it: ``probe(k)`` builds (cache hits, mostly) the image of the first k steps
-- shared then profile steps, the profile's serving config on top -- starts it, runs the smoke
suite with only the selected checks (or equiv against the reference), removes the server and
returns ``Outcome(passed, report)``; then prints ``result.text(labels)`` with the culprit's
manifest line and changed files and raises :func:`raise_for` (exit 4 on base-fails/found).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ConfigError, SmokeError

FlakyPolicy = Literal["fail", "unknown"]
Status = Literal["found", "base-fails", "final-passes", "inconclusive"]
Verdict = Literal["pass", "fail", "unknown"]


@dataclass(frozen=True)
class Outcome:
    """One probe: did the selected checks pass on this image; the failing check's report if not.

    ``detail``: what the prober wants shown of a failing run beside the report (the runner's smoke result and the
    paths of its report and log); the search only carries it."""

    passed: bool
    report: str = ""
    detail: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Point:
    """Every run of one cut point."""

    k: int
    outcomes: tuple[Outcome, ...]

    @property
    def passes(self) -> int:
        return sum(1 for o in self.outcomes if o.passed)

    @property
    def fails(self) -> int:
        return len(self.outcomes) - self.passes

    @property
    def flipped(self) -> bool:
        return 0 < self.passes < len(self.outcomes)

    @property
    def flip_rate(self) -> float:
        return min(self.passes, self.fails) / len(self.outcomes) if self.outcomes else 0.0

    def verdict(self, flaky: FlakyPolicy) -> Verdict:
        if self.flipped:
            return "fail" if flaky == "fail" else "unknown"
        return "pass" if self.passes else "fail"

    def failing(self) -> Outcome | None:
        """The first failing run (None when every run passed)."""
        return next((o for o in self.outcomes if not o.passed), None)

    def report(self) -> str:
        """The first failing run's report (empty when every run passed)."""
        failing = self.failing()
        return "" if failing is None else failing.report


@dataclass(frozen=True)
class BisectResult:
    status: Status
    n: int
    cuts: tuple[int, ...]
    first_failing: int | None  # the cut k whose step (steps[k - 1]) broke the check
    last_passing: int | None
    points: tuple[Point, ...]  # in probe order
    repeat: int
    flaky: FlakyPolicy
    bound: int = field(default=0)

    @property
    def probes(self) -> int:
        """Distinct points probed (each ``repeat`` runs)."""
        return len(self.points)

    @property
    def runs(self) -> int:
        return sum(len(p.outcomes) for p in self.points)

    @property
    def flipped(self) -> tuple[Point, ...]:
        return tuple(p for p in self.points if p.flipped)

    @property
    def flip_rate(self) -> float:
        """Minority runs over all runs (0 with repeat 1)."""
        return sum(min(p.passes, p.fails) for p in self.points) / self.runs if self.runs else 0.0

    def point(self, k: int) -> Point | None:
        return next((p for p in self.points if p.k == k), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "n": self.n, "first_failing": self.first_failing,
            "last_passing": self.last_passing, "probes": self.probes, "runs": self.runs, "bound": self.bound,
            "repeat": self.repeat, "flaky": self.flaky, "flip_rate": round(self.flip_rate, 4),
            "points": [{"k": p.k, "passes": p.passes, "fails": p.fails, "flip_rate": round(p.flip_rate, 4),
                        "verdict": p.verdict(self.flaky), "report": p.report()} for p in self.points],
        }

    def text(self, labels: Sequence[str] | None = None) -> str:
        """Readable result; ``labels[k]`` names cut k (e.g. ``"after step 3 prefill-num-warps (build.yaml:42)"``)."""

        def name(k: int | None) -> str:
            if k is None:
                return "-"
            if labels is not None and 0 <= k < len(labels):
                return labels[k]
            return "base" if k == 0 else f"after step {k}"

        lines = [f"bisect over {self.n} steps: {self.probes} points probed x{self.repeat} "
                 f"({self.runs} runs; bound {self.bound} points)"]
        for p in self.points:
            flip = f"  flipped {p.passes}/{len(p.outcomes)} pass (rate {p.flip_rate:.2f})" if p.flipped else ""
            lines.append(f"  k={p.k:<3} {p.verdict(self.flaky):<7} {name(p.k)}{flip}")
        if self.status == "base-fails":
            lines.append("the base image already fails the check: no step explains it; stopped")
        elif self.status == "final-passes":
            lines.append("the final image passes the check: nothing to bisect")
        elif self.status == "inconclusive":
            lines.append(f"inconclusive: a flaky point; the break is after {name(self.last_passing)} and at or "
                         f"before {name(self.first_failing)}")
        else:
            lines.append(f"first failing: {name(self.first_failing)} (last passing: {name(self.last_passing)})")
        if self.flipped:
            lines.append(f"flaky: {len(self.flipped)} point(s) flipped; flip rate {self.flip_rate:.2f} of all runs")
        return "\n".join(lines)


def probe_bound(intervals: int) -> int:
    """Most points a search over ``intervals`` (>= 1) probes: base, final and ceil(log2(intervals))."""
    return math.ceil(math.log2(intervals)) + 2 if intervals >= 1 else 1


def bisect(n: int, probe: Callable[[int], Outcome], *, repeat: int = 1, flaky: FlakyPolicy = "fail",
           cuts: Sequence[int] | None = None, log: Callable[[str], None] | None = None) -> BisectResult:
    """Search cut points ``cuts`` (default 0..n; increasing, first = base, last = final) for the first failing one."""
    if repeat < 1:
        raise ConfigError("bisect --repeat must be at least 1", found=str(repeat))
    points_at = list(range(n + 1)) if cuts is None else list(cuts)
    if len(points_at) < 2 or points_at != sorted(set(points_at)):
        raise ConfigError("bisect needs at least one step between the base and the final image",
                          expected="increasing cut points, base and final included", found=str(points_at),
                          hint="the target (with this profile) has no steps" if n == 0 else None)
    probed: dict[int, Point] = {}
    order: list[Point] = []

    def at(i: int) -> Verdict:
        k = points_at[i]
        if k not in probed:
            point = Point(k, tuple(probe(k) for _ in range(repeat)))
            probed[k] = point
            order.append(point)
            if log is not None:
                log(f"bisect: k={k} {point.passes}/{repeat} pass")
        return probed[k].verdict(flaky)

    def done(status: Status, lo: int | None, hi: int | None) -> BisectResult:
        return BisectResult(status, n, tuple(points_at), None if hi is None else points_at[hi],
                            None if lo is None else points_at[lo], tuple(order), repeat, flaky,
                            probe_bound(len(points_at) - 1))

    last = len(points_at) - 1
    base = at(0)
    if base == "fail":
        return done("base-fails", None, 0)
    if base == "unknown":
        return done("inconclusive", None, 0)
    final = at(last)
    if final == "pass":
        return done("final-passes", last, None)
    if final == "unknown":
        return done("inconclusive", 0, last)
    lo, hi = 0, last
    while hi - lo > 1:
        mid = (lo + hi) // 2
        verdict = at(mid)
        if verdict == "unknown":
            return done("inconclusive", lo, hi)
        if verdict == "pass":
            lo = mid
        else:
            hi = mid
    return done("found", lo, hi)


def raise_for(result: BisectResult, culprit: str | None = None) -> None:
    """Exit 4 when a step broke the check or the base already fails; nothing when the final passes."""
    if result.status == "final-passes":
        return

    def report_at(k: int | None) -> str | None:
        point = None if k is None else result.point(k)
        return (point.report()[:400] or None) if point is not None else None

    if result.status == "base-fails":
        raise SmokeError("bisect: the base image already fails the check", found=report_at(0),
                         hint="fix the check or the serving config first: no step explains this failure")
    if result.status == "inconclusive":
        raise SmokeError("bisect: inconclusive, a point flipped between pass and fail",
                         found=f"break after cut {result.last_passing}, at or before cut {result.first_failing}",
                         hint="raise --repeat, or count flipped points as failing (flaky='fail')")
    first = result.first_failing
    raise SmokeError(f"bisect: the first failing step is {culprit or f'step {first}'}", found=report_at(first))
