"""Seconds to /health of the cpu target's server with and without vLLM's cache volume (bench/RESULTS.md).

Usage: .venv/bin/python benchmarks/start_cache.py [--manifest FILE] [--profile P] [--repeat N]

Three arms, interleaved in each round (A, B, A2, then again), each a real start of the target's built image
through ``imageforge.serve.container.serving`` (the path `run`, `smoke --target`, equiv, bisect, ablate and sweep
take):

* ``A``  the target as the manifest says, with its named volume ``imageforge-vllm-cache`` (warm after the first
  round's start: the first start of the session fills it, and its time is printed apart);
* ``B``  the same target with its named volumes left out (vLLM inspects the model class in a subprocess at each
  start, as before the volume);
* ``A2`` the same as ``A``, a second arm of the same thing: the A/A spread of this machine.

Prints one JSON object: the seconds of each start (``startup_seconds``: container start to /health OK), per arm
the median, min and max, and the load averages (1/5/15 min) before and after.
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


def without_named_volumes(resolved: Resolved) -> Resolved:
    run = dataclasses.replace(resolved.run, volumes=tuple(v for v in resolved.run.volumes if not v.named))
    return dataclasses.replace(resolved, run=run)


def start_once(resolved: Resolved) -> float:
    runtime = ContainerRuntime()
    prepared = runtime.prepare(resolved, environ=os.environ, log=lambda _line: None)  # built, or reused
    with runtime.serving(resolved, prepared, environ=os.environ, log=lambda _line: None) as server:
        seconds = server.startup_seconds
    assert seconds is not None
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(REPO / "build.yaml"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    resolved = resolve(load_manifest(Path(args.manifest)), args.target, args.profile, environ=os.environ)
    named = [v.source for v in resolved.run.volumes if v.named]
    if not named:
        raise SystemExit(f"target {args.target} mounts no named volume: nothing to compare")
    arms = {"A": resolved, "B": without_named_volumes(resolved), "A2": resolved}
    out: dict[str, Any] = {"volumes": named, "load_before": list(os.getloadavg())}
    out["first_start_with_the_volume"] = start_once(resolved)  # fills it if it was empty
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeat):
        for name, arm in arms.items():
            times[name].append(round(start_once(arm), 2))
    out["seconds"] = times
    out["summary"] = {name: {"median": statistics.median(t), "min": min(t), "max": max(t)}
                      for name, t in times.items()}
    out["load_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
