"""The replay's redlines and targets as data: each line names its source, and who it gates.

Three sources (facts note, "The evaluator"):

* ``competition`` -- what the competition's logs show the platform enforcing: total-time p99 <= 999,999 ms over
  the successful requests.  A target whose ``replay.gate`` lists ``competition`` (bi100) exits 4 on it.
* ``harness`` -- the public harness's defaults (``modelsphere/llm-bench``, ``bench/tests/functional/replay.py``):
  uptime >= 0.95, TTFT p99 <= 10,000 ms, total-time p99 <= 120,000 ms, unfinished rate <= 0.05.  Reported on
  every replay; they gate only a target whose ``replay.gate`` lists ``harness``.
* ``organisers`` -- the organisers' targets: Output TPS p10 >= 20, TTFT p90 <= 5 s, cache hit >= 50 %,
  success >= 99 %.  Reported; exit 4 only with ``--require-targets``.

A line reads one key of the report's JSON (:meth:`.evaluator.EvalReport.to_json`); a missing value is ``N/A``
(never a pass, never a failure: the harness skips a redline whose metric is None).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["competition", "harness", "organisers"]
SOURCES: tuple[Source, ...] = ("competition", "harness", "organisers")
SOURCE_TEXT: Mapping[Source, str] = {
    "competition": "the competition's logs (the platform's redline)",
    "harness": "the evaluator harness's defaults (modelsphere/llm-bench replay)",
    "organisers": "the organisers' targets",
}


@dataclass(frozen=True)
class Redline:
    """One line: ``key`` (a report key) ``op`` ``threshold``; ``unit`` for printing."""

    name: str
    key: str
    op: Literal[">=", "<="]
    threshold: float
    unit: str
    source: Source

    def check(self, metrics: Mapping[str, Any]) -> RedlineResult:
        value = metrics.get(self.key)
        return RedlineResult(self, None if value is None else float(value))


@dataclass(frozen=True)
class RedlineResult:
    line: Redline
    value: float | None

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "N/A"
        ok = self.value >= self.line.threshold if self.line.op == ">=" else self.value <= self.line.threshold
        return "PASS" if ok else "FAIL"

    def render(self) -> str:
        line = self.line
        shown = "unknown" if self.value is None else _fmt(self.value, line.unit)
        return f"{self.verdict:4}  {line.name} {line.op} {_fmt(line.threshold, line.unit)}: {shown}  [{line.source}]"

    def to_json(self) -> dict[str, Any]:
        line = self.line
        return {"name": line.name, "key": line.key, "op": line.op, "threshold": line.threshold, "unit": line.unit,
                "source": line.source, "value": self.value, "verdict": self.verdict}


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.2f}%"
    if unit == "ms":
        return f"{value:,.0f} ms"
    return f"{value:,.2f} {unit}".rstrip()


REDLINES: tuple[Redline, ...] = (
    Redline("total time p99", "total_time_p99_ms", "<=", 999_999.0, "ms", "competition"),
    Redline("uptime", "uptime", ">=", 0.95, "%", "harness"),
    Redline("TTFT p99", "ttft_p99_ms", "<=", 10_000.0, "ms", "harness"),
    Redline("total time p99", "total_time_p99_ms", "<=", 120_000.0, "ms", "harness"),
    Redline("unfinished rate", "unfinished_rate", "<=", 0.05, "%", "harness"),
    Redline("Output TPS p10", "output_tps_p10", ">=", 20.0, "tok/s", "organisers"),
    Redline("TTFT p90", "ttft_p90_ms", "<=", 5_000.0, "ms", "organisers"),
    Redline("cache hit rate", "cache_hit_rate", ">=", 0.50, "%", "organisers"),
    Redline("success rate", "uptime", ">=", 0.99, "%", "organisers"),
)


def check(metrics: Mapping[str, Any], lines: Iterable[Redline] = REDLINES) -> tuple[RedlineResult, ...]:
    return tuple(line.check(metrics) for line in lines)


def failing(results: Sequence[RedlineResult], sources: Iterable[str]) -> list[RedlineResult]:
    """The lines of ``sources`` that FAIL (N/A is not a failure)."""
    wanted = set(sources)
    return [r for r in results if r.line.source in wanted and r.verdict == "FAIL"]


def gated_sources(gate: Iterable[str], *, require_targets: bool) -> tuple[str, ...]:
    """The sources that exit 4: a target's ``replay.gate`` plus ``organisers`` with ``--require-targets``."""
    out = [s for s in SOURCES if s in set(gate)]
    if require_targets and "organisers" not in out:
        out.append("organisers")
    return tuple(out)
