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

import dataclasses
import json
import os
import statistics
from typing import Any

from start_arms import interleaved, start_once, target_from_args

from imageforge.manifest.resolve import Resolved

KEY = "VLLM_WORKER_MULTIPROC_METHOD"


def with_method(resolved: Resolved, method: str) -> Resolved:
    env = tuple(dataclasses.replace(v, value=method) if v.key == KEY else v for v in resolved.env)
    return dataclasses.replace(resolved, env=env)


def main() -> None:
    args, resolved = target_from_args(__doc__, repeat=3)
    if not any(v.key == KEY for v in resolved.env):
        raise SystemExit(f"target {args.target} does not set {KEY} in serving.env: nothing to compare")
    arms = {"A": resolved, "B": with_method(resolved, "spawn"), "A2": resolved}
    out: dict[str, Any] = {"manifest_method": next(v.value for v in resolved.env if v.key == KEY),
                           "load_before": list(os.getloadavg())}
    start_once(resolved)  # built and the cache volume warm before the first timed start
    runs = interleaved(arms, args.repeat)
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
