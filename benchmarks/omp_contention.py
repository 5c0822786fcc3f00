"""Two cpu servers on one 2-core machine: how much one slows the other, by OpenMP's wait policy (bench/RESULTS.md).

Usage: .venv/bin/python benchmarks/omp_contention.py [--manifest FILE] [--profile P] [--repeat N] [--arms a,b,..]

The suite runs two vLLM servers at once most of the time (one per xdist worker: a container here, a process in the
box there), and a check that takes 10 s alone took 50-65 s in the fresh-clone runs. torch's OpenMP threads
(libgomp: as many as cores) spin at each parallel region's barrier before they sleep, and two servers' threads on
the same 2 cores wait on each other's spins. This measures it: per arm, servers A and B of the target's built image
are started with the arm's environment added to the container (``run.env``), then

* ``alone``: the target's dummy-ok smoke suite and a small bench against A while B is idle;
* ``contended``: the same while a bench loop keeps B busy (its benches, errors and Output TPS are recorded: a loop
  that failed would leave A alone).

Arms (interleaved in each round, A/A included): ``default`` (the image's environment), ``passive``
(``OMP_WAIT_POLICY=PASSIVE``: threads sleep at once), ``default2`` (the same as default: the A/A spread),
``spin10k`` / ``spin1k`` (``GOMP_SPINCOUNT``: spin that many times, then sleep; libgomp's default is 300000),
``threads1`` (``OMP_NUM_THREADS=1``: no barrier to wait at).
Prints one JSON object: per arm and round, the suite's seconds and the bench's Output TPS, alone and contended, and
the load averages before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from imageforge.bench import Workload, run_bench
from imageforge.manifest.load import load_manifest
from imageforge.manifest.model import frozen_map
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve.container import ContainerRuntime
from imageforge.smoke import load_suite, run_suite, target_vars

REPO = Path(__file__).resolve().parents[1]
ARMS: dict[str, dict[str, str]] = {
    "default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "default2": {},
    "spin10k": {"GOMP_SPINCOUNT": "10000"}, "spin1k": {"GOMP_SPINCOUNT": "1000"}, "threads1": {"OMP_NUM_THREADS": "1"},
}
MEASURED = Workload(requests=16, concurrency=4, prompt_tokens=128, output_tokens=64, seed=7, duration=300, warmup=0)
LOAD = Workload(requests=16, concurrency=8, prompt_tokens=256, output_tokens=32, seed=11, duration=300, warmup=0)


def with_env(resolved: Resolved, extra: dict[str, str]) -> Resolved:
    run = dataclasses.replace(resolved.run, env=frozen_map({**resolved.run.env, **extra}))
    return dataclasses.replace(resolved, run=run)


def measure(resolved: Resolved, url: str, workdir: Path, workload: Workload = MEASURED) -> dict[str, float]:
    suite = load_suite(REPO / "smoke" / "dummy.yaml")
    t0 = time.monotonic()
    report = run_suite(suite, url, tags=("dummy-ok",), run_dir=workdir, vars=target_vars(resolved),
                       echo=lambda _l: None, live=False)
    suite_s = time.monotonic() - t0
    assert report.ok, report.summary_line()
    bench = run_bench(url, workload, echo=lambda _l: None, write=False).summary()
    return {"suite_s": round(suite_s, 2), "bench_wall_s": float(bench["wall_s"]),
            "output_tps": float(bench["output_tps"])}


@dataclasses.dataclass
class Load:
    """What the bench loop against B did while A was measured."""

    benches: int = 0
    errors: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        tps = self.completion_tokens / self.seconds if self.seconds else 0.0
        return {"benches": self.benches, "errors": self.errors, "output_tps": round(tps, 1)}


@contextlib.contextmanager
def busy(url: str) -> Any:
    """A bench loop against ``url`` until the block ends; yields its :class:`Load` (filled when the block ends)."""
    stop = threading.Event()
    load = Load()

    def loop() -> None:
        while not stop.is_set():
            try:
                summary = run_bench(url, LOAD, echo=lambda _l: None, write=False).summary()
            except Exception:  # counted: a loop that died would leave A alone and the figure a lie
                load.errors += 1
                continue
            load.benches += 1
            load.completion_tokens += int(summary["completion_tokens"])

    thread = threading.Thread(target=loop, daemon=True)
    t0 = time.monotonic()
    thread.start()
    time.sleep(3)  # the load is running
    try:
        yield load
    finally:
        stop.set()
        thread.join(timeout=120)
        load.seconds = time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(REPO / "build.yaml"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--prompt-tokens", type=int, default=MEASURED.prompt_tokens,
                        help="of the measured bench (a prefill-heavy run: 1024)")
    args = parser.parse_args()
    measured = dataclasses.replace(MEASURED, prompt_tokens=args.prompt_tokens)
    resolved = resolve(load_manifest(Path(args.manifest)), args.target, args.profile, environ=os.environ)
    arms = [a for a in args.arms.split(",") if a]
    out: dict[str, Any] = {"load_before": list(os.getloadavg()), "arms": {a: ARMS[a] for a in arms},
                           "measured": measured.to_json(), "runs": []}
    runtime = ContainerRuntime()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for arm in arms:
                subject = with_env(resolved, ARMS[arm])
                prepared = runtime.prepare(subject, environ=os.environ, log=lambda _l: None)
                with (runtime.serving(subject, prepared, environ=os.environ, log=lambda _l: None) as a,
                      runtime.serving(subject, prepared, environ=os.environ, log=lambda _l: None) as b):
                    alone = measure(subject, a.url, Path(tmp) / f"{r}-{arm}-alone", measured)
                    with busy(b.url) as load:
                        contended = measure(subject, a.url, Path(tmp) / f"{r}-{arm}-contended", measured)
                row = {"round": r, "arm": arm, "alone": alone, "contended": contended, "b_load": load.to_json(),
                       "load": os.getloadavg()[0]}
                print(json.dumps(row), flush=True)
                out["runs"].append(row)
    out["load_after"] = list(os.getloadavg())
    summary: dict[str, Any] = {}
    for arm in arms:
        rows = [x for x in out["runs"] if x["arm"] == arm]
        summary[arm] = {f"{kind}_{key}": statistics.median(x[kind][key] for x in rows)
                        for kind in ("alone", "contended") for key in ("suite_s", "output_tps")}
    out["median"] = summary
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
