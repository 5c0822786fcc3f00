"""Running a bench: warm-up, the measured requests under a concurrency gate and a duration limit, the cached
tokens, repeats (the median run is reported), the verdict; and build + serve + bench + remove a target."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli.progress import progress
from ..errors import ConfigError, SmokeError
from ..rundirs import new_run_id
from ..serve.openai_wire import check_url
from ..serve.waits import await_until
from ..workload import Prompt, Workload
from .client import BenchClient
from .metrics import CACHED_TOKEN_COUNTERS, GENERATION_TOKEN_COUNTERS, PROMPT_TOKEN_COUNTERS, counter_delta
from .plots import NO_PLOTS
from .replay import replay_bench, replay_verdict, write_replay
from .report import write_bench
from .results import BenchResult, RequestResult

if TYPE_CHECKING:
    from ..serve.runtime import Prepared, Runtime

Log = Callable[[str], None]

METRICS_SETTLE = 5.0  # seconds to wait for /metrics counters to catch up with the last response

async def _run(url: str, workload: Workload, echo: Log, transport: Any = None) -> BenchResult:
    client = BenchClient(url, workload, transport)
    try:
        listed, max_model_len = await client.model()
        model = workload.model or listed
        wanted = workload.prompt_tokens + workload.output_tokens
        if max_model_len is not None and wanted > max_model_len:
            raise ConfigError(f"prompt {workload.prompt_tokens} + output {workload.output_tokens} tokens = {wanted} "
                              f"exceeds the server's max_model_len {max_model_len}",
                              hint="lower --prompt-tokens or --output-tokens")
        load_before = _loadavg()
        prompts, mode = await client.prompts(model, range(workload.requests))
        notes: list[str] = []
        if mode == "text":
            notes.append("the server has no /tokenize: prompts are text of about the requested length")
        if workload.warmup:
            warm, _ = await client.prompts(model, range(-workload.warmup, 0), shared=False)
            for prompt in warm:
                res = await client.send(model, prompt)
                if not res.ok:
                    notes.append(f"warm-up request failed: {res.error}")
        before = await client.metrics()
        started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        rate = f", {workload.request_rate:g} requests/s (Poisson)" if workload.request_rate > 0 else ""
        echo(f"bench {url} model {model}: {workload.requests} requests at concurrency {workload.concurrency}{rate}, "
             f"prompt {workload.prompt_tokens} tokens ({workload.prefix_tokens} shared), "
             f"output {workload.output_tokens} tokens, {mode} prompts, api {workload.api}")
        gate = asyncio.Semaphore(workload.concurrency)

        with progress("bench requests", total=len(prompts), unit="requests") as bar:
            async def limited(prompt: Prompt, arrival: float) -> RequestResult:
                if arrival > 0:  # --request-rate: the Poisson arrival time of this request
                    await asyncio.sleep(max(0.0, t0 + arrival - time.monotonic()))
                async with gate:
                    try:
                        return await client.send(model, prompt)
                    finally:
                        bar.advance()

            t0 = time.monotonic()
            tasks = [asyncio.create_task(limited(p, at)) for p, at in zip(prompts, workload.arrivals(), strict=True)]
            done, pending = await asyncio.wait(tasks, timeout=workload.duration)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        results = sorted((t.result() for t in done), key=lambda r: r.index)
        end = max((r.finished for r in results), default=t0) if not pending else time.monotonic()
        wall = max(end - t0, 1e-9)
        if pending:
            notes.append(f"{len(pending)} requests cut by the duration limit ({workload.duration:.0f}s)")
        bench = BenchResult(run_id=new_run_id(), url=url, model=model, workload=workload, started_at=started_at,
                            wall_seconds=wall, results=results, cancelled=len(pending), prompt_mode=mode,
                            notes=notes, host={"cpus": os.cpu_count(), "loadavg_before": load_before,
                                               "loadavg_after": _loadavg()})
        await _cached_tokens(client, bench, before)
        return bench
    finally:
        await client.close()


def _loadavg() -> list[float] | None:
    """The host's 1/5/15-minute load averages (the client shares the CPUs with a local server)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


