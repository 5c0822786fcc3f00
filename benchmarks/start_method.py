"""Seconds to /health and CPU seconds of a start of the cpu target's server: its engine process forked or spawned.

Usage: .venv/bin/python benchmarks/start_method.py [--manifest FILE] [--profile P] [--repeat N]

vLLM's CPU platform spawns its engine process (a second interpreter that imports vLLM again); the cpu target's
step ``cpu-engine-start-method`` lets ``serving.env`` choose, and the manifest chooses ``fork``. Three arms,
interleaved in each round (A, B, A2, then again), each a real start through
``imageforge.serve.container.serving`` (as ``start_cache.py`` starts them, the cache volume mounted):

* ``A``  the target as the manifest says (``VLLM_WORKER_MULTIPROC_METHOD=fork``);
* ``B``  the same target with ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (vLLM's own choice on CPU; the image differs
  in its serving-config layer only);
* ``A2`` ``A`` again: the A/A spread of this machine.

Prints one JSON object: per start the seconds to /health and the container's CPU seconds at that moment (its
cgroup's ``cpuacct.usage``, cgroup v1), per arm the medians, min and max, and the load averages before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve.container import ContainerRuntime

REPO = Path(__file__).resolve().parents[1]
KEY = "VLLM_WORKER_MULTIPROC_METHOD"


def with_method(resolved: Resolved, method: str) -> Resolved:
    env = tuple(dataclasses.replace(v, value=method) if v.key == KEY else v for v in resolved.env)
    return dataclasses.replace(resolved, env=env)


def cpu_seconds(container_id: str) -> float | None:
    """The container's CPU time so far (cgroup v1 cpuacct, Docker's cgroupfs layout), or None where not found."""
    for parent in ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct/docker"):
        path = Path(parent) / container_id / "cpuacct.usage"
        if path.is_file():
            return int(path.read_text()) / 1e9
    return None


def start_once(resolved: Resolved) -> tuple[float, float | None]:
    runtime = ContainerRuntime()
    prepared = runtime.prepare(resolved, environ=os.environ, log=lambda _line: None)  # built, or reused
    with runtime.serving(resolved, prepared, environ=os.environ, log=lambda _line: None) as server:
        seconds, cpu = server.startup_seconds, cpu_seconds(server.container.id)
    assert seconds is not None
    return round(float(seconds), 2), None if cpu is None else round(cpu, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(REPO / "build.yaml"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    resolved = resolve(load_manifest(Path(args.manifest)), args.target, args.profile, environ=os.environ)
    if not any(v.key == KEY for v in resolved.env):
        raise SystemExit(f"target {args.target} does not set {KEY} in serving.env: nothing to compare")
    arms = {"A": resolved, "B": with_method(resolved, "spawn"), "A2": resolved}
    out: dict[str, Any] = {"manifest_method": next(v.value for v in resolved.env if v.key == KEY),
                           "load_before": list(os.getloadavg())}
    start_once(resolved)  # built and the cache volume warm before the first timed start
    runs: dict[str, list[tuple[float, float | None]]] = {name: [] for name in arms}
    for _ in range(args.repeat):
        for name, arm in arms.items():
            runs[name].append(start_once(arm))
    out["starts"] = {name: [{"seconds": s, "cpu_seconds": c} for s, c in r] for name, r in runs.items()}
    out["summary"] = {}
    for name, r in runs.items():
        secs, cpus = [s for s, _ in r], [c for _, c in r if c is not None]
        out["summary"][name] = {"median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
                                "median_cpu_s": statistics.median(cpus) if cpus else None}
    out["load_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
