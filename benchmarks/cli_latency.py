"""Wall time of whole `invoke` processes (cold Python start included): validate, plan, no-op build.

Usage: .venv/bin/python benchmarks/cli_latency.py [--runs N] [--json FILE]
(needs the cpu target built once for the build row). The cases run interleaved, one process of each per
round, next to the import floor (``python -c "import yaml, jsonschema, invoke"``, the libraries validate
cannot do without) and an A/A copy of the floor, so that the machine's noise is visible in the same run.
Prints a markdown table: min / median / max seconds over N runs, the goal, and issue 25's ratios
(validate / floor <= 1.5, no-op build / validate <= 1.5) from the medians; the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke"]
FLOOR = [sys.executable, "-c", "import yaml, jsonschema, invoke"]

#: (label, command, goal seconds)
CASES: list[tuple[str, list[str], float | None]] = [
    ('import floor: python -c "import yaml, jsonschema, invoke"', FLOOR, None),
    ("import floor again (A/A)", FLOOR, None),
    ("invoke validate", [*INVOKE, "validate"], 0.5),
    ("invoke plan --target bi100 --profile aggressive --json --no-daemon",
     [*INVOKE, "plan", "--target", "bi100", "--profile", "aggressive", "--json", "--no-daemon"], 0.5),
    ("invoke plan --target cpu (asks the daemon)", [*INVOKE, "plan", "--target", "cpu"], None),
    ("invoke build --target cpu (no-op, all HIT)", [*INVOKE, "build", "--target", "cpu"], 0.5),
]


def once(command: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}):\n{proc.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", default="", help="also write the raw times here")
    args = parser.parse_args()
    for _, command, _ in CASES:
        once(command)  # warm: bytecode written, page cache filled
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {label: [] for label, _, _ in CASES}
    for _ in range(args.runs):
        for label, command, _ in CASES:
            times[label].append(once(command))
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {args.runs} rounds, interleaved")
    print()
    print("| command | min s | median s | max s | goal |")
    print("| --- | --- | --- | --- | --- |")
    for label, _, goal in CASES:
        t = times[label]
        goal_text = f"<= {goal} s" if goal else "-"
        print(f"| `{label}` | {min(t):.2f} | {statistics.median(t):.2f} | {max(t):.2f} | {goal_text} |")
    med = {label: statistics.median(t) for label, t in times.items()}
    floor, again = med[CASES[0][0]], med[CASES[1][0]]
    validate, noop = med["invoke validate"], med[CASES[-1][0]]
    print()
    print(f"- A/A: floor {floor:.3f} s vs {again:.3f} s ({again / floor:.2f}x)")
    print(f"- validate / import floor: {validate / floor:.2f}x (goal <= 1.5x)")
    print(f"- no-op build / validate: {noop / validate:.2f}x (goal <= 1.5x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": [load_before, load_after], "times": times}, indent=1))


if __name__ == "__main__":
    main()