async def _cached_tokens(client: BenchClient, bench: BenchResult, before: Mapping[str, float] | None) -> None:
    """Fill cached_tokens/cache_source: per-request usage details, else the /metrics counter delta."""
    ok = bench.ok_results
    if ok and all(r.cached_tokens is not None for r in ok):
        bench.cached_tokens = sum(r.cached_tokens or 0 for r in ok)
        bench.cache_source = "usage.prompt_tokens_details.cached_tokens"
    if before is None:
        if bench.cached_tokens is None:
            bench.notes.append("no cached-token count: the server reports neither usage.prompt_tokens_details "
                               "nor /metrics")
        return
    last: dict[str, float] = {}

    async def caught_up() -> dict[str, float] | None:
        """The counters once they include the last response (the engine loop updates them late); None: not yet."""
        nonlocal last
        last = await client.metrics() or last
        prompt = counter_delta(before, last, PROMPT_TOKEN_COUNTERS)
        generated = counter_delta(before, last, GENERATION_TOKEN_COUNTERS)
        done = ((prompt is None or prompt[1] >= bench.prompt_tokens)
                and (generated is None or generated[1] >= bench.completion_tokens))
        return last if done else None

    after = await await_until(caught_up, timeout=METRICS_SETTLE, interval=0.25) or last
    names = (*CACHED_TOKEN_COUNTERS, *PROMPT_TOKEN_COUNTERS, *GENERATION_TOKEN_COUNTERS,
             "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total")
    for name in names:
        if name in before and name in after:
            bench.metrics_delta[name] = round(after[name] - before[name], 3)
    if bench.cached_tokens is None:
        cached = counter_delta(before, after, CACHED_TOKEN_COUNTERS)
        if cached is None:
            bench.notes.append("no cached-token count: no prefix-cache counter in /metrics")
        else:
            bench.cached_tokens = int(cached[1])
            bench.cache_source = f"/metrics {cached[0]} delta"
            bench.notes.append("cached tokens come from server-wide /metrics counters: traffic from other "
                               "clients during the run counts too")


def run_bench(url: str, workload: Workload, *, run_dir: Path | None = None, echo: Log = print,
              transport: Any = None, write: bool = True) -> BenchResult:
    """Run ``workload`` against ``url`` (bounded by ``workload.requests`` and ``workload.duration``).

    Writes ``bench.json`` into ``run_dir`` (default ``./.imageforge/runs/<run id>``) when ``write``.
    ``transport`` (an httpx async transport) replaces the network, for tests. Never raises for
    request failures: they are counted (see :func:`verdict`).
    """

    workload.validate()
    check_url(url)
    runs: list[BenchResult] = []
    skipped = ""
    deadline = time.monotonic() + workload.duration
    for r in range(workload.repeat):
        left = deadline - time.monotonic()
        if r and left < 1.0:
            skipped = (f"{workload.repeat - r} of {workload.repeat} repeats skipped: the duration limit "
                       f"({workload.duration:.0f}s) was spent")
            break
        one = dataclasses.replace(workload, seed=workload.seed + r, warmup=workload.warmup if r == 0 else 0,
                                  duration=max(left, 1.0))
        runs.append(asyncio.run(_run(url, one, echo, transport)))
        if workload.repeat > 1:
            s = runs[-1].summary()
            echo(f"  run {r + 1}/{workload.repeat} (seed {one.seed}): Output {s['output_tps']:.1f} / Input "
                 f"{s['input_tps']:.1f} / Cache {s['cache_tps']:.1f} TPS, weighted_tps {s['weighted_tps']:.0f}, errors "
                 f"{s['errors']}/{s['requests']}")
    bench = median_run(runs)
    if skipped:
        bench.notes.append(skipped)
    if write:
        bench.run_dir = run_dir or Path.cwd() / ".imageforge" / "runs" / bench.run_id
        write_bench(bench)
    return bench


def median_run(runs: Sequence[BenchResult]) -> BenchResult:
    """The run with the median weighted_tps (the lower middle one for an even count), carrying every run's
    summary."""
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda b: b.weighted_tps)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.repeats = [b.summary() | {"seed": b.workload.seed} for b in runs]
    rates = ", ".join(f"{b.weighted_tps:.0f}" for b in runs)
    chosen.notes.append(f"median of {len(runs)} runs by weighted_tps (seed {chosen.workload.seed}): {rates}")
    return chosen


