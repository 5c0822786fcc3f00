"""Parameter sweeps: one build + server + bench per combination of ``--param`` values (only the serving-config
layer is rebuilt), best weighted_tps and Output-TPS plateau marked, ``sweep.json`` + ``sweep.md``.

(The module is ``sweeps``, not ``sweep``: ``imageforge.bench.sweep`` is the function.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ImageforgeError, SmokeError
from ..manifest.resolve import resolve
from ..rundirs import new_run_id
from ..workload import Workload
from .metrics import CACHED_WEIGHT, OUTPUT_WEIGHT, PLATEAU_TOLERANCE, UNCACHED_INPUT_WEIGHT, plateau_index
from .plots import NO_PLOTS, plot_sweep
from .plots import available as plots_available
from .report import fmt, make_console, ms, write_bench
from .results import rounded
from .runner import bench_target, median_run, run_bench, verdict

if TYPE_CHECKING:
    from ..serve.runtime import Prepared, Runtime

Log = Callable[[str], None]

def parse_params(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["max-num-seqs=1,2,4", "env.X=a,b"]`` -> ``[("max-num-seqs", [1, 2, 4]), ("env.X", ["a", "b"])]``.

    Values are read as YAML scalars (like ``--set``); keys keep their order, which is the sweep's order.
    """
    import yaml

    out: list[tuple[str, list[Any]]] = []
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values_text = [v.strip() for v in text.split(",")]
        if not sep or not key or not any(values_text) or not all(values_text):
            raise ConfigError(f"--param: cannot read {item!r}", expected="KEY=V1,V2,..., e.g. max-num-seqs=1,4,8",
                              found=repr(item))
        if key in seen:
            raise ConfigError(f"--param {key} is given twice", hint="list every value in one --param KEY=V1,V2")
        seen.add(key)
        values: list[Any] = []
        for value_text in values_text:
            try:
                value = yaml.safe_load(value_text)
            except yaml.YAMLError:
                value = value_text
            values.append(value_text if isinstance(value, dict | list) or value is None else value)
        out.append((key, values))
    if not out:
        raise ConfigError("a sweep needs at least one --param KEY=V1,V2,...", expected="--param max-num-seqs=1,4,8")
    return out


def combinations(params: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """Every combination, the first parameter varying slowest (itertools.product order)."""
    keys = [k for k, _ in params]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(v for _, v in params))]


def set_args(point: Mapping[str, Any]) -> list[str]:
    """A sweep point as ``--set`` assignments (booleans as YAML ``true``/``false``)."""
    return [f"{k}={'true' if v is True else 'false' if v is False else v}" for k, v in point.items()]


@dataclass
class SweepPoint:
    params: dict[str, Any]
    status: str = "pending"  # ok, failed (bench verdict), no-start, build-error
    error: str | None = None
    summary: dict[str, Any] | None = None
    build: str = ""  # which layers were built
    image_id: str | None = None
    startup_seconds: float | None = None
    reused: bool = False  # served by a running server of the same run spec (--reuse-servers): no start-up of its own
    bench_json: str | None = None
    rates: list[float] = field(default_factory=list)  # every repeat's weighted_tps (workload.repeat > 1)
    load: float | None = None  # the host's 1-minute load average when the (median) bench started
    runs: list[dict[str, Any]] = field(default_factory=list)  # every run's summary (+ round, seed, load)
    ratio: tuple[float, float, float] | None = None  # interleaved: median, min, max of weighted_tps / the first's

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "status": self.status, "error": self.error, "build": self.build,
                "image_id": self.image_id, "startup_seconds": rounded(self.startup_seconds, 2),
                "reused": self.reused,
                "bench_json": self.bench_json, "summary": self.summary, "weighted_tps_runs": self.rates,
                "load": self.load,
                "runs": self.runs, "ratio_to_first": None if self.ratio is None else
                {"median": round(self.ratio[0], 4), "min": round(self.ratio[1], 4), "max": round(self.ratio[2], 4)}}

    def value(self, key: str) -> float | None:
        if self.status != "ok" or self.summary is None:
            return None
        value = self.summary.get(key)
        return float(value) if isinstance(value, int | float) else None


