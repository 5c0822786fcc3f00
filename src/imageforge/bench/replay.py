"""The evaluator's replay, running: a one-at-a-time runner and ``invoke bench --replay``.

The workload (request model, seeded generator, JSONL writer) is :mod:`.replay_workload`; a dataset in either
format and the token counters are :mod:`.replay_loading`; the metrics are :mod:`.evaluator`'s.

* :func:`run_replay` -- sends the requests **one at a time** (concurrency 1) on a blocking ``httpx.Client``
  (:func:`.client.stream_request_sync`, httpx-sse; no event loop: it costs ~30 ms of TTFT on a loaded machine)
  to an OpenAI-compatible server and records, per request, TTFT,
  total time, prompt / cached / completion tokens (``stream_options.include_usage``), whether a finish reason
  came, the status and the harness's error class.  As the harness: a 429, 5xx, connection failure or timeout
  is retried up to 3 times after 5, 10, 20 s (:class:`RetryPolicy`), the request's clock running from before
  the first attempt.  The **time cap** ends the replay: a request not started by then adds nothing, and one
  still running at the cap is dropped (the harness stops collecting at its cap); the wall time runs from the
  first request sent to the last stream's end (the cap, when it cut).
* :func:`replay_bench` -- what ``invoke bench --replay [FILE]`` runs (:class:`ReplayOptions`): generate (or
  load), replay, write ``bench.json`` and ``bench.png``; :func:`replay_verdict` is its exit code.

With ``planned_output`` (the default: random weights never stop by themselves) a request
that carries no ``max_tokens`` / ``max_completion_tokens`` gets ``max_tokens`` = its planned output length.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..cli.progress import progress
from ..errors import ConfigError, SmokeError
from .client import Streamed, stream_request_sync
from .evaluator import EvalReport, RequestRecord, classify_http, classify_transport, evaluate, retryable_status
from .plots import available as plots_available
from .plots import plot_replay
from .redlines import SOURCE_TEXT, failing, gated_sources
from .replay_loading import dataset_format, load_jsonl, server_counter
from .replay_workload import ReplayRequest, ReplaySpec, generate, stats, write_jsonl
from .sampling import Pass, choose, cold_cache, predict, prediction_lines, sessions

Log = Callable[[str], None]
Clock = Callable[[], float]
Sleep = Callable[[float], Any]

CHAT_ENDPOINT = "/v1/chat/completions"

# --------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class RetryPolicy:
    """The harness's retries of transient failures: ``retries`` more attempts, ``first_delay`` s doubling up to
    ``max_delay`` (5, 10, 20 s by default)."""

    retries: int = 3
    first_delay: float = 5.0
    factor: float = 2.0
    max_delay: float = 60.0

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based)."""
        return min(self.first_delay * self.factor ** (attempt - 1), self.max_delay)


@dataclass
class ReplayRun:
    """A finished replay: records in send order, plus where and how it ran."""

    url: str
    model: str
    started_at: str
    wall_s: float
    records: list[RequestRecord]
    stopped_by: str  # "all requests", "request count", "time cap"
    planned_output: bool
    time_cap_s: float | None = None
    not_started: int = 0
    host: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> EvalReport:
        return evaluate(self.records, self.wall_s, not_started=self.not_started)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "started_at": self.started_at,
                "wall_s": round(self.wall_s, 3), "stopped_by": self.stopped_by, "concurrency": 1,
                "time_cap_s": self.time_cap_s, "planned_output": self.planned_output, "host": self.host,
                "report": self.report.to_json(), "requests": [r.to_json() for r in self.records]}


def prepare_body(request: ReplayRequest, model: str, *, planned_output: bool) -> dict[str, Any]:
    """The body actually sent: the served model, streamed with usage, and (``planned_output``) a max_tokens."""
    body = copy.deepcopy(request.body)
    body["model"] = model
    body["stream"] = True
    options = body.get("stream_options")
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if (planned_output and request.planned_output is not None
            and "max_tokens" not in body and "max_completion_tokens" not in body):
        body["max_tokens"] = request.planned_output
    return body


