"""The smoke entry points: run a suite against a URL, or build + serve + smoke + remove a target."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, SmokeError
from ..rundirs import new_run_id
from ..serve.openai_wire import check_url
from ..serve.waits import probe_health, wait_healthy
from .report import LOG_TAIL, interesting_lines, print_failures, write_reports
from .results import SKIP, CheckResult, SmokeReport
from .runner import Runner, ServerHooks
from .suite import DEFAULT_TAGS, Suite, load_suite
from .table import LiveTable

if TYPE_CHECKING:
    from ..serve.runtime import Runtime

Log = Callable[[str], None]


def run_suite(
    suite: Suite,
    url: str,
    *,
    tags: Sequence[str] = DEFAULT_TAGS,
    run_id: str | None = None,
    run_dir: Path,
    vars: Mapping[str, Any] | None = None,
    hooks: ServerHooks | None = None,
    echo: Log = print,
    console: Any = None,
    live: bool | None = None,
    target: str | None = None,
    profile: str | None = None,
    startup_seconds: float | None = None,
    transport: Any = None,
    params: Mapping[str, Any] | Sequence[str] | None = None,
) -> SmokeReport:
    """Run the checks of ``suite`` selected by ``tags`` against ``url``; write the reports.

    ``transport`` (an httpx transport) replaces the network, for tests. ``params``: the suite's parameters
    (``NAME=VALUE`` texts or a mapping; the rest keep their defaults; an unknown one is a ConfigError).
    The report lists every check of the suite: those the tags leave out as skipped, with why.

    Returns the report (``report.ok`` says whether everything passed); raises SmokeError only
    when no server answers at all.
    """
    run_id = run_id or new_run_id()
    t0 = time.monotonic()
    checks = suite.select(tags)
    resolved_params = suite.resolve_params(params)
    hooks = hooks or ServerHooks()
    runner = Runner(suite, url, tags=tags, vars=vars, hooks=hooks, echo=echo, transport=transport,
                    params=resolved_params)
    try:
        first = probe_health(runner.http, timeout=10)
        if first.connect_failed:
            raise SmokeError(
                f"no server answers at {url}",
                found=first.error,
                hint="start one with `invoke run --target T` (it prints URL=...), or let `invoke smoke --target T` "
                "start and stop one",
            )
        runner.prepare()
        echo(f"smoke {suite.name} ({suite.path}): {len(checks)} checks tagged {', '.join(tags) or 'any'} "
             f"against {url}  run {run_id}")
        if suite.params:
            echo("  parameters: " + ", ".join(f"{k}={v}" for k, v in resolved_params.items()))
        for problem in runner.setup_problems:
            echo(f"  warning: {problem}")
        with LiveTable(checks, echo=echo, console=console, live=live) as table:
            results = runner.run(checks, table)
    finally:
        runner.close()
    seconds = time.monotonic() - t0
    chosen = {c.id for c in checks}
    left_out = [CheckResult(c, status=SKIP, message=suite.not_selected_reason(c, tags))
                for c in suite.checks if c.id not in chosen]
    report = SmokeReport(run_id=run_id, suite=suite, url=url, tags=tuple(tags), results=results, started=t0,
                         seconds=seconds, run_dir=run_dir, target=target, profile=profile,
                         server_problem=runner.server_down, startup_seconds=startup_seconds,
                         not_selected=left_out, params=resolved_params)
    if not report.ok and hooks.log_tail is not None:
        with contextlib.suppress(Exception):
            report.log_tail = hooks.log_tail(LOG_TAIL)
    write_reports(report)
    print_failures(report, echo)
    echo(report.summary_line())
    echo(f"report: {report.json_path}  junit: {report.junit_path}  ({seconds:.1f}s)")
    return report



def parse_tags(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else [t for part in text for t in part.split(",")]
    tags = tuple(t.strip() for t in items if t.strip())
    return tags or None


def target_vars(resolved: Any) -> dict[str, Any]:
    """Variables the manifest knows for a target: served_model_name, max_model_len."""
    args = resolved.serving_args()
    out: dict[str, Any] = {}
    name = args.get("served-model-name") or args.get("model")
    if isinstance(name, list):
        name = name[0] if name else None
    if name:
        out["served_model_name"] = str(name)
    if isinstance(args.get("max-model-len"), int):
        out["max_model_len"] = int(args["max-model-len"])
    return out


def suite_for(resolved: Any, explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    suite: Path | None = resolved.target.smoke.suite
    if suite is None:
        raise ConfigError(
            f"target {resolved.target.name!r} names no smoke suite",
            key_path=f"targets.{resolved.target.name}.smoke.suite",
            hint="add smoke.suite to the target in the manifest, or pass --suite smoke/<file>.yaml",
        )
    return suite


def smoke_url(url: str, *, suite_path: Path, tags: Sequence[str], run_root: Path, echo: Log = print,
              vars: Mapping[str, Any] | None = None, wait: float = 0.0, target: str | None = None,
              params: Sequence[str] = ()) -> SmokeReport:
    """``invoke smoke --url``: a server somebody else started (``target``: the one --target named, for the
    report)."""
    check_url(url)
    suite = load_suite(suite_path)
    suite.resolve_params(params)  # an unknown or refused --param: exit 2 before anything is sent
    if wait > 0:
        _wait_for_url(url, wait, echo)
    run_id = new_run_id()
    return run_suite(suite, url, tags=tags, run_id=run_id, run_dir=run_root / ".imageforge" / "runs" / run_id,
                     vars=vars, echo=echo, target=target, params=params)


def _wait_for_url(url: str, timeout: float, echo: Log) -> None:
    if wait_healthy(url, timeout=timeout, interval=1.0, probe_timeout=3.0) is None:
        echo(f"{url}/health did not answer 200 within {timeout:.0f}s; running the suite anyway")


def smoke_target(resolved: Any, runtime: Runtime, *, environ: Mapping[str, str] | None = None,
                 suite_path: Path | None = None, tags: Sequence[str] | None = None, echo: Log = print,
                 base: bool = False, port: int | None = None, live: bool | None = None,
                 startup_timeout: float | None = None, host_address: str | None = None,
                 params: Sequence[str] = ()) -> SmokeReport:
    """``invoke smoke --target T --profile P``: prepare (build, or apply in place), serve, run the suite, always
    end the server (``runtime``: a container, or a process serving the files under a root).

    The server is published on and reached at ``host_address`` (default: from ``environ``, else 127.0.0.1).
    """
    environ = os.environ if environ is None else environ
    suite = load_suite(suite_for(resolved, str(suite_path) if suite_path else None))
    suite.resolve_params(params)  # an unknown or refused --param: exit 2 before any build or start
    selected_tags = tuple(tags) if tags else (tuple(resolved.target.smoke.tags) or DEFAULT_TAGS)
    run_id = new_run_id()
    prepared = runtime.prepare(resolved, environ=environ, log=echo, base=base)
    with runtime.serving(resolved, prepared, environ=environ, port=port, run_id=run_id,
                         startup_timeout=startup_timeout, log=echo, host_address=host_address) as server:

        def alive() -> str | None:
            return None if server.running() else f"container {server.name}: {server.describe_state()}"

        hooks = ServerHooks(alive=alive, log_tail=lambda n: interesting_lines(server.logs(n * 20), n))
        return run_suite(suite, server.url, tags=selected_tags, run_id=run_id, run_dir=server.run_dir,
                         vars=target_vars(resolved), hooks=hooks, echo=echo, live=live,
                         target=resolved.target.name, profile=server.profile,
                         startup_seconds=server.startup_seconds, params=params)
