"""``invoke ablate``: the ABAB schedule (:mod:`.ablate`) run with real builds, servers and benches.

Every variant is built first (no build runs between benches); the full image's server stays up, each variant's
server is started once for its block; the bench runs alternate full, variant, full, variant ... with the same
workload (a pair shares its seed; every pair has its own, so no run hits another run's prefix cache); after its
block each variant is compared with the full image by equiv in the served dtype (both servers are up already).
One server at a time (:func:`ablate_one_at_a_time`, in place) -- full, each variant, full again.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..bench import run_bench
from ..equiv.client import collect_against, collect_reference
from ..equiv.compare import compare, gate
from ..equiv.runner import compare_urls, served_dtype
from ..errors import ImageforgeError, SmokeError
from ..rundirs import new_run_id
from .ablate import (
    FULL,
    AblationPlan,
    AblationTable,
    Metrics,
    RunResult,
    bracketed_results,
    one_at_a_time_slots,
    plan_ablation,
    summarize,
)
from .subsets import file_log, first_line, subset_resolved

if TYPE_CHECKING:
    from ..bench import BenchResult, Workload
    from ..manifest.resolve import Resolved
    from ..serve.runtime import Prepared, Runtime

Log = Callable[[str], None]


def metrics_of(bench: BenchResult, workload: Workload) -> Metrics | None:
    """A bench run's numbers, or None when it failed (error rate above the limit, or no token came back)."""
    if bench.worst_error_rate > workload.max_error_rate or not bench.completion_tokens:
        return None
    return Metrics(bench.weighted_tps, bench.output_tps, bench.uncached_input_tps, bench.cache_tps)


@dataclass
class AblationRun:
    plan: AblationPlan
    table: AblationTable
    out: Path
    load: dict[str, Any]
    workload: dict[str, Any]
    builds: dict[str, str]
    started_at: str
    seconds: float

    def text(self) -> str:
        before, after = self.load.get("before"), self.load.get("after")
        return "\n".join([
            self.plan.text(),
            self.table.text(),
            f"{self.started_at}; load average before {before}, after {after}; {self.seconds:.0f}s; "
            f"workload {self.workload.get('requests')} requests x {self.workload.get('prompt_tokens')}+"
            f"{self.workload.get('output_tokens')} tokens at concurrency {self.workload.get('concurrency')}",
        ])

    def to_json(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "seconds": round(self.seconds, 1), "load": self.load,
                "workload": self.workload, "builds": self.builds, **self.table.to_json()}

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "ablate.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (self.out / "ablate.csv").write_text(self.table.csv())
        (self.out / "ablate.txt").write_text(self.text() + "\n")


class _Start(NamedTuple):
    environ: Mapping[str, str]
    plan: AblationPlan
    run_id: str
    out: Path
    started_at: str
    t0: float


def _ablation_start(resolved: Resolved, workload: Workload, steps: Sequence[str] | None, repeats: int,
                    out: Path | None, environ: Mapping[str, str] | None, echo: Log) -> _Start:
    """How both ablations begin: the workload checked, the plan made and shown, a run id and folder, the clock."""
    workload.validate()
    plan = plan_ablation(resolved.steps, steps, repeats)
    run_id = new_run_id()
    out = out or resolved.manifest.root / ".imageforge" / "runs" / run_id
    out.mkdir(parents=True, exist_ok=True)
    start = _Start(os.environ if environ is None else environ, plan, run_id, out,
                   _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), time.monotonic())
    echo(plan.text())
    return start


