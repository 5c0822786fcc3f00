"""``invoke bisect`` and ``invoke ablate``: the orchestration over the pure cores.

Images of step subsets (:func:`subset_resolved`): the resolved target with only some of its
steps (a prefix for bisect, "all but a step and its dependents" for ablate), the same verify and
serving config on top, tagged in ``<image>-bisect`` / ``<image>-ablate`` so the target's own tags
never move.  Cache keys chain from the base and ignore the image name, so a prefix is all cache
hits up to its last step and only its verify + config layers are new (once).  Verification
imports only the listed modules the kept steps still provide: a listed module whose file is the
``dest`` of a dropped overlay step is left out (it is not in that image, by design).

Bisect (:func:`bisect_target`): ``probe(k)`` builds the image after step k, serves it, runs only
the selected checks (``--check NAME``, repeatable, or every check of ``--suite FILE`` under the
tags), removes the server; a server that does not start or an image that does not build counts as
failing, with the reason as the report.  ``--check equiv`` probes with the accuracy gate instead:
the reference (the base with the serving config) is started once for the whole search and each cut
is compared with it in the ``equiv:`` dtype.

Ablate (:func:`ablate_target`): every variant is built first (no build runs between benches); the
full image's server stays up, each variant's server is started once for its block; the bench runs
alternate full, variant, full, variant ... with the same workload (a pair shares its seed; every
pair has its own, so no run hits another run's prefix cache); after its block each variant is
compared with the full image by equiv in the served dtype (both servers are up already).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import difflib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ImageforgeError, SmokeError
from .ablate import (
    FULL,
    AblationPlan,
    AblationTable,
    Metrics,
    RunResult,
    bracketed_results,
    in_place_slots,
    plan_ablation,
    summarize,
)
from .search import BisectResult, FlakyPolicy, Outcome, bisect, probe_bound

if TYPE_CHECKING:
    from ..bench import BenchResult, Workload
    from ..build import BuildResult
    from ..manifest import Step
    from ..resolve import Resolved
    from ..serve.container import Server
    from ..smoke import Suite

Log = Callable[[str], None]
EQUIV_CHECK = "equiv"


# --------------------------------------------------------------------------- images of step subsets


def module_paths(module: str) -> tuple[str, str]:
    """Package-relative files that provide ``module`` (``a.b.c`` -> ``a/b/c.py``, ``a/b/c/__init__.py``)."""
    rel = module.replace(".", "/")
    return f"{rel}.py", f"{rel}/__init__.py"


def provided_by(step: Step) -> str | None:
    """The package-relative file an overlay step puts into the image (None for other kinds)."""
    if step.kind != "overlay":
        return None
    dest = str(step.spec.get("dest", ""))
    return None if dest.startswith("/") else dest.lstrip("./")


def kept_imports(imports: Sequence[str], dropped: Sequence[Step]) -> tuple[str, ...]:
    """``imports`` without the modules only a dropped overlay step provides."""
    gone = {p for p in (provided_by(s) for s in dropped) if p}
    return tuple(m for m in imports if not gone.intersection(module_paths(m)))


def subset_resolved(resolved: Resolved, keep: Sequence[str], *, suffix: str) -> Resolved:
    """``resolved`` with only the steps in ``keep`` (manifest order kept), tagged in ``<image>-<suffix>``."""
    known = {s.id for s in resolved.steps}
    unknown = [k for k in keep if k not in known]
    if unknown:
        raise ConfigError(f"unknown step id(s) {', '.join(unknown)}", expected="one of " + ", ".join(known))
    wanted = set(keep)
    dropped = [s for s in resolved.steps if s.id not in wanted]
    target = resolved.target
    verify = dataclasses.replace(target.verify, imports=kept_imports(target.verify.imports, dropped))
    target = dataclasses.replace(target, image=f"{target.image}-{suffix}", verify=verify)
    return dataclasses.replace(
        resolved, target=target,
        shared_steps=tuple(s for s in resolved.shared_steps if s.id in wanted),
        profile_steps=tuple(s for s in resolved.profile_steps if s.id in wanted),
    )


def build_subset(resolved: Resolved, keep: Sequence[str], *, suffix: str, environ: Mapping[str, str],
                 log: Log) -> BuildResult:
    from ..build import build_target

    return build_target(subset_resolved(resolved, keep, suffix=suffix), environ=environ, echo=log)


def step_label(step: Step, k: int) -> str:
    return f"after step {k} {step.id} ({step.location})"


def changed_files(step: Step) -> list[str]:
    """What the step changes, from its definition (package-relative paths are under the site directory)."""
    spec = step.spec
    if step.kind == "patch":
        old, new = str(spec.get("old", "")), str(spec.get("new", ""))
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(), f"a/{spec['file']}", f"b/{spec['file']}",
                                    lineterm="", n=0)
        return [f"{spec['file']} (patched x{spec.get('count', 1)})", *(f"    {line}" for line in diff)]
    if step.kind == "overlay":
        return [f"{spec['dest']} (overlaid from {spec.get('source')})"]
    if step.kind == "symlink":
        return [f"links {spec.get('glob')} into {spec.get('into')}"]
    what = spec.get("source") or spec.get("command") or spec.get("directory")
    return [f"script {what} {' '.join(str(a) for a in spec.get('args', ()))}".rstrip()
            + ": its files are whatever it writes (not declared)"]


# --------------------------------------------------------------------------- bisect


def select_checks(suite: Suite, checks: Sequence[str], tags: Sequence[str]) -> Suite:
    """``suite`` with only the named checks (``checks`` empty: those ``tags`` select)."""
    from difflib import get_close_matches

    if not checks:
        selected = suite.select(tags)
    else:
        by_id = {c.id: c for c in suite.checks}
        missing = [c for c in checks if c not in by_id]
        if missing:
            hint = get_close_matches(missing[0], list(by_id), n=1)
            raise ConfigError(f"bisect: no check {missing[0]!r} in {suite.path}",
                              expected="a check id of the suite (or 'equiv')", found=", ".join(missing),
                              hint=f"did you mean {hint[0]!r}?" if hint else None)
        selected = tuple(by_id[c] for c in dict.fromkeys(checks))
    if not selected:
        raise ConfigError(f"bisect: no check of {suite.path} is selected", found=f"tags {', '.join(tags)}")
    return dataclasses.replace(suite, checks=selected)


def _first_line(exc: ImageforgeError) -> str:
    return exc.message + (f" ({exc.found})" if exc.found else "")


@dataclass
class BisectRun:
    result: BisectResult
    steps: tuple[Step, ...]
    labels: tuple[str, ...]
    run_dir: Path
    selection: str
    reports: dict[int, list[str]] = field(default_factory=dict)  # k -> report paths

    @property
    def culprit(self) -> Step | None:
        k = self.result.first_failing
        return self.steps[k - 1] if self.result.status == "found" and k else None

    def text(self) -> str:
        lines = [f"bisect {self.selection}", self.result.text(self.labels)]
        step = self.culprit
        if step is not None:
            k = self.result.first_failing or 0
            lines += ["", f"first failing step: {step.id} ({step.kind}) at {step.location}  [{step.key_path}]"]
            if step.why:
                lines.append(f"  why: {step.why}")
            lines.append("  changes:")
            lines += [f"    {line}" for line in changed_files(step)]
            point = self.result.point(k)
            if point is not None and point.report():
                lines += ["  failing check's report:", *(f"    {line}" for line in point.report().splitlines())]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        step = self.culprit
        return {
            **self.result.to_json(), "selection": self.selection, "labels": list(self.labels),
            "culprit": None if step is None else {"id": step.id, "kind": step.kind, "location": str(step.location),
                                                   "key_path": step.key_path, "changes": changed_files(step)},
            "reports": {str(k): v for k, v in self.reports.items()},
        }


def bisect_target(resolved: Resolved, *, checks: Sequence[str] = (), suite_path: str | None = None,
                  tags: Sequence[str] | None = None, repeat: int = 1, flaky: FlakyPolicy = "fail",
                  environ: Mapping[str, str] | None = None, echo: Log = print,
                  startup_timeout: float | None = None, host_address: str | None = None,
                  in_place: Any = None) -> BisectRun:
    """Binary search over the images after step k for the first one failing the selected checks.

    Every server is published on and reached at ``host_address`` (default: from ``environ``).  ``in_place``:
    each cut's steps applied under its root and served as a process, one at a time (equiv: the base's evidence is
    recorded first, then each cut is compared with it); the root is as before at the end.
    """
    from ..rundirs import new_run_id

    environ = os.environ if environ is None else environ
    steps = resolved.steps
    if flaky not in ("fail", "unknown"):
        raise ConfigError("bisect --flaky must be 'fail' or 'unknown'", found=repr(flaky))
    run_id = new_run_id()
    run_dir = resolved.manifest.root / ".imageforge" / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    labels = tuple(["base (serving config only)", *(step_label(s, i) for i, s in enumerate(steps, 1))])
    use_equiv = EQUIV_CHECK in checks
    if use_equiv and len(checks) > 1:
        raise ConfigError("bisect: --check equiv cannot be combined with smoke checks", found=", ".join(checks))
    reports: dict[int, list[str]] = {}

    def build_cut(k: int, log: Log, subject: Resolved) -> str:
        return build_subset(subject, [s.id for s in steps[:k]], suffix="bisect", environ=environ, log=log).image_id

    probing = _Probing(build_cut, run_dir, reports, environ, echo, startup_timeout, host_address, in_place)
    if in_place is not None:
        bound = probe_bound(len(steps)) * repeat + (1 if use_equiv else 0)
        echo(f"bisect --in-place on {in_place.root}: at most {bound} server starts, one at a time")
    with contextlib.ExitStack() as stack:
        if in_place is not None:
            stack.enter_context(in_place.kept(resolved.manifest, environ=environ, log=echo))
        result, selection = _bisect_search(resolved, steps, checks, suite_path, tags, repeat, flaky, use_equiv,
                                           probing, run_id)
    run = BisectRun(result, steps, labels, run_dir, selection, reports)
    (run_dir / "bisect.json").write_text(json.dumps(run.to_json(), indent=2) + "\n")
    (run_dir / "bisect.txt").write_text(run.text() + "\n")
    echo(run.text())
    echo(f"reports: {run_dir / 'bisect.txt'}, {run_dir / 'bisect.json'}")
    return run


def _bisect_search(resolved: Resolved, steps: Sequence[Step], checks: Sequence[str], suite_path: str | None,
                   tags: Sequence[str] | None, repeat: int, flaky: FlakyPolicy, use_equiv: bool, probing: _Probing,
                   run_id: str) -> tuple[BisectResult, str]:
    from ..smoke import DEFAULT_TAGS, load_suite, suite_for

    environ, echo, startup_timeout, host_address = (probing.environ, probing.echo, probing.startup_timeout,
                                                    probing.host_address)
    if use_equiv:
        selection = "--check equiv (accuracy gate against the base)"
        with _equiv_reference(resolved, environ=environ, echo=echo, run_id=run_id, startup_timeout=startup_timeout,
                              host_address=host_address, in_place=probing.in_place) as (ref_url, subject, settings,
                                                                                        dtype):

            def probe(k: int) -> Outcome:
                return _equiv_probe(k, subject, ref_url, settings, dtype, probing)

            result = bisect(len(steps), probe, repeat=repeat, flaky=flaky, log=echo)
    else:
        suite = load_suite(suite_for(resolved, suite_path))
        chosen_tags = tuple(tags) if tags else (tuple(resolved.target.smoke.tags) or DEFAULT_TAGS)
        selected = select_checks(suite, checks, chosen_tags)
        selection = (f"{len(selected.checks)} check(s) of {suite.path}: "
                     + ", ".join(c.id for c in selected.checks[:8]) + (" ..." if len(selected.checks) > 8 else ""))
        echo(f"bisect {resolved.target.name}:{resolved.profile_name} over {len(steps)} steps; {selection}  "
             f"run {run_id}")

        def probe(k: int) -> Outcome:
            return _smoke_probe(k, resolved, selected, probing)

        result = bisect(len(steps), probe, repeat=repeat, flaky=flaky, log=echo)
    return result, selection


def _quiet(path: Path) -> Log:
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    return log


@dataclass(frozen=True)
class _Probing:
    """What every bisect probe shares: how a cut is built, where its logs and reports go, how it is served."""

    build_cut: Callable[[int, Log, Resolved], str]
    run_dir: Path
    reports: dict[int, list[str]]
    environ: Mapping[str, str]
    echo: Log
    startup_timeout: float | None
    host_address: str | None
    in_place: Any = None  # an imageforge.serve.process.InPlace: apply the cut under its root, serve a process


def _probe_cut(k: int, build_as: Resolved, serve_as: Resolved, p: _Probing, *, what: str, no_server: str,
               measure: Callable[[Server, Log], Outcome]) -> Outcome:
    """Build the image after step ``k``, serve it, ``measure`` it: a build or start failure is a failing cut."""
    from ..serve.container import serving

    log = _quiet(p.run_dir / f"cut-{k}.log")
    p.echo(f"bisect: probing k={k}{what} (log {p.run_dir / f'cut-{k}.log'})")
    if p.in_place is not None:
        cut = subset_resolved(build_as, [s.id for s in build_as.steps[:k]], suffix="bisect")
        try:
            p.in_place.apply(cut, environ=p.environ, log=log)
        except ImageforgeError as exc:
            return Outcome(False, f"the steps up to {k} did not apply in place: {_first_line(exc)}")
        try:
            with p.in_place.serving(cut, environ=p.environ, startup_timeout=p.startup_timeout, log=log,
                                    host_address=p.host_address) as process:
                return measure(process, log)
        except SmokeError as exc:
            return Outcome(False, f"{no_server.format(k=k)}: {_first_line(exc)}")
    try:
        image = p.build_cut(k, log, build_as)
    except ImageforgeError as exc:
        return Outcome(False, f"the image after step {k} did not build: {_first_line(exc)}")
    try:
        with serving(serve_as, environ=p.environ, image=image, startup_timeout=p.startup_timeout, log=log,
                     host_address=p.host_address) as server:
            return measure(server, log)
    except SmokeError as exc:
        return Outcome(False, f"{no_server.format(k=k)}: {_first_line(exc)}")


def _smoke_probe(k: int, resolved: Resolved, suite: Suite, p: _Probing) -> Outcome:
    from ..smoke import FAIL, ServerHooks, failure_text, interesting_lines, run_suite, target_vars

    def measure(server: Server, log: Log) -> Outcome:
        hooks = ServerHooks(alive=lambda: None if server.running() else server.describe_state(),
                            log_tail=lambda n: interesting_lines(server.logs(n * 20), n))
        report = run_suite(suite, server.url, tags=(), run_id=server.run_id, run_dir=server.run_dir,
                           vars=target_vars(resolved), hooks=hooks, echo=log, live=False,
                           target=resolved.target.name, profile=resolved.profile_name)
        if report.json_path is not None:
            p.reports.setdefault(k, []).append(str(report.json_path))
        if report.ok:
            return Outcome(True)
        text = "\n\n".join(failure_text(r, report.log_tail[-10:]) for r in report.results if r.status == FAIL)
        return Outcome(False, f"{report.summary_line()}\n{text}")

    serve_as = subset_resolved(resolved, [s.id for s in resolved.steps[:k]], suffix="bisect")
    return _probe_cut(k, resolved, serve_as, p, what="", measure=measure,
                      no_server="the server of the image after step {k} did not start")


@contextlib.contextmanager
def _equiv_reference(resolved: Resolved, *, environ: Mapping[str, str], echo: Log, run_id: str,
                     startup_timeout: float | None, host_address: str | None = None,
                     in_place: Any = None) -> Iterator[tuple[Any, Resolved, Any, Any]]:
    """The base reference server, started once for a whole equiv bisect (in place: its evidence, recorded first)."""
    from ..equiv.client import collect_reference
    from ..equiv.runner import check_dtype, renamed, with_serving_value
    from ..serve.container import serving

    settings = resolved.target.equiv
    dtype = check_dtype(settings.dtype)
    subject = renamed(with_serving_value(resolved, "dtype", dtype), "equiv")
    if in_place is not None:
        base = subset_resolved(subject, [], suffix="bisect")
        in_place.apply(base, environ=environ, log=echo)
        with in_place.serving(base, environ=environ, run_id=f"{run_id}-ref", startup_timeout=startup_timeout,
                              log=echo, host_address=host_address) as ref:
            evidence = collect_reference(ref.url, settings.prompts, top_k=settings.top_k,
                                         greedy_tokens=settings.greedy_tokens)
        yield evidence, subject, settings, dtype
        return
    with serving(subject, environ=environ, base=True, run_id=f"{run_id}-ref", startup_timeout=startup_timeout,
                 log=echo, host_address=host_address) as ref:
        yield ref.url, subject, settings, dtype


def _equiv_probe(k: int, subject: Resolved, ref_url: Any, settings: Any, dtype: Any, p: _Probing) -> Outcome:
    from ..equiv.client import collect_against
    from ..equiv.compare import compare, gate
    from ..equiv.runner import EquivRun, compare_urls

    def measure(server: Server, log: Log) -> Outcome:
        out = p.run_dir / f"equiv-cut-{k}-{len(p.reports.get(k, []))}"
        if isinstance(ref_url, str):
            result = compare_urls(ref_url, server.url, settings, dtype, run_dir=out)
        else:  # in place: the base's evidence, recorded before the first cut
            cand = collect_against(server.url, ref_url)
            result = EquivRun(gate(compare(ref_url, cand), settings.tolerance(dtype), dtype), ref_url, cand, out)
            result.write(out)
        p.reports.setdefault(k, []).append(str(out / "equiv.json"))
        return Outcome(result.verdict.passed, "" if result.verdict.passed else result.verdict.text())

    return _probe_cut(k, subject, subject, p, what=" with equiv", measure=measure,
                      no_server="the image after step {k}")


# --------------------------------------------------------------------------- ablate


def metrics_of(bench: BenchResult, workload: Workload) -> Metrics | None:
    """A bench run's numbers, or None when it failed (error rate above the limit, or no token came back)."""
    if bench.worst_error_rate > workload.max_error_rate or not bench.completion_tokens:
        return None
    return Metrics(bench.score, bench.output_tps, bench.input_tps, bench.cache_tps)


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