def attempt_failure(got: Streamed) -> tuple[str, bool, str] | None:
    """One attempt's failure as (class, retryable, text), or None when it succeeded (as the harness counts it:
    a 200 stream that ends without a finish reason, or with an ``error`` event, is a success, unfinished)."""
    from httpx_sse import SSEError

    exc = got.exception
    if got.status is not None and got.status != 200:
        text = got.error_text or (f"{type(exc).__name__}: {exc}" if exc is not None else "")
        return classify_http(got.status, got.error_text), retryable_status(got.status), text or f"HTTP {got.status}"
    if exc is None:
        return None
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SSEError):  # a 200 that is not an event stream although one was asked for: not retried
        return "stream_aborted", False, text
    timed_out = isinstance(exc, httpx.TimeoutException)
    return classify_transport(timed_out=timed_out, got_response=got.status is not None), True, text


class CapReached(Exception):
    """The replay's time cap passed while a request ran (or waited to retry): that request is dropped."""


def send_one(client: Any, index: int, body: dict[str, Any], *, planned_input: int | None = None,
             session: str | None = None, policy: RetryPolicy = RetryPolicy(), clock: Clock = time.perf_counter,
             sleep: Sleep = time.sleep, deadline: float | None = None, timeout: float | None = None) -> RequestRecord:
    """POST one streamed chat request, retrying transient failures (``policy``), and measure it from before the
    first attempt (``client``: an ``httpx.Client`` on the server).

    ``deadline`` (a ``clock`` value, the time cap): :class:`CapReached` when an attempt ends after it or a
    back-off would; ``timeout`` bounds each read (else the client's).
    """
    start = clock()
    attempt = 0
    waited = 0.0
    while True:
        attempt += 1
        offset = clock() - start
        got = stream_request_sync(client, CHAT_ENDPOINT, body, clock=clock, deadline=deadline, timeout=timeout)
        if got.cut:
            raise CapReached
        failure = attempt_failure(got)
        if failure is not None and failure[1] and attempt <= policy.retries:
            delay = policy.delay(attempt)
            if deadline is not None and clock() + delay > deadline:
                raise CapReached
            sleep(delay)
            waited += delay
            continue
        break
    total = clock() - start
    base = RequestRecord(index=index, status=got.status, total_s=total, attempts=attempt, retry_wait_s=waited,
                         input_tokens_planned=planned_input, session=session)
    if failure is not None:
        return dataclasses.replace(base, error_class=failure[0], error=failure[2][:300])
    completion = got.completion_tokens if got.usage else got.chunks
    note = None if got.error_text is None else f"stream error event: {got.error_text}"[:300]
    return dataclasses.replace(base, error=note, ttft_s=None if got.ttft is None else offset + got.ttft,
                               prompt_tokens=got.prompt_tokens, completion_tokens=completion,
                               cached_tokens=got.cached_tokens, finished=got.finish_reason is not None)


def discover_model(url: str, model: str | None = None, *, transport: Any = None) -> tuple[str, int | None]:
    """The served model (``model`` if listed, else the first) and its max_model_len (vLLM lists it)."""
    try:
        with httpx.Client(transport=transport, timeout=15.0) as client:
            response = client.get(url.rstrip("/") + "/v1/models")
    except httpx.HTTPError as exc:
        raise SmokeError(f"no server answers at {url}", found=f"{type(exc).__name__}: {exc}",
                         hint="start one with `invoke run --target T` (it prints URL=...)") from None
    try:
        entries = response.json()["data"]
        entry = next((e for e in entries if e["id"] == model), entries[0])
    except (ValueError, KeyError, IndexError, TypeError):
        raise SmokeError(f"GET {url}/v1/models lists no model", found=response.text[:300]) from None
    limit = entry.get("max_model_len")
    return str(entry["id"]), int(limit) if isinstance(limit, int) else None