def ablate_target(resolved: Resolved, workload: Workload, runtime: Runtime, *, steps: Sequence[str] | None = None,
                  repeats: int = 3,
                  out: Path | None = None, equiv: bool = True, environ: Mapping[str, str] | None = None,
                  echo: Log = print, startup_timeout: float | None = None,
                  host_address: str | None = None) -> AblationRun:
    """Prepare every variant (``runtime``: one that serves several servers at once), then bench full/variant ABAB
    per block, equiv each variant; table + JSON/CSV.

    Every server is published on and reached at ``host_address`` (default: from ``environ``).
    """
    environ, plan, run_id, out, started_at, t0 = _ablation_start(resolved, workload, steps, repeats, out, environ,
                                                                 echo)
    images: dict[str, Prepared] = {}
    builds: dict[str, str] = {}
    for name, keep in [(FULL, plan.full), *((v.step, v.steps) for v in plan.variants)]:
        try:
            built = runtime.prepare(subset_resolved(resolved, keep, suffix="ablate"), environ=environ,
                                    log=file_log(out / "build.log"), pin=True)
            images[name] = built
            builds[name] = f"{built.built} of {built.layers} layers built"
        except ImageforgeError as exc:
            if name == FULL:
                raise
            builds[name] = f"build failed: {first_line(exc)}"
        echo(f"  image {name}: {builds[name]}")
    results: list[RunResult] = []
    verdicts: dict[str, str] = {}
    load_before = list(os.getloadavg())
    seeds = {(r.block, r.round): workload.seed + r.block * plan.repeats + r.round for r in plan.schedule}

    def bench_one(url: str, run: Any) -> Metrics | None:
        one = dataclasses.replace(workload, seed=seeds[(run.block, run.round)], repeat=1)
        try:
            bench = run_bench(url, one, run_dir=out / "runs" / f"{run.index:03d}-{run.image.strip('()')}",
                              echo=file_log(out / "bench.log"))
        except ImageforgeError as exc:
            echo(f"    run {run.index} failed: {first_line(exc)}")
            return None
        metrics = metrics_of(bench, one)
        echo(f"    [{run.index + 1}/{len(plan.schedule)}] {run.image:<28} round {run.round + 1}: "
             + ("failed" if metrics is None
                else f"weighted_tps {metrics.weighted_tps:.1f}, Output {metrics.output_tps:.1f} TPS"))
        return metrics

    full_resolved = subset_resolved(resolved, plan.full, suffix="ablate")
    with runtime.serving(full_resolved, images[FULL], environ=environ, run_id=f"{run_id}-full",
                         startup_timeout=startup_timeout, log=file_log(out / "servers.log"),
                         host_address=host_address) as full:
        echo(f"  full image serving at {full.url} "
             + (f"({full.name} reused)" if full.reused else f"(ready after {full.startup_seconds or 0:.0f}s)"))
        for block, variant in enumerate(plan.variants):
            runs = [r for r in plan.schedule if r.block == block]
            if variant.step not in images:
                results += [RunResult(r, None) for r in runs if r.role == "variant"]
                results += [RunResult(r, bench_one(full.url, r)) for r in runs if r.role == "full"]
                verdicts[variant.step] = "-"
                continue
            echo(f"  block {block + 1}/{len(plan.variants)}: without {', '.join(variant.dropped)}")
            try:
                with runtime.serving(subset_resolved(resolved, variant.steps, suffix="ablate"), images[variant.step],
                                     environ=environ, run_id=f"{run_id}-v{block}", startup_timeout=startup_timeout,
                                     log=file_log(out / "servers.log"), host_address=host_address) as other:
                    for r in runs:
                        results.append(RunResult(r, bench_one(full.url if r.role == "full" else other.url, r)))
                    if equiv:
                        verdicts[variant.step] = _ablate_equiv(resolved, full.url, other.url,
                                                               out / f"equiv-{variant.step}", echo)
            except SmokeError as exc:  # the variant's server did not start
                echo(f"    the variant's server did not start: {first_line(exc)}")
                done = {(x.run.block, x.run.round, x.run.role) for x in results}
                results += [RunResult(r, None) for r in runs if (r.block, r.round, r.role) not in done]
                verdicts[variant.step] = "no-start"
    table = summarize(plan, results, verdicts)
    result = AblationRun(plan, table, out, {"before": load_before, "after": list(os.getloadavg())},
                         {**workload.to_json(), "repeats": plan.repeats}, builds, started_at, time.monotonic() - t0)
    result.write()
    echo(table.text())
    echo(f"reports: {out / 'ablate.txt'}, {out / 'ablate.json'}, {out / 'ablate.csv'}")
    return result


