"""Wall time of whole `invoke` processes (cold Python start included): validate, plan, no-op build.

Usage: .venv/bin/python benchmarks/cli_latency.py [--runs N] [--json FILE] [--against OTHER_CHECKOUT]
(needs the cpu target built once for the build row). The cases run interleaved, one process of each per
round, next to the import floor (``python -c "import yaml, jsonschema, invoke"``, the libraries validate
cannot do without) and an A/A copy of the floor, so that the machine's noise is visible in the same run.
Prints a markdown table: min / median / max seconds over N runs, the goal, and the goals' ratios
(validate / floor <= 1.5, no-op build / validate <= 1.5) from the medians; the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke"]
FLOOR = [sys.executable, "-c", "import yaml, jsonschema, invoke"]
CPU: list[float] = []  # the last process's user + system CPU seconds (the daemon's work is not in it)

#: (label, command, goal seconds)
CASES: list[tuple[str, list[str], float | None]] = [
    ('import floor: python -c "import yaml, jsonschema, invoke"', FLOOR, None),
    ("import floor again (A/A)", FLOOR, None),
    ("invoke validate", [*INVOKE, "validate"], 0.5),
    ("invoke plan --target bi100 --profile replay-big-chunks --json --no-daemon",
     [*INVOKE, "plan", "--target", "bi100", "--profile", "replay-big-chunks", "--json", "--no-daemon"], 0.5),
    ("invoke plan --target cpu (asks the daemon)", [*INVOKE, "plan", "--target", "cpu"], None),
    ("invoke build --target cpu (no-op, all HIT)", [*INVOKE, "build", "--target", "cpu"], 0.5),
]


def once(command: list[str], root: Path = REPO) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = str(root / "src")  # each checkout its own sources (tasks.py puts them first too)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}):\n{proc.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", default="", help="also write the raw times here")
    parser.add_argument("--against", default="", help="another checkout (e.g. a clone of main): its validate and "
                        "no-op build interleaved with these, an A/B in one run")
    args = parser.parse_args()
    cases = [(label, command, goal, REPO) for label, command, goal in CASES]
    if args.against:
        other = Path(args.against).resolve()
        cases += [(f"{other.name}: invoke validate", [*INVOKE, "validate"], None, other),
                  (f"{other.name}: invoke build --target cpu (no-op)", [*INVOKE, "build", "--target", "cpu"], None,
                   other)]
    for _, command, _, root in cases:
        once(command, root)  # warm: bytecode written, page cache filled, flags learnt
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {label: [] for label, _, _, _ in cases}
    cpu: dict[str, list[float]] = {label: [] for label, _, _, _ in cases}
    for n in range(args.runs):
        for label, command, _, root in cases[n % len(cases):] + cases[:n % len(cases)]:  # the order rotates
            times[label].append(once(command, root))
            cpu[label].append(CPU[-1])
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {args.runs} rounds, interleaved")
    print()
    print("| command | min s | median s | max s | median CPU s (user+sys) | goal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, _, goal, _ in cases:
        t = times[label]
        goal_text = f"<= {goal} s" if goal else "-"
        print(f"| `{label}` | {min(t):.2f} | {statistics.median(t):.2f} | {max(t):.2f} | "
              f"{statistics.median(cpu[label]):.2f} | {goal_text} |")
    med = {label: statistics.median(t) for label, t in times.items()}
    mcpu = {label: statistics.median(t) for label, t in cpu.items()}
    floor, again = med[CASES[0][0]], med[CASES[1][0]]
    validate, noop = med["invoke validate"], med[CASES[-1][0]]
    print()
    print(f"- A/A: floor {floor:.3f} s vs {again:.3f} s ({again / floor:.2f}x)")
    print(f"- validate / import floor: {validate / floor:.2f}x (goal <= 1.5x)")
    print(f"- no-op build / validate: {noop / validate:.2f}x (goal <= 1.5x)")
    c_floor, c_validate, c_noop = mcpu[CASES[0][0]], mcpu["invoke validate"], mcpu[CASES[-1][0]]
    print(f"- the same in CPU seconds (less sensitive to other work; the daemon's share is not in it): validate / "
          f"floor {c_validate / c_floor:.2f}x, no-op / validate {c_noop / c_validate:.2f}x")
    if args.against:
        name = Path(args.against).resolve().name
        o_validate = med[f"{name}: invoke validate"]
        o_noop = med[f"{name}: invoke build --target cpu (no-op)"]
        co_validate = mcpu[f"{name}: invoke validate"]
        co_noop = mcpu[f"{name}: invoke build --target cpu (no-op)"]
        print(f"- {name}: validate / import floor {o_validate / floor:.2f}x, no-op build / validate "
              f"{o_noop / o_validate:.2f}x; in CPU seconds {co_validate / c_floor:.2f}x, {co_noop / co_validate:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": [load_before, load_after], "times": times, "cpu": cpu},
                                              indent=1))


if __name__ == "__main__":
    main()