def ablate_target(resolved: Resolved, workload: Workload, *, steps: Sequence[str] | None = None, repeats: int = 3,
                  out: Path | None = None, equiv: bool = True, environ: Mapping[str, str] | None = None,
                  echo: Log = print, startup_timeout: float | None = None,
                  host_address: str | None = None) -> AblationRun:
    """Build every variant, then bench full/variant ABAB per block, equiv each variant; table + JSON/CSV.

    Every server is published on and reached at ``host_address`` (default: from ``environ``).
    """
    from ..bench import run_bench
    from ..rundirs import new_run_id
    from ..serve.container import serving

    workload.validate()
    environ = os.environ if environ is None else environ
    plan = plan_ablation(resolved.steps, steps, repeats)
    run_id = new_run_id()
    out = out or resolved.manifest.root / ".imageforge" / "runs" / run_id
    out.mkdir(parents=True, exist_ok=True)
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    echo(plan.text())
    images: dict[str, str] = {}
    builds: dict[str, str] = {}
    for name, keep in [(FULL, plan.full), *((v.step, v.steps) for v in plan.variants)]:
        try:
            built = build_subset(resolved, keep, suffix="ablate", environ=environ,
                                 log=_quiet(out / "build.log"))
            images[name] = built.image_id
            builds[name] = f"{built.built} of {len(built.steps)} layers built"
        except ImageforgeError as exc:
            if name == FULL:
                raise
            builds[name] = f"build failed: {_first_line(exc)}"
        echo(f"  image {name}: {builds[name]}")
    results: list[RunResult] = []
    verdicts: dict[str, str] = {}
    load_before = list(os.getloadavg())
    seeds = {(r.block, r.round): workload.seed + r.block * plan.repeats + r.round for r in plan.schedule}

    def bench_one(url: str, run: Any) -> Metrics | None:
        one = dataclasses.replace(workload, seed=seeds[(run.block, run.round)], repeat=1)
        try:
            bench = run_bench(url, one, run_dir=out / "runs" / f"{run.index:03d}-{run.image.strip('()')}",
                              echo=_quiet(out / "bench.log"))
        except ImageforgeError as exc:
            echo(f"    run {run.index} failed: {_first_line(exc)}")
            return None
        metrics = metrics_of(bench, one)
        echo(f"    [{run.index + 1}/{len(plan.schedule)}] {run.image:<28} round {run.round + 1}: "
             + ("failed" if metrics is None else f"score {metrics.score:.1f}, Output {metrics.output_tps:.1f} TPS"))
        return metrics

    full_resolved = subset_resolved(resolved, plan.full, suffix="ablate")
    with serving(full_resolved, environ=environ, image=images[FULL], run_id=f"{run_id}-full",
                 startup_timeout=startup_timeout, log=_quiet(out / "servers.log"), host_address=host_address) as full:
        echo(f"  full image serving at {full.url} (ready after {full.startup_seconds or 0:.0f}s)")
        for block, variant in enumerate(plan.variants):
            runs = [r for r in plan.schedule if r.block == block]
            if variant.step not in images:
                results += [RunResult(r, None) for r in runs if r.role == "variant"]
                results += [RunResult(r, bench_one(full.url, r)) for r in runs if r.role == "full"]
                verdicts[variant.step] = "-"
                continue
            echo(f"  block {block + 1}/{len(plan.variants)}: without {', '.join(variant.dropped)}")
            try:
                with serving(subset_resolved(resolved, variant.steps, suffix="ablate"), environ=environ,
                             image=images[variant.step], run_id=f"{run_id}-v{block}",
                             startup_timeout=startup_timeout, log=_quiet(out / "servers.log"),
                             host_address=host_address) as other:
                    for r in runs:
                        results.append(RunResult(r, bench_one(full.url if r.role == "full" else other.url, r)))
                    if equiv:
                        verdicts[variant.step] = _ablate_equiv(resolved, full.url, other.url,
                                                               out / f"equiv-{variant.step}", echo)
            except SmokeError as exc:  # the variant's server did not start
                echo(f"    the variant's server did not start: {_first_line(exc)}")
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