def run_replay(requests: Sequence[ReplayRequest], url: str, *, model: str | None = None,
               max_requests: int | None = None, time_cap: float = 3600.0, timeout: float = 1000.0,
               planned_output: bool = True, log: Log | None = None, transport: Any = None,
               policy: RetryPolicy = RetryPolicy(), clock: Clock = time.perf_counter,
               sleep: Sleep = time.sleep) -> ReplayRun:
    """Send ``requests`` one at a time; stop after ``max_requests`` or at the time cap (``time_cap`` seconds from
    the first request sent: a request not started by then is not sent; one still running is dropped).

    ``timeout`` bounds each attempt's reads (the competition's redline is a total-time p99 of 999,999 ms).
    ``transport``: an httpx transport for a blocking client (tests: ``httpx.MockTransport``).
    """
    if time_cap <= 0 or timeout <= 0:
        raise ConfigError("time cap and timeout must be > 0")
    if max_requests is not None and max_requests < 1:
        raise ConfigError(f"max requests must be >= 1 (got {max_requests})")
    served, _ = discover_model(url, model, transport=transport)
    limit = len(requests) if max_requests is None else min(max_requests, len(requests))
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    load_before = _loadavg()
    records: list[RequestRecord] = []
    stopped_by = "all requests" if limit == len(requests) else "request count"
    first: float | None = None
    last: float | None = None
    not_started = 0
    cut = False
    with httpx.Client(base_url=url.rstrip("/"), timeout=httpx.Timeout(timeout, connect=10.0),
                      transport=transport) as client, \
            progress("replay requests", total=limit, unit="requests") as bar:
        for i, request in enumerate(requests[:limit]):
            now = clock()
            if first is None:
                first = now
            if now - first >= time_cap:
                stopped_by, not_started = "time cap", limit - i
                break
            body = prepare_body(request, served, planned_output=planned_output)
            session = (request.meta or {}).get("session")
            try:
                record = send_one(client, i, body, planned_input=request.planned_input,
                                  session=None if session is None else str(session), policy=policy, clock=clock,
                                  sleep=sleep, deadline=first + time_cap, timeout=timeout)
            except CapReached:
                stopped_by, not_started, cut = "time cap", limit - i, True
                break
            last = clock()
            records.append(record)
            bar.advance()
            if log is not None:
                log(_request_line(record, i, limit))
    wall = time_cap if cut else (last - first if first is not None and last is not None else 0.0)
    return ReplayRun(url=url, model=served, started_at=started_at, wall_s=wall, records=records,
                     stopped_by=stopped_by, planned_output=planned_output, time_cap_s=time_cap,
                     not_started=not_started,
                     host={"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": _loadavg()})


def _request_line(record: RequestRecord, i: int, limit: int) -> str:
    state = "ok" if record.ok else f"{record.error_class} ({record.error})"
    if record.ok and not record.finished:
        state = "ok, unfinished (no finish reason)"
    ttft = "-" if record.ttft_s is None else f"{record.ttft_s:.3f}s"
    retries = f", {record.attempts - 1} retries ({record.retry_wait_s:.0f} s back-off)" if record.attempts > 1 else ""
    return (f"  [{i + 1}/{limit}] {state}: prompt {record.prompt_tokens} (cached {record.cached_tokens}), out "
            f"{record.completion_tokens}, ttft {ttft}, total {record.total_s or 0:.3f}s{retries}")


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


# --------------------------------------------------------------------------- invoke bench --replay


@dataclass(frozen=True)
class ReplayOptions:
    """What ``invoke bench --replay [FILE]`` asks for."""

    file: Path | None = None  # a user's JSONL; None: generate one
    out: Path | None = None  # where the generated JSONL goes (default: the run directory's replay.jsonl)
    requests: int = 32  # generated requests (a user's file: stop after this many, 0: all)
    seed: int = 0
    max_model_len: int | None = None  # default: the server's (/v1/models), else the target's serving args
    planned_output: bool = True
    duration: float = 3600.0  # the time cap when neither --time-cap nor the target gives one
    timeout: float = 1000.0
    max_error_rate: float = 0.0
    require_targets: bool = False  # exit 4 when an organisers' target does not PASS
    time_cap: float | None = None  # seconds from the first request sent (--time-cap, else the target's replay:)
    gate: tuple[str, ...] = ()  # redline sources that exit 4 (the target's replay.gate)
    sample: int = 0  # --sample N: about N requests of whole sessions of FILE (seed: --seed); 0: the whole file
    passes: int = 1  # --passes R: the sample runs R times, each on a prefix cache of its own

    @property
    def cap(self) -> float:
        """The time cap this replay runs under."""
        return self.time_cap if self.time_cap is not None else self.duration

    def validate(self) -> ReplayOptions:
        problems = []
        if self.requests < 0:
            problems.append(f"requests must be >= 0 (got {self.requests})")
        if self.max_model_len is not None and self.max_model_len < 256:
            problems.append(f"max-model-len must be >= 256 (got {self.max_model_len})")
        if self.duration <= 0 or self.timeout <= 0 or (self.time_cap is not None and self.time_cap <= 0):
            problems.append("duration, time cap and timeout must be > 0")
        if not 0.0 <= self.max_error_rate <= 1.0:
            problems.append(f"max error rate must be within 0..1 (got {self.max_error_rate})")
        if self.file is not None and self.out is not None:
            problems.append("--replay FILE replays your file: --replay-out only keeps a generated workload")
        if self.sample < 0 or (self.sample and self.file is None):
            problems.append("--sample N takes N >= 1 requests of whole sessions of a file: --replay FILE --sample N")
        if self.passes < 1 or (self.passes > 1 and not self.sample):
            problems.append(f"--passes R (>= 1, got {self.passes}) runs a sample R times: --replay FILE --sample N "
                            "--passes R")
        if problems:
            raise ConfigError("invalid replay options: " + "; ".join(problems))
        return self