@dataclass
class SweepResult:
    run_id: str
    target: str
    profile: str
    base_sets: list[str]
    workload: Workload
    points: list[SweepPoint]
    run_dir: Path
    started_at: str
    seconds: float = 0.0
    interleaved: bool = False
    png_path: Path | None = None

    @property
    def best(self) -> int | None:
        rates = [p.value("weighted_tps") for p in self.points]
        known = [(r, i) for i, r in enumerate(rates) if r is not None]
        return max(known)[1] if known else None

    @property
    def plateau(self) -> int | None:
        return plateau_index([p.value("output_tps") for p in self.points])

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "target": self.target, "profile": self.profile, "sets": self.base_sets,
            "started_at": self.started_at, "seconds": round(self.seconds, 1), "workload": self.workload.to_json(),
            "score_weights": {"output_tps": OUTPUT_WEIGHT, "uncached_input_tps": UNCACHED_INPUT_WEIGHT,
                              "cache_tps": CACHED_WEIGHT},
            "plateau_tolerance": PLATEAU_TOLERANCE, "best": self.best, "plateau": self.plateau,
            "repeats": self.workload.repeat, "interleaved": self.interleaved, "cpus": os.cpu_count(),
            "points": [p.to_json() for p in self.points],
        }

    def rows(self) -> tuple[list[str], list[list[str]]]:
        keys = list(self.points[0].params) if self.points else []
        ranges = self.workload.repeat > 1
        ratios = self.interleaved and len(self.points) > 1
        header = [*keys, "Output TPS", "Input TPS", "Cache TPS", "weighted TPS",
                  *(["weighted TPS range"] if ranges else []),
                  *(["weighted / first (median, range)"] if ratios else []),
                  "TTFT p95", "latency p95", "errors", "start", "load", "mark"]
        best, plateau = self.best, self.plateau
        rows: list[list[str]] = []
        for i, p in enumerate(self.points):
            s = p.summary or {}
            marks = [m for m, on in (("best weighted_tps", i == best), ("plateau", i == plateau)) if on]
            if p.status != "ok":
                marks.append(f"{p.status}: {(p.error or '').splitlines()[0][:80]}" if p.error else p.status)
            errors = (f"{s['errors']}/{s['requests']}" + (f", {s['cancelled']} cut" if s.get("cancelled") else "")
                      if s else "-")
            spread = [f"{min(p.rates):,.0f}-{max(p.rates):,.0f}" if p.rates else "-"] if ranges else []
            if ratios:
                spread.append("-" if p.ratio is None else
                              f"{p.ratio[0]:.3f} ({p.ratio[1]:.3f}-{p.ratio[2]:.3f})")
            rows.append([*(str(p.params[k]) for k in keys),
                         fmt(s.get("output_tps"), 1), fmt(s.get("input_tps"), 1), fmt(s.get("cache_tps"), 1),
                         fmt(s.get("weighted_tps"), 0), *spread, ms(s.get("ttft_p95_s")), ms(s.get("latency_p95_s")),
                         errors,
                         "-" if p.startup_seconds is None else f"{p.startup_seconds:.0f} s", fmt(p.load, 1),
                         ", ".join(marks)])
        return header, rows

    def markdown(self) -> str:
        header, rows = self.rows()
        w = self.workload
        lines = [
            f"# Sweep {self.target}:{self.profile}  run {self.run_id}",
            "",
            f"{self.started_at}, {self.seconds:.0f} s; workload: {w.requests} requests at concurrency {w.concurrency}, "
            f"prompt {w.prompt_tokens} tokens ({w.prefix_tokens} shared), output {w.output_tokens} tokens, "
            f"api {w.api}, seed {w.seed}" + (f"; median of {w.repeat} runs per point" if w.repeat > 1 else "; 1 run "
                                             "per point (no spread: single runs here move 1.7-8x)")
            + ("; interleaved (every server up, one run of each point per round, the order rotating)"
               if self.interleaved else "; points one after the other")
            + (f"; --set {' '.join(self.base_sets)}" if self.base_sets else ""),
            "",
            "| " + " | ".join(header) + " |",
            "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows),
            "",
            f"weighted TPS = Output TPS x {OUTPUT_WEIGHT} + uncached Input TPS x {UNCACHED_INPUT_WEIGHT} + Cache "
            f"TPS x {CACHED_WEIGHT} (the replay score's formula on this bench's wall-clock rates); plateau = the "
            "first point whose Output TPS is within "
            f"{PLATEAU_TOLERANCE:.0%} of the best (none when only the last point is); load = the host's 1-minute "
            f"load average when the bench started ({os.cpu_count()} CPUs here)"
            + ("; weighted / first = the median (min-max) over rounds of each round's weighted TPS divided by the "
               "first point's in the same round (an A/A run gives the noise floor: bench/RESULTS.md)."
               if self.interleaved else "."),
        ]
        return "\n".join(lines) + "\n"

    def write(self) -> tuple[Path, Path]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        json_path = self.run_dir / "sweep.json"
        json_path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        md_path = self.run_dir / "sweep.md"
        md_path.write_text(self.markdown())
        return json_path, md_path

    def plot_points(self) -> list[dict[str, Any]]:
        """One record per measured run for :func:`.plots.plot_sweep` (repeats are separate dots)."""
        labels = [" ".join(f"{k}={v}" for k, v in p.params.items()) for p in self.points]
        single = len(self.points[0].params) == 1 if self.points else False
        values: list[Any] = [next(iter(p.params.values())) if single else labels[i]
                             for i, p in enumerate(self.points)]
        if len(set(map(str, values))) < len(values):  # the same value twice (an A/A run): tell them apart
            values = [f"#{i + 1} {labels[i]}" for i in range(len(self.points))]
        out: list[dict[str, Any]] = []
        for value, p in zip(values, self.points, strict=True):
            if p.status != "ok":
                continue
            for run in p.runs or ([p.summary] if p.summary else []):
                out.append({"value": value, "weighted_tps": run.get("weighted_tps"),
                            "output_tps_p10": run.get("output_tps_p10"), "ttft_p90_s": run.get("ttft_p90_s")})
        return out

    def plot(self) -> Path | None:
        points = self.plot_points()
        if not points or not plots_available():
            return None
        param = " x ".join(self.points[0].params) if self.points else "value"
        self.png_path = plot_sweep(points, self.run_dir / "sweep.png", param=param,
                                   title=f"sweep {self.target}:{self.profile} ({self.workload.repeat} run(s) per "
                                         f"point{', interleaved' if self.interleaved else ''})")
        return self.png_path