def ablate_in_place(resolved: Resolved, workload: Workload, in_place: Any, *, steps: Sequence[str] | None = None,
                    repeats: int = 3, out: Path | None = None, equiv: bool = True,
                    environ: Mapping[str, str] | None = None, echo: Log = print,
                    startup_timeout: float | None = None, host_address: str | None = None) -> AblationRun:
    """``ablate --in-place``: one server at a time on this machine -- full, each variant, full again.

    Each server: its steps applied under the root, served as a process, ``repeats`` bench runs, stopped. equiv of a
    variant is against the evidence the first full server gave (in the served dtype). The root is as before at the
    end. The table is the ABAB one's, each variant paired with the full runs around it (:func:`bracketed_results`).
    """
    from ..bench import run_bench
    from ..equiv.client import collect_against, collect_reference
    from ..equiv.compare import compare, gate
    from ..equiv.runner import served_dtype
    from ..rundirs import new_run_id

    workload.validate()
    environ = os.environ if environ is None else environ
    plan = plan_ablation(resolved.steps, steps, repeats)
    slots = in_place_slots(plan)
    run_id = new_run_id()
    out = out or resolved.manifest.root / ".imageforge" / "runs" / run_id
    out.mkdir(parents=True, exist_ok=True)
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    echo(plan.text())
    echo(f"ablate --in-place on {in_place.root}: {len(slots)} server starts, one at a time: "
         + ", ".join(slot.label for slot in slots))
    load_before = list(os.getloadavg())
    seeds = [workload.seed + r for r in range(plan.repeats)]
    measured: dict[int, list[Metrics | None]] = {}
    served: dict[str, str] = {}
    verdicts: dict[str, str] = {}
    reference = None
    settings = resolved.target.equiv
    dtype = served_dtype(resolved)
    with in_place.kept(resolved.manifest, environ=environ, log=echo):
        for slot in slots:
            runs: list[Metrics | None] = []
            measured[slot.index] = runs
            subset = subset_resolved(resolved, slot.steps, suffix="ablate")
            try:
                served[slot.label] = in_place.apply(subset, environ=environ, log=_quiet(out / "apply.log"))
                with in_place.serving(subset, environ=environ, run_id=f"{run_id}-s{slot.index}",
                                      startup_timeout=startup_timeout, log=_quiet(out / "servers.log"),
                                      host_address=host_address) as server:
                    echo(f"  [{slot.index + 1}/{len(slots)}] {slot.label}: up after "
                         f"{server.startup_seconds or 0:.0f}s")
                    for r in range(plan.repeats):
                        one = dataclasses.replace(workload, seed=seeds[r], repeat=1)
                        try:
                            bench = run_bench(server.url, one, run_dir=out / "runs" / f"{slot.index:02d}-r{r}",
                                              echo=_quiet(out / "bench.log"))
                            runs.append(metrics_of(bench, one))
                        except ImageforgeError as exc:
                            echo(f"    round {r + 1} failed: {_first_line(exc)}")
                            runs.append(None)
                        got = runs[-1]
                        echo(f"    round {r + 1}: " + ("failed" if got is None else
                                                       f"score {got.score:.1f}, Output {got.output_tps:.1f} TPS"))
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
                            echo(f"    equiv failed to run: {_first_line(exc)}")
                            verdicts[step] = "error"
                        echo(f"    equiv vs full ({dtype or 'ungated'}): {verdicts[step]}")
            except ImageforgeError as exc:
                if slot.index == 0:
                    raise
                echo(f"  [{slot.index + 1}/{len(slots)}] {slot.label}: {_first_line(exc)}")
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
    from ..equiv.runner import compare_urls, served_dtype

    dtype = served_dtype(resolved)
    try:
        result = compare_urls(full_url, variant_url, resolved.target.equiv, dtype, run_dir=run_dir)
    except SmokeError as exc:
        echo(f"    equiv failed to run: {_first_line(exc)}")
        return "error"
    s = result.verdict.comparison.overall
    echo(f"    equiv vs full ({dtype or 'ungated'}): max {s.max_abs:.3g}, mean {s.mean_abs:.3g}, "
         f"top-1 {100 * s.top1:.1f}% -> {'pass' if result.verdict.passed else 'FAIL'}")
    if dtype is None:
        return "report"
    return "pass" if result.verdict.passed else "FAIL"


__all__ = [
    "AblationRun",
    "BisectRun",
    "ablate_in_place",
    "ablate_target",
    "bisect_target",
    "build_subset",
    "changed_files",
    "kept_imports",
    "metrics_of",
    "select_checks",
    "subset_resolved",
]