@dataclass
class ReplayBench:
    """A replay as ``invoke bench --replay`` ran it: the run, the workload, where everything went."""

    run: ReplayRun
    workload: dict[str, Any]  # source (generated / file), path, spec, stats
    run_dir: Path
    prediction: dict[str, Any] | None = None  # --sample: the full replay's figures with intervals
    json_path: Path | None = None
    png_path: Path | None = None
    target: str | None = None
    profile: str | None = None
    startup_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        run = self.run.to_json()
        if self.prediction is not None:
            run["report"]["prediction"] = self.prediction
        return {"kind": "replay", "target": self.target, "profile": self.profile,
                "startup_seconds": None if self.startup_seconds is None else round(self.startup_seconds, 2),
                "workload": self.workload, **run}

    def lines(self) -> list[str]:
        w = self.workload
        host = self.run.host
        out = [f"replay {self.run.url} model {self.run.model}: {len(self.run.records)} requests one at a time "
               f"({w['source']}: {w['path']}); stopped by {self.run.stopped_by}; wall {self.run.wall_s:.1f} s; "
               f"load {host.get('loadavg_before')} -> {host.get('loadavg_after')} on {host.get('cpus')} CPUs"]
        out.extend(self.run.report.lines())
        if self.prediction is not None:
            out.extend(prediction_lines(self.prediction))
        return out


def replay_workload(options: ReplayOptions, url: str, model: str, server_len: int | None,
                    run_dir: Path, *, transport: Any = None) -> tuple[list[ReplayRequest], dict[str, Any]]:
    """The requests to replay: the user's file, or a seeded workload (counted in the server's tokens, scaled to
    ``options.max_model_len`` or the server's max-model-len) kept as JSONL."""
    if options.file is not None:
        requests = load_jsonl(options.file)
        if options.sample:
            return requests, {"source": "file", "path": str(options.file), "format": dataset_format(requests),
                              "stats": stats(requests)}
        if options.requests:
            requests = requests[:options.requests]
        return requests, {"source": "file", "path": str(options.file), "format": dataset_format(requests),
                          "stats": stats(requests)}
    max_len = options.max_model_len or server_len
    if max_len is None:
        raise ConfigError("the server does not list its max_model_len: the replay cannot be scaled",
                          hint="pass --max-model-len N")
    spec = ReplaySpec(requests=options.requests or ReplaySpec.requests, seed=options.seed, max_model_len=max_len)
    requests = generate(spec, server_counter(url, model, transport=transport))
    path = write_jsonl(requests, options.out or run_dir / "replay.jsonl")
    return requests, {"source": "generated", "path": str(path), "format": dataset_format(requests),
                      "spec": dataclasses.asdict(spec), "stats": stats(requests)}


