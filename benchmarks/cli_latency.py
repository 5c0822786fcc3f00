"""Wall time of whole `invoke` processes (cold Python start included): validate, plan, no-op build.

Usage: .venv/bin/python benchmarks/cli_latency.py [--runs N]   (needs the cpu target built once for the build row)
Prints a markdown table: min / median / max seconds over N runs, and the goal.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke"]

CASES = [
    ("invoke validate", ["validate"], 0.5),
    ("invoke plan --target bi100 --profile aggressive --json --no-daemon",
     ["plan", "--target", "bi100", "--profile", "aggressive", "--json", "--no-daemon"], 0.5),
    ("invoke plan --target cpu (asks the daemon)", ["plan", "--target", "cpu"], None),
    ("invoke build --target cpu (no-op, all HIT)", ["build", "--target", "cpu"], 0.5),
]


def measure(args: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([*INVOKE, *args], cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stderr}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    print("| command | min s | median s | max s | goal |")
    print("| --- | --- | --- | --- | --- |")
    for label, args, goal in CASES:
        t = measure(args, runs)
        goal_text = f"<= {goal} s" if goal else "-"
        print(f"| `{label}` | {min(t):.2f} | {statistics.median(t):.2f} | {max(t):.2f} | {goal_text} |")


if __name__ == "__main__":
    main()