def print_sweep(result: SweepResult, console: Any = None) -> None:
    from rich.table import Table

    header, rows = result.rows()
    table = Table(title=f"sweep {result.target}:{result.profile}")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i >= len(header) - 1 else "right")
    best = result.best
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold green" if i == best else None)
    (console or make_console()).print(table)


def sweep_image(resolved: Any) -> Any:
    """``resolved`` with the image name ``<image>-sweep``: sweep points never take the target's own tags.

    Cache keys do not depend on the image name, so every layer below the serving config is shared.
    """
    target = dataclasses.replace(resolved.target, image=f"{resolved.target.image}-sweep")
    return dataclasses.replace(resolved, target=target)


def _first_line(exc: ImageforgeError) -> str:
    text = exc.message
    if exc.found:
        text += f" ({exc.found})"
    if exc.hint:
        text += f"; hint: {exc.hint}"
    return text


@contextlib.contextmanager
def _quiet_log(path: Path) -> Iterator[Log]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        def log(line: str) -> None:
            fh.write(line + "\n")
            fh.flush()

        yield log


def rotations(points: int, rounds: int) -> list[list[int]]:
    """The interleaved order: round r runs every point once, starting at point ``r % points`` (AB, BA, AB ...;
    ABC, BCA, CAB ...), so no point is always first after an idle server or always last."""
    return [[(r + i) % points for i in range(points)] for r in range(rounds)] if points else []


def paired_ratios(scores: Sequence[Sequence[float | None]]) -> list[tuple[float, float, float] | None]:
    """``scores[point][round]`` -> per point (median, min, max) of weighted_tps / the first point's in the same
    round (None where no round has both; the first point's is 1.0 by definition)."""
    out: list[tuple[float, float, float] | None] = []
    first = scores[0] if scores else []
    for row in scores:
        ratios = [v / f for v, f in zip(row, first, strict=False) if v is not None and f]
        out.append((statistics.median(ratios), min(ratios), max(ratios)) if ratios else None)
    return out