def replay_bench(url: str, options: ReplayOptions, run_dir: Path, *, echo: Log = print,
                 transport: Any = None) -> ReplayBench:
    """Generate (or load), replay one at a time, write ``bench.json`` and ``bench.png`` into ``run_dir``."""
    options.validate()
    if options.file is not None:
        load_jsonl(options.file)  # a bad file is exit 2 before any server is asked
    model, server_len = discover_model(url, transport=transport)
    requests, workload = replay_workload(options, url, model, server_len, run_dir, transport=transport)
    echo(f"workload ({workload['source']}): {workload['path']} {json.dumps(workload['stats'])}")
    population = chosen = None
    if options.sample:
        population = sessions(requests)
        chosen = choose(population, options.sample, options.seed)
        requests = [requests[i] for s in chosen for i in s.requests]
        workload["sample"] = {"requests": options.sample, "seed": options.seed, "passes": options.passes,
                              "sessions": [s.index for s in chosen]}
        echo(f"sample (seed {options.seed}): {len(requests)} requests of {len(chosen)} whole sessions")

    def replay(batch: Sequence[ReplayRequest]) -> ReplayRun:
        return run_replay(batch, url, model=model, time_cap=options.cap, timeout=options.timeout,
                          planned_output=options.planned_output, log=echo, transport=transport)

    if chosen is None or population is None:
        result = ReplayBench(replay(requests), workload, run_dir)
    else:
        runs = []
        for k in range(1, options.passes + 1):
            if options.passes > 1:
                echo(f"pass {k} of {options.passes}")
            runs.append(replay(cold_cache(requests, f"imageforge pass {k} {run_dir.name}")))
        result = ReplayBench(runs[0], workload, run_dir)
        result.prediction = predict(chosen, population, [Pass(r.records, r.wall_s) for r in runs],
                                    time_cap=options.cap)
    write_replay(result)
    return result


def write_replay(result: ReplayBench) -> None:
    result.run_dir.mkdir(parents=True, exist_ok=True)
    result.json_path = result.run_dir / "bench.json"
    result.json_path.write_text(json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    title = f"replay of {len(result.run.records)} requests on {result.run.model}, one at a time"
    result.png_path = (plot_replay(result.run.records, result.run_dir / "bench.png", title=title,
                                   shares=result.run.report.metrics["score_shares"])
                       if plots_available() else None)


def replay_verdict(result: ReplayBench, options: ReplayOptions) -> None:
    """SmokeError (exit 4): no token back, an error rate above ``max_error_rate``, or a FAILing redline of a
    gated source (the target's ``replay.gate``; the organisers' targets with ``require_targets``)."""
    report = result.run.report
    m = report.metrics
    first = next((r.error for r in result.run.records if not r.ok), None)
    attempted, failed = m["attempted_requests"], m["error_requests"]
    if m["total_output_tokens"] == 0:
        raise SmokeError(f"the replay of {result.run.url} got no tokens back ({failed} of {attempted} requests "
                         "failed)", found=first, hint=f"the per-request errors are in {result.json_path}")
    rate = failed / attempted if attempted else 0.0
    if rate > options.max_error_rate:
        raise SmokeError(f"{failed} of {attempted} replayed requests failed (error rate {rate:.1%} > "
                         f"{options.max_error_rate:.1%})", found=first,
                         hint="raise --max-error-rate to accept some; the per-request errors are in "
                         f"{result.json_path}")
    sources = gated_sources(options.gate, require_targets=options.require_targets)
    missed = failing(report.redlines, sources)
    if missed:
        named = sorted({r.line.source for r in missed})
        raise SmokeError("the replay fails " + " and ".join(SOURCE_TEXT[n] for n in named),
                         found="; ".join(r.render() for r in missed),
                         hint="the redlines that gate are the target's replay.gate (and the organisers' targets "
                         "with --require-targets)")


def replay_options(replay: str | bool, replay_out: str = "", **fields: Any) -> ReplayOptions | None:
    """The task's ``--replay [FILE]`` / ``--replay-out FILE`` (+ workload fields) -> options; None: no replay.

    ``replay``: ``""``/False (no replay), True (bare ``--replay``: generate) or a file name.  ``max_model_len``
    0 means the server's; ``time_cap`` 0 the target's (``replay.time_cap``), else ``duration``.
    """
    if not replay:
        if replay_out:
            raise ConfigError("--replay-out keeps a generated replay workload: add --replay")
        return None
    max_len = fields.pop("max_model_len", 0) or None
    fields["time_cap"] = fields.pop("time_cap", 0) or None
    file = Path(replay) if isinstance(replay, str) and replay not in ("True", "true") else None
    return ReplayOptions(file=file, out=Path(replay_out) if replay_out else None, max_model_len=max_len,
                         **fields).validate()