def verdict(bench: BenchResult) -> None:
    """SmokeError (exit 4) when the error rate is above the workload's threshold or no token came back."""
    w = bench.workload
    first = next((r.error for r in bench.results if r.error), None)
    if bench.completion_tokens == 0:
        raise SmokeError(
            f"the bench of {bench.url} got no tokens back ({bench.errors} of {bench.attempted} requests failed"
            + (f", {bench.cancelled} cut by the duration limit" if bench.cancelled else "") + ")",
            found=first, hint=f"the per-request errors are in {bench.json_path}" if bench.json_path else None)
    if bench.worst_error_rate > w.max_error_rate:
        counted = (f"{bench.errors} of {bench.attempted} bench requests failed" if bench.error_rate > w.max_error_rate
                   else f"a run of the {len(bench.repeats)} repeats had failed requests")
        raise SmokeError(
            f"{counted} (error rate {bench.worst_error_rate:.1%} > {w.max_error_rate:.1%})", found=first,
            hint="raise --max-error-rate to accept some failures"
            + (f"; the per-request errors are in {bench.json_path}" if bench.json_path else ""))


def bench_target(resolved: Any, workload: Workload, runtime: Runtime, *, environ: Mapping[str, str] | None = None,
                 echo: Log = print, port: int | None = None, prepared: Prepared | None = None,
                 startup_timeout: float | None = None, params: Mapping[str, Any] | None = None,
                 host_address: str | None = None) -> BenchResult:
    """Prepare TARGET:PROFILE (unless ``prepared``: built, or applied in place), serve it on ``host_address`` with
    ``runtime``, bench it, always end the server."""
    workload.validate()
    environ = os.environ if environ is None else environ
    run_id = new_run_id()
    prepared = prepared or runtime.prepare(resolved, environ=environ, log=echo)
    with runtime.serving(resolved, prepared, environ=environ, port=port, run_id=run_id,
                         startup_timeout=startup_timeout, log=echo, host_address=host_address) as server:
        bench = run_bench(server.url, workload, echo=echo, write=False)
        bench.run_dir = server.run_dir
        bench.target, bench.profile = resolved.target.name, resolved.profile_name
        bench.params = dict(params or {})
        bench.startup_seconds = server.startup_seconds
        if not server.running():
            bench.notes.append(f"the server stopped during the bench: {server.describe_state()}")
        write_bench(bench)
        return bench


def replay_target(resolved: Any, options: Any, runtime: Runtime, *, environ: Mapping[str, str] | None = None,
                  echo: Log = print, port: int | None = None, startup_timeout: float | None = None,
                  host_address: str | None = None) -> Any:
    """Prepare TARGET:PROFILE (built, or applied in place), serve it with ``runtime``, replay one at a time
    (:func:`.replay.replay_bench`), end the server.

    The generated workload is scaled to ``options.max_model_len``, else the server's max_model_len, else the
    target's resolved ``max-model-len``; the target's ``replay:`` gives the time cap (unless --time-cap) and
    the redline sources that gate (:func:`with_target`).
    """
    environ = os.environ if environ is None else environ
    if options.max_model_len is None and options.file is None:
        declared = resolved.serving_args().get("max-model-len")
        if isinstance(declared, int):
            options = dataclasses.replace(options, max_model_len=declared)
    options = with_target(options, resolved.target.replay)
    prepared = runtime.prepare(resolved, environ=environ, log=echo)
    with runtime.serving(resolved, prepared, environ=environ, port=port, run_id=new_run_id(),
                         startup_timeout=startup_timeout, log=echo, host_address=host_address) as server:
        result = replay_bench(server.url, options, server.run_dir, echo=echo)
        result.target, result.profile = resolved.target.name, resolved.profile_name
        result.startup_seconds = server.startup_seconds
        write_replay(result)
        return result


def with_target(options: Any, settings: Any) -> Any:
    """``options`` with a target's ``replay:`` settings: its time cap unless --time-cap gave one, its gate."""
    cap = options.time_cap if options.time_cap is not None else settings.time_cap
    return dataclasses.replace(options, time_cap=cap, gate=tuple(settings.gate)).validate()


def replay_report(result: Any, options: Any, echo: Log, show: Callable[[Any], None] | None = None) -> Any:
    """Log the replay's metrics and target lines, ``show`` the result (the command's --json), then its verdict."""
    for line in result.lines():
        echo(line)
    echo(f"report: {result.json_path}")
    echo(f"plot: {result.png_path if result.png_path is not None else NO_PLOTS}")
    if show is not None:
        show(result)
    replay_verdict(result, options)
    return result
