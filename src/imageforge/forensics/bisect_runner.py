"""``invoke bisect``: the search over the images after step k (:mod:`.search`), with real builds and servers.

``probe(k)`` builds the image after step k (:mod:`.subsets`), serves it, runs only the selected checks
(``--check NAME``, repeatable, or every check of ``--suite FILE`` under the tags), removes the server; a server
that does not start or an image that does not build counts as failing, with the reason as the report.
``--check equiv`` probes with the accuracy gate instead: the reference (the base with the serving config) is
started once for the whole search and each cut is compared with it in the ``equiv:`` dtype.  In place: each cut's
steps applied under the root and served as a process, one at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..equiv.client import collect_against, collect_reference
from ..equiv.compare import compare, gate
from ..equiv.runner import EquivRun, check_dtype, compare_urls, renamed, with_serving_value
from ..errors import ConfigError, ImageforgeError, SmokeError
from ..rundirs import new_run_id
from ..serve.openai_wire import short
from ..smoke import (
    DEFAULT_TAGS,
    FAIL,
    ServerHooks,
    failure_text,
    interesting_lines,
    load_suite,
    result_line,
    run_suite,
    suite_for,
    target_vars,
)
from ..smoke.results import truncate
from ..smoke.table import FIRST_FAILURE
from ..steps import kind
from .search import BisectResult, FlakyPolicy, Outcome, bisect, probe_bound
from .subsets import file_log, first_line, step_label, subset_resolved

if TYPE_CHECKING:
    from ..manifest.model import Step
    from ..manifest.resolve import Resolved
    from ..serve.container import Server
    from ..serve.runtime import Runtime
    from ..smoke import SmokeReport, Suite

Log = Callable[[str], None]
EQUIV_CHECK = "equiv"


def select_checks(suite: Suite, checks: Sequence[str], tags: Sequence[str]) -> Suite:
    """``suite`` with only the named checks (``checks`` empty: those ``tags`` select)."""
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


@dataclass(frozen=True)
class FailedCheck:
    """A check that failed in a probe: its line as ``smoke`` prints it, and every failure message."""

    id: str
    line: str
    failures: tuple[str, ...]


@dataclass(frozen=True)
class Evidence:
    """What a probe run left beside its verdict (its :class:`Outcome`'s ``detail``): the report file it wrote
    (``smoke.json``, ``equiv.json``) and, for a smoke probe, the suite's closing line and its failing checks."""

    report: Path | None = None
    summary: str = ""  # "N passed, M failed" (smoke); empty for the accuracy gate
    failed: tuple[FailedCheck, ...] = ()

    @classmethod
    def of_smoke(cls, report: SmokeReport) -> Evidence:
        width = max((len(r.check.id) for r in report.results), default=10)  # as the smoke run padded its ids
        failed = tuple(FailedCheck(r.check.id, result_line(r, width), tuple(r.failures))
                       for r in report.results if r.status == FAIL)
        return cls(report.json_path, report.summary_line(), failed)

    def lines(self) -> list[str]:
        """Each failing check's line, then its failure messages where the line cut them; the closing line."""
        out: list[str] = []
        for check in self.failed:
            out.append(check.line)
            rest = check.failures if check.failures and short(check.failures[0], FIRST_FAILURE) != repr(
                check.failures[0]) else check.failures[1:]
            out += [f"        - {truncate(f, MESSAGE).replace(chr(10), ' ')}" for f in rest]
        if self.summary:
            out.append(self.summary)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"report": None if self.report is None else str(self.report), "summary": self.summary,
                "failed": [{"id": c.id, "failures": list(c.failures)} for c in self.failed]}