def ablate_one_at_a_time(resolved: Resolved, workload: Workload, runtime: Runtime, *,
                         steps: Sequence[str] | None = None, repeats: int = 3, out: Path | None = None,
                         equiv: bool = True, environ: Mapping[str, str] | None = None, echo: Log = print,
                         startup_timeout: float | None = None, host_address: str | None = None) -> AblationRun:
    """``ablate --in-place``: one server at a time (``runtime``) -- full, each variant, full again.

    Each server: its steps prepared (applied under the root), served, ``repeats`` bench runs, stopped. equiv of a
    variant is against the evidence the first full server gave (in the served dtype). The root is as before at the
    end. The table is the ABAB one's, each variant paired with the full runs around it (:func:`bracketed_results`).
    """
    environ, plan, run_id, out, started_at, t0 = _ablation_start(resolved, workload, steps, repeats, out, environ,
                                                                 echo)
    slots = one_at_a_time_slots(plan)
    echo(f"ablate {runtime.where}: {len(slots)} server starts, one at a time: "
         + ", ".join(slot.label for slot in slots))
    load_before = list(os.getloadavg())
    seeds = [workload.seed + r for r in range(plan.repeats)]
    measured: dict[int, list[Metrics | None]] = {}
    served: dict[str, str] = {}
    verdicts: dict[str, str] = {}
    reference = None
    settings = resolved.target.equiv
    dtype = served_dtype(resolved)
    with runtime.restoring(resolved.manifest, environ=environ, log=echo):
        for slot in slots:
            runs: list[Metrics | None] = []
            measured[slot.index] = runs
            subset = subset_resolved(resolved, slot.steps, suffix="ablate")
            try:
                prepared = runtime.prepare(subset, environ=environ, log=file_log(out / "apply.log"))
                served[slot.label] = prepared.note
                with runtime.serving(subset, prepared, environ=environ, run_id=f"{run_id}-s{slot.index}",
                                     startup_timeout=startup_timeout, log=file_log(out / "servers.log"),
                                     host_address=host_address) as server:
                    echo(f"  [{slot.index + 1}/{len(slots)}] {slot.label}: up after "
                         f"{server.startup_seconds or 0:.0f}s")
                    for r in range(plan.repeats):
                        one = dataclasses.replace(workload, seed=seeds[r], repeat=1)
                        try:
                            bench = run_bench(server.url, one, run_dir=out / "runs" / f"{slot.index:02d}-r{r}",
                                              echo=file_log(out / "bench.log"))
                            runs.append(metrics_of(bench, one))
                        except ImageforgeError as exc:
                            echo(f"    round {r + 1} failed: {first_line(exc)}")
                            runs.append(None)
                        got = runs[-1]
                        echo(f"    round {r + 1}: " + ("failed" if got is None else
                                                       f"weighted_tps {got.weighted_tps:.1f}, Output "
                                                       f"{got.output_tps:.1f} TPS"))
                    if equiv and slot.index == 0:
                        reference = collect_reference(server.url, settings.prompts, top_k=settings.top_k,
                                                      greedy_tokens=settings.greedy_tokens)
                    elif equiv and slot.block is not None and reference is not None:
                        step = plan.variants[slot.block].step
                        try:
                            cand = collect_against(server.url, reference)
                            tolerance = settings.tolerance(dtype) if dtype is not None else None
                            if tolerance is None:
                                verdicts[step] = "report"
                            else:
                                verdicts[step] = "pass" if gate(compare(reference, cand), tolerance,
                                                                dtype or "").passed else "FAIL"
                        except SmokeError as exc:
                            echo(f"    equiv failed to run: {first_line(exc)}")
                            verdicts[step] = "error"
                        echo(f"    equiv vs full ({dtype or 'ungated'}): {verdicts[step]}")
            except ImageforgeError as exc:
                if slot.index == 0:
                    raise
                echo(f"  [{slot.index + 1}/{len(slots)}] {slot.label}: {first_line(exc)}")
                runs.extend([None] * (plan.repeats - len(runs)))
                if slot.block is not None:
                    verdicts[plan.variants[slot.block].step] = "no-start"
    variants = {slot.block: measured[slot.index] for slot in slots if slot.block is not None}
    results = bracketed_results(plan, measured[slots[0].index], measured[slots[-1].index], variants)
    table = summarize(plan, results, verdicts)
    result = AblationRun(plan, table, out, {"before": load_before, "after": list(os.getloadavg())},
                         {**workload.to_json(), "repeats": plan.repeats, "schedule": "in place: full, variants, full"},
                         served, started_at, time.monotonic() - t0)
    result.write()
    echo(table.text())
    echo(f"reports: {out / 'ablate.txt'}, {out / 'ablate.json'}, {out / 'ablate.csv'}")
    return result


def _ablate_equiv(resolved: Resolved, full_url: str, variant_url: str, run_dir: Path, echo: Log) -> str:
    """equiv of the variant against the full image, in the dtype both serve in (report only if ungated)."""
    dtype = served_dtype(resolved)
    try:
        result = compare_urls(full_url, variant_url, resolved.target.equiv, dtype, run_dir=run_dir)
    except SmokeError as exc:
        echo(f"    equiv failed to run: {first_line(exc)}")
        return "error"
    s = result.verdict.comparison.overall
    echo(f"    equiv vs full ({dtype or 'ungated'}): max {s.max_abs:.3g}, mean {s.mean_abs:.3g}, "
         f"top-1 {100 * s.top1:.1f}% -> {'pass' if result.verdict.passed else 'FAIL'}")
    if dtype is None:
        return "report"
    return "pass" if result.verdict.passed else "FAIL"


def ablate_on(resolved: Resolved, workload: Workload, runtime: Runtime, *, steps: Sequence[str] | None = None,
              repeats: int = 3, out: Path | None = None, equiv: bool = True,
              environ: Mapping[str, str] | None = None, echo: Log = print,
              host_address: str | None = None) -> AblationRun:
    """`ablate` on ``runtime``: every variant served beside the full image (:func:`ablate_target`), or one server
    at a time when the runtime serves only one (:func:`ablate_one_at_a_time`)."""
    run = ablate_one_at_a_time if runtime.one_at_a_time else ablate_target
    return run(resolved, workload, runtime, steps=steps, repeats=repeats, out=out, equiv=equiv, environ=environ,
               echo=echo, host_address=host_address)
