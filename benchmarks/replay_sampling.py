"""Does a sampled replay's interval hold the full replay's weighted_tps? (bench/RESULTS.md, "Replay and A/A")

Usage: .venv/bin/python benchmarks/replay_sampling.py --url http://127.0.0.1:PORT [--requests 120] [--seed 7]
       [--sample 30] [--seeds 10] [--every 2] [--passes 3] [--out FILE]

One running server. The workload is imageforge's generated replay (``--requests`` from ``--seed``). Runs are
interleaved: the full replay, then the sampled replays of seeds 0..``--seeds``-1 (``--sample`` requests of whole
sessions each: :func:`imageforge.bench.sampling.choose`, each run ``--passes`` times as ``bench --passes`` runs it),
with a full replay again after every ``--every`` of them (default 2) and at the end, so slow drift of the shared
machine reaches both sides. Every run starts from a cold prefix cache of its own: its requests' first system message
starts with the run's own tag (a few tokens), so no run reads another's cache while the sharing inside a run
(sessions, shared heads) stays as it is. The A/A is the full replays against each other. Per seed: the predicted
interval and whether it holds the full replays' mean weighted_tps. Prints one JSON object (and writes it to
``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from replay_common import add_server_options, emit, server_workload

from imageforge.bench.evaluator import evaluate
from imageforge.bench.replay import run_replay
from imageforge.bench.replay_workload import ReplayRequest
from imageforge.bench.sampling import Pass, choose, cold_cache, predict, sessions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_options(parser, requests=120, seed=7)
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--every", type=int, default=2, help="a full replay after every N samples")
    parser.add_argument("--passes", type=int, default=3, help="each sample runs R times (bench --passes R)")
    args = parser.parse_args(argv)
    model, requests, workload = server_workload(args.url, args.requests, args.seed)
    population = sessions(requests)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs = 0

    def replay(chosen_requests: Sequence[ReplayRequest]) -> Any:
        nonlocal runs
        runs += 1
        return run_replay(cold_cache(chosen_requests, f"run {runs} {started}"), args.url, time_cap=86400.0)

    full: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []

    def full_run() -> None:
        run = replay(requests)
        m = evaluate(run.records, run.wall_s).metrics
        full.append({"weighted_tps": m["weighted_tps"], "wall_s": run.wall_s, "failed": m["error_requests"],
                     "load": round(os.getloadavg()[0], 2)})
        print(json.dumps({"full": full[-1]}), file=sys.stderr)

    full_run()
    for seed in range(args.seeds):
        chosen = choose(population, args.sample, seed)
        passes = [replay([requests[i] for s in chosen for i in s.requests]) for _ in range(args.passes)]
        p = predict(chosen, population, [Pass(one.records, one.wall_s) for one in passes])
        first = predict(chosen, population, [Pass(passes[0].records, passes[0].wall_s)])  # the same run, one pass
        samples.append({"seed": seed, "requests": p["requests_sampled"], "sessions": p["sessions_sampled"],
                        "weighted_tps": p["weighted_tps"], "wall_time_s": p["wall_time_s"],
                        "head_corrections": p["head_corrections"], "interval_groups": p["interval_groups"],
                        "passes_weighted_tps": p["passes_weighted_tps"], "first_pass": first["weighted_tps"],
                        "load": round(os.getloadavg()[0], 2)})
        print(json.dumps({"sample": samples[-1]}), file=sys.stderr)
        if (seed + 1) % args.every == 0 or seed + 1 == args.seeds:
            full_run()
    truth = statistics.fmean(f["weighted_tps"] for f in full)
    for s in samples:
        s["holds"] = s["weighted_tps"]["low"] <= truth <= s["weighted_tps"]["high"]
        s["half_width"] = round((s["weighted_tps"]["high"] - s["weighted_tps"]["low"]) / 2 / truth, 4)
        s["first_pass_holds"] = s["first_pass"]["low"] <= truth <= s["first_pass"]["high"]
    result = {"started": started, "url": args.url, "model": model, "workload": workload["stats"],
              "sessions": len(population), "sample": args.sample, "passes": args.passes, "cpus": os.cpu_count(),
              "full": full, "full_mean_weighted_tps": truth,
              "full_spread": [min(f["weighted_tps"] for f in full) / truth,
                              max(f["weighted_tps"] for f in full) / truth],
              "held": sum(1 for s in samples if s["holds"]), "seeds": args.seeds,
              "held_by_the_first_pass_alone": sum(1 for s in samples if s["first_pass_holds"]),
              "half_width_median": statistics.median(s["half_width"] for s in samples), "samples": samples}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