MESSAGE = 400  # characters of a failure message under its check's line


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
            lines += ["", f"first failing step: {step.id} ({step.kind}) at {step.location}  [{step.key_path}]"]
            if step.why:
                lines.append(f"  why: {step.why}")
            lines.append("  changes:")
            lines += [f"    {line}" for line in kind(step.kind).describe(step)]
        lines += self.failing_probe_text()
        return "\n".join(lines)

    def failing_probe(self) -> tuple[int, Outcome, Evidence] | None:
        """The first failing cut (the culprit's, or the base when it fails), its first failing run and what that
        run left (an empty :class:`Evidence` when the prober left nothing)."""
        k = self.result.first_failing
        if self.result.status not in ("found", "base-fails") or k is None:
            return None
        point = self.result.point(k)
        failing = None if point is None else point.failing()
        if failing is None:
            return None
        return k, failing, failing.detail if isinstance(failing.detail, Evidence) else Evidence()

    def log_of(self, k: int) -> Path:
        return self.run_dir / f"cut-{k}.log"

    def failing_probe_text(self) -> list[str]:
        """Why the first failing probe failed: its failing checks' lines and the summary as ``smoke`` prints them
        (every check's line is in its log), or its report (a build, a start, the accuracy gate); where to read on."""
        found = self.failing_probe()
        if found is None:
            return []
        k, outcome, evidence = found
        label = self.labels[k] if 0 <= k < len(self.labels) else f"after step {k}"
        lines = ["", f"probe k={k} ({label}) failed:"]
        if evidence.summary:
            lines += evidence.lines()
        else:
            lines += [f"  {line}" for line in outcome.report.splitlines()]
        where = f"log: {self.log_of(k)}"
        lines.append(where if evidence.report is None else f"report: {evidence.report}  {where}")
        return lines

    def to_json(self) -> dict[str, Any]:
        step = self.culprit
        culprit = None if step is None else {"id": step.id, "kind": step.kind, "location": str(step.location),
                                             "key_path": step.key_path, "changes": kind(step.kind).describe(step)}
        return {
            **self.result.to_json(), "selection": self.selection, "labels": list(self.labels),
            "culprit": culprit,
            "reports": {str(k): v for k, v in self.reports.items()},
            "failing_probe": self._failing_probe_json(),
        }

    def _failing_probe_json(self) -> dict[str, Any] | None:
        found = self.failing_probe()
        if found is None:
            return None
        k, _outcome, evidence = found
        return {"k": k, **evidence.to_json(), "log": str(self.log_of(k))}


