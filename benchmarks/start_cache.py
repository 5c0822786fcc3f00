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

import dataclasses
import json
import os
import statistics
from typing import Any

from start_arms import interleaved, start_once, target_from_args

from imageforge.manifest.resolve import Resolved


def without_named_volumes(resolved: Resolved) -> Resolved:
    run = dataclasses.replace(resolved.run, volumes=tuple(v for v in resolved.run.volumes if not v.named))
    return dataclasses.replace(resolved, run=run)


def main() -> None:
    args, resolved = target_from_args(__doc__, repeat=4)
    named = [v.source for v in resolved.run.volumes if v.named]
    if not named:
        raise SystemExit(f"target {args.target} mounts no named volume: nothing to compare")
    arms = {"A": resolved, "B": without_named_volumes(resolved), "A2": resolved}
    out: dict[str, Any] = {"volumes": named, "load_before": list(os.getloadavg())}
    out["first_start_with_the_volume"] = start_once(resolved)[0]  # fills it if it was empty
    times = {name: [seconds for seconds, _cpu in r] for name, r in interleaved(arms, args.repeat).items()}
    out["seconds"] = times
    out["summary"] = {name: {"median": statistics.median(t), "min": min(t), "max": max(t)}
                      for name, t in times.items()}
    out["load_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