def _record(point: SweepPoint, bench: Any) -> None:
    """A point's (median) bench into the point: summary, every run, weighted rates, load, verdict."""
    point.summary, point.startup_seconds = bench.summary(), point.startup_seconds or bench.startup_seconds
    point.rates = [float(r["weighted_tps"]) for r in bench.repeats]
    before = bench.host.get("loadavg_before")
    point.load = float(before[0]) if before else None
    point.bench_json = str(bench.json_path) if bench.json_path else None
    try:
        verdict(bench)
        point.status = "ok"
    except SmokeError as exc:
        point.status, point.error = "failed", exc.message


def sweep(manifest: Any, target: str | None, profile: str | None, params: Sequence[tuple[str, Sequence[Any]]],
          workload: Workload, runtime: Runtime, *, sets: Sequence[str] = (),
          environ: Mapping[str, str] | None = None, echo: Log = print, startup_timeout: float | None = None,
          interleave: bool = True, host_address: str | None = None) -> SweepResult:
    """One build + server + bench per combination of ``params``; a point that fails is recorded, not fatal.

    ``interleave`` (with ``workload.repeat`` > 1 and more than one point): every point is built first, every
    point's server is started once and stays up, and the rounds run one bench of each point in rotating order
    (:func:`rotations`); each point reports the median of its runs, their spread, and the median paired ratio
    of its score to the first point's in the same round.  Otherwise the points run one after the other (each
    server started, benched ``repeat`` times, removed). Servers are published on and reached at
    ``host_address`` (default: from ``environ``).  A ``runtime`` that serves one server at a time (in place): one
    point after the other; points whose steps are the same (they differ in serving flags only) reuse the applied
    files; the root is as before at the end.
    """
    workload.validate()
    environ = os.environ if environ is None else environ
    points = combinations(params)
    # every combination must resolve before anything starts (unknown keys, wrong types: exit 2 now)
    resolved_points = [sweep_image(resolve(manifest, target, profile, environ=environ, sets=[*sets, *set_args(p)]))
                       for p in points]
    first = resolved_points[0]
    run_id = new_run_id()
    run_dir = first.manifest.root / ".imageforge" / "runs" / run_id
    interleaved = interleave and workload.repeat > 1 and len(points) > 1 and not runtime.one_at_a_time
    result = SweepResult(run_id=run_id, target=first.target.name, profile=first.profile_name, base_sets=list(sets),
                         workload=workload, points=[SweepPoint(dict(p)) for p in points], run_dir=run_dir,
                         started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                         interleaved=interleaved)
    seqs = [v for p in points for k, v in p.items() if k.removeprefix("serving.") == "max-num-seqs"
            and isinstance(v, int)]
    if seqs and max(seqs) > workload.concurrency:
        echo(f"note: concurrency {workload.concurrency} < the largest max-num-seqs {max(seqs)}: the client cannot "
             "fill the bigger batches (raise --concurrency)")
    echo(f"sweep {result.target}:{result.profile}: {len(points)} points over "
         f"{', '.join(k for k, _ in params)}  run {run_id}  (images tagged in {first.target.image}); "
         + (f"{workload.repeat} interleaved rounds, every point's server up at once" if interleaved
            else f"{workload.repeat} run(s) per point, one point after the other"))
    t0 = time.monotonic()
    if runtime.one_at_a_time:
        applies = len({tuple(s.id for s in r.steps) for r in resolved_points})
        echo(f"{runtime.where}: {len(points)} server start(s), one at a time; the steps applied "
             f"{applies} time(s) (points differing only in serving flags reuse the applied files)")
    with runtime.restoring(first.manifest, environ=environ, log=echo):
        if interleaved:
            _sweep_interleaved(result, resolved_points, workload, runtime, environ=environ, echo=echo,
                               startup_timeout=startup_timeout, host_address=host_address)
        else:
            _sweep_sequential(result, resolved_points, workload, runtime, environ=environ, echo=echo,
                              startup_timeout=startup_timeout, host_address=host_address)
    result.seconds = time.monotonic() - t0
    result.write()
    return result