def bisect_target(resolved: Resolved, runtime: Runtime, *, checks: Sequence[str] = (), suite_path: str | None = None,
                  tags: Sequence[str] | None = None, repeat: int = 1, flaky: FlakyPolicy = "fail",
                  environ: Mapping[str, str] | None = None, echo: Log = print,
                  startup_timeout: float | None = None, host_address: str | None = None) -> BisectRun:
    """Binary search over the cuts after step k (each prepared by ``runtime``: its image built, or its steps
    applied in place) for the first one failing the selected checks.

    Every server is published on and reached at ``host_address`` (default: from ``environ``).  A runtime that
    serves one server at a time (in place): the equiv base's evidence is recorded first, then each cut is compared
    with it; what was prepared is put back at the end.
    """
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

    probing = _Probing(runtime, run_dir, reports, environ, echo, startup_timeout, host_address)
    if runtime.one_at_a_time:
        bound = probe_bound(len(steps)) * repeat + (1 if use_equiv else 0)
        echo(f"bisect {runtime.where}: at most {bound} server starts, one at a time")
    with runtime.restoring(resolved.manifest, environ=environ, log=echo):
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
    environ, echo, startup_timeout, host_address = (probing.environ, probing.echo, probing.startup_timeout,
                                                    probing.host_address)
    if use_equiv:
        selection = "--check equiv (accuracy gate against the base)"
        with _equiv_reference(resolved, environ=environ, echo=echo, run_id=run_id, startup_timeout=startup_timeout,
                              host_address=host_address, runtime=probing.runtime) as (ref_url, subject, settings,
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


@dataclass(frozen=True)
class _Probing:
    """What every bisect probe shares: the runtime that prepares and serves a cut, where its logs and reports go."""

    runtime: Runtime
    run_dir: Path
    reports: dict[int, list[str]]
    environ: Mapping[str, str]
    echo: Log
    startup_timeout: float | None
    host_address: str | None


def _probe_cut(k: int, whole: Resolved, p: _Probing, *, what: str, no_server: str,
               measure: Callable[[Server, Log], Outcome]) -> Outcome:
    """Prepare the cut after step ``k`` of ``whole`` (built, or applied in place), serve it, ``measure`` it: a
    failure to prepare or start is a failing cut."""
    log = file_log(p.run_dir / f"cut-{k}.log")
    p.echo(f"bisect: probing k={k}{what} (log {p.run_dir / f'cut-{k}.log'})")
    cut = subset_resolved(whole, [s.id for s in whole.steps[:k]], suffix="bisect")
    try:  # k = 0, no step yet: the base with the serving arguments, as `run --base` serves it
        prepared = p.runtime.prepare(cut, environ=p.environ, log=log, base=k == 0, pin=True)
    except ImageforgeError as exc:
        return Outcome(False, f"{p.runtime.prepare_failed(f'after step {k}')}: {first_line(exc)}")
    try:
        with p.runtime.serving(cut, prepared, environ=p.environ, startup_timeout=p.startup_timeout, log=log,
                               host_address=p.host_address) as server:
            return measure(server, log)
    except SmokeError as exc:
        return Outcome(False, f"{no_server.format(k=k)}: {first_line(exc)}")


def _smoke_probe(k: int, resolved: Resolved, suite: Suite, p: _Probing) -> Outcome:
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
        failed = [r for r in report.results if r.status == FAIL]
        text = "\n\n".join(failure_text(r, report.log_tail[-10:]) for r in failed)
        # the closing line names every failing check (as smoke's verdict does): bisect's error shows it first
        names = ", ".join(r.check.id for r in failed)
        return Outcome(False, f"{report.summary_line()} ({names})\n{text}", Evidence.of_smoke(report))

    return _probe_cut(k, resolved, p, what="", measure=measure,
                      no_server="the server of the image after step {k} did not start")


@contextlib.contextmanager
def _equiv_reference(resolved: Resolved, *, environ: Mapping[str, str], echo: Log, run_id: str,
                     startup_timeout: float | None, host_address: str | None = None,
                     runtime: Runtime) -> Iterator[tuple[Any, Resolved, Any, Any]]:
    """The base reference server, started once for a whole equiv bisect and kept up beside each cut's (one server
    at a time: its evidence, recorded first)."""
    settings = resolved.target.equiv
    dtype = check_dtype(settings.dtype)
    subject = renamed(with_serving_value(resolved, "dtype", dtype), "equiv")
    base = subset_resolved(subject, [], suffix="bisect")
    prepared = runtime.prepare(base, environ=environ, log=echo, base=True)
    with runtime.serving(base, prepared, environ=environ, run_id=f"{run_id}-ref", startup_timeout=startup_timeout,
                         log=echo, host_address=host_address) as ref:
        if not runtime.one_at_a_time:
            yield ref.url, subject, settings, dtype
            return
        evidence = collect_reference(ref.url, settings.prompts, top_k=settings.top_k,
                                     greedy_tokens=settings.greedy_tokens)
    yield evidence, subject, settings, dtype


def _equiv_probe(k: int, subject: Resolved, ref_url: Any, settings: Any, dtype: Any, p: _Probing) -> Outcome:
    def measure(server: Server, log: Log) -> Outcome:
        out = p.run_dir / f"equiv-cut-{k}-{len(p.reports.get(k, []))}"
        if isinstance(ref_url, str):
            result = compare_urls(ref_url, server.url, settings, dtype, run_dir=out)
        else:  # in place: the base's evidence, recorded before the first cut
            cand = collect_against(server.url, ref_url)
            result = EquivRun(gate(compare(ref_url, cand), settings.tolerance(dtype), dtype), ref_url, cand, out)
            result.write(out)
        p.reports.setdefault(k, []).append(str(out / "equiv.json"))
        return Outcome(result.verdict.passed, "" if result.verdict.passed else result.verdict.text(),
                       Evidence(out / "equiv.json"))

    return _probe_cut(k, subject, p, what=" with equiv", measure=measure,
                      no_server="the image after step {k}")