def _prepare_point(i: int, point: SweepPoint, resolved: Any, result: SweepResult, runtime: Runtime,
                   environ: Mapping[str, str], echo: Log) -> Prepared | None:
    """The point's image built, or its steps applied in place (the same steps as the point before: reused)."""
    label = " ".join(f"{k}={v}" for k, v in point.params.items())
    echo(f"[{i}/{len(result.points)}] {label}")
    with _quiet_log(result.run_dir / f"point-{i}.log") as log:
        try:
            prepared = runtime.prepare(resolved, environ=environ, log=log, pin=True)
        except ImageforgeError as exc:
            point.status, point.error = "build-error", _first_line(exc)
            echo(f"  build failed: {point.error}")
            result.write()
            return None
    point.build, point.image_id = prepared.note, prepared.image_id
    echo(f"  {prepared.line}")
    return prepared


def _echo_point(point: SweepPoint, echo: Log) -> None:
    s = point.summary or {}
    spread = (f", weighted_tps range {min(point.rates):,.0f}-{max(point.rates):,.0f} over {len(point.rates)} runs"
              if len(point.rates) > 1 else "")
    echo(f"  Output {s.get('output_tps', 0):.1f} / Input {s.get('input_tps', 0):.1f} / Cache "
         f"{s.get('cache_tps', 0):.1f} TPS, weighted_tps {s.get('weighted_tps', 0):.0f}{spread}, errors "
         f"{s.get('errors')}/{s.get('requests')}" + (f"  ({point.status}: {point.error})" if point.error else ""))


def _sweep_sequential(result: SweepResult, resolved_points: Sequence[Any], workload: Workload, runtime: Runtime, *,
                      environ: Mapping[str, str], echo: Log, startup_timeout: float | None,
                      host_address: str | None = None) -> None:
    for i, (point, resolved) in enumerate(zip(result.points, resolved_points, strict=True), 1):
        prepared = _prepare_point(i, point, resolved, result, runtime, environ, echo)
        if prepared is None:
            continue
        with _quiet_log(result.run_dir / f"point-{i}.log") as log:
            try:
                bench = bench_target(resolved, workload, runtime, environ=environ, echo=log, prepared=prepared,
                                     startup_timeout=startup_timeout, params=point.params,
                                     host_address=host_address)
            except ImageforgeError as exc:
                point.status, point.error = "no-start", _first_line(exc)
                echo(f"  server failed: {point.error}")
                result.write()
                continue
        _record(point, bench)
        point.runs = list(bench.repeats) or [bench.summary() | {"seed": bench.workload.seed}]
        echo("  a running server reused (--reuse-servers)" if bench.startup_seconds is None
             else f"  ready after {bench.startup_seconds:.0f}s")
        _echo_point(point, echo)
        result.write()


def _sweep_interleaved(result: SweepResult, resolved_points: Sequence[Any], workload: Workload, runtime: Runtime, *,
                       environ: Mapping[str, str], echo: Log, startup_timeout: float | None,
                       host_address: str | None = None) -> None:
    prepared = {i: ready for i, (point, resolved) in enumerate(zip(result.points, resolved_points, strict=True))
                if (ready := _prepare_point(i + 1, point, resolved, result, runtime, environ, echo)) is not None}
    built = list(prepared)
    servers: dict[int, Any] = {}
    runs: dict[int, list[Any]] = {i: [] for i in built}
    with contextlib.ExitStack() as stack:
        for i in built:
            point = result.points[i]
            log = stack.enter_context(_quiet_log(result.run_dir / f"point-{i + 1}.log"))
            try:
                servers[i] = stack.enter_context(runtime.serving(resolved_points[i], prepared[i], environ=environ,
                                                                 run_id=new_run_id(), startup_timeout=startup_timeout,
                                                                 log=log, host_address=host_address))
            except ImageforgeError as exc:
                point.status, point.error = "no-start", _first_line(exc)
                echo(f"  [{i + 1}] server failed: {point.error}")
                continue
            point.startup_seconds, point.reused = servers[i].startup_seconds, servers[i].reused
            echo(f"  [{i + 1}] " + (f"server {servers[i].name} reused" if point.reused else
                                    f"server up after {point.startup_seconds or 0:.0f}s") + f" on {servers[i].url}")
        up = [i for i in built if i in servers]
        for r, order in enumerate(rotations(len(up), workload.repeat)):
            echo(f"round {r + 1}/{workload.repeat}: " + " ".join(f"[{up[k] + 1}]" for k in order))
            for k in order:
                i = up[k]
                one = dataclasses.replace(workload, seed=workload.seed + r, repeat=1,
                                          warmup=workload.warmup if r == 0 else 0)
                try:
                    bench = run_bench(servers[i].url, one, echo=lambda _line: None, write=False)
                except ImageforgeError as exc:
                    echo(f"  [{i + 1}] bench failed: {_first_line(exc)}")
                    continue
                runs[i].append(bench)
                s = bench.summary()
                load = bench.host.get("loadavg_before")
                result.points[i].runs.append(s | {"round": r, "seed": one.seed,
                                                  "load": float(load[0]) if load else None})
                echo(f"  [{i + 1}] weighted_tps {s['weighted_tps']:.0f}, Output {s['output_tps']:.1f} TPS, TTFT p50 "
                     f"{ms(s['ttft_p50_s'])}, errors {s['errors']}/{s['requests']}, "
                     f"load {fmt(load[0] if load else None, 2)}")
            result.write()
    by_round: list[list[float | None]] = []
    for i in range(len(result.points)):
        scores: list[float | None] = [None] * workload.repeat
        for run in result.points[i].runs:
            scores[int(run["round"])] = float(run["weighted_tps"])
        by_round.append(scores)
    measured = [i for i in range(len(result.points)) if runs.get(i)]
    ratios = paired_ratios([by_round[i] for i in measured])
    for i, ratio in zip(measured, ratios, strict=True):
        point = result.points[i]
        bench = median_run(runs[i])
        bench.params = dict(point.params)
        bench.run_dir = result.run_dir / f"point-{i + 1}"
        bench.notes.append(f"interleaved sweep: round r used seed {workload.seed}+r on this point's one server")
        write_bench(bench)
        _record(point, bench)
        point.ratio = ratio
        echo(f"[{i + 1}] " + " ".join(f"{k}={v}" for k, v in point.params.items()))
        _echo_point(point, echo)


def sweep_workload(params: Sequence[tuple[str, Sequence[Any]]], workload: Workload, *,
                   requests_given: bool, concurrency_given: bool) -> Workload:
    """Defaults that make a max-num-seqs sweep meaningful: concurrency = the largest max-num-seqs swept
    (the client can fill every batch), requests = 4 x concurrency (a few batches each)."""
    seqs = [v for k, values in params if k.removeprefix("serving.") == "max-num-seqs" for v in values
            if isinstance(v, int) and not isinstance(v, bool)]
    concurrency = workload.concurrency if concurrency_given or not seqs else max(max(seqs), 1)
    requests = workload.requests if requests_given else max(workload.requests, 4 * concurrency)
    return dataclasses.replace(workload, concurrency=concurrency, requests=requests)


def report_sweep(result: SweepResult, echo: Log = print) -> SweepResult:
    """The table, sweep.json and sweep.md, the best point and the plateau; exit 4 when no point produced a result."""
    print_sweep(result)
    json_path, md_path = result.write()
    png = result.plot()
    best, plateau = result.best, result.plateau
    if best is not None:
        echo(f"best weighted_tps: {' '.join(f'{k}={v}' for k, v in result.points[best].params.items())} "
             f"({result.points[best].value('weighted_tps'):.0f})")
    if plateau is not None:
        echo(f"Output TPS plateau (within {PLATEAU_TOLERANCE:.0%} of the max) from: "
             f"{' '.join(f'{k}={v}' for k, v in result.points[plateau].params.items())}")
    elif sum(1 for p in result.points if p.value("output_tps") is not None) > 1:
        echo(f"no Output TPS plateau within the swept values: the last point is more than {PLATEAU_TOLERANCE:.0%} "
             "above every earlier one (sweep further)")
    echo(f"report: {json_path}  {md_path}  ({result.seconds:.0f}s)")
    if png is not None or not plots_available():
        echo(f"plot: {png if png is not None else NO_PLOTS}")
    if best is None:
        raise SmokeError(f"no point of the sweep produced a result ({len(result.points)} tried)",
                         found="; ".join(f"{p.status}: {p.error}" for p in result.points)[:600],
                         hint=f"each point's build and server log: {result.run_dir}/point-N.log")
    return result
