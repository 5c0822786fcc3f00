"""apply --in-place / revert wall times in the box (the goal: each <= 2 s without the import check).

    flock /tmp/imageforge-integration.lock .venv/bin/python benchmarks/inplace_apply.py [--pairs 6] \
        [--against /work/main] [--importtime] [--scan-parts N] [--burn N]

One box (``tests/integration/box_fixture.py``: a container from the cpu base, no network, imageforge installed
offline from the cp311 wheelhouse into /opt/imageforge): this checkout's imageforge there, and the checkout given
by ``--against`` (default: main's) built into a second venv, /opt/imageforge-b, from the same dependency wheels.
Then ``--pairs`` rounds, the two sides' order alternating each round, of ``imageforge apply --target cpu
--in-place --no-imports --json`` and ``imageforge revert``, each timed inside the box around the installed
console script (its whole process: start-up included); the box's load average is read before each command. With
``--importtime``, one ``-X importtime`` run of each side's apply (the modules over 5 ms cumulative); with
``--scan-parts N``, N rounds of the undeclared-change scan alone, one scan vs two (:func:`scan_parts`); with
``--burn N``, N busy loops run in the box during the timed rounds (the load of a shared machine). Prints one
JSON object (rows, medians, spreads). Removes the box.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.box_fixture import BOX_VENV, BOX_WHEELS, Box, _tar, make_box, repo_files  # noqa: E402

SIDE_B = "/opt/imageforge-b"
NATIVE_STEP = "moe-group-kernel"  # the cpu target's native step: reads its extension's closure (libtorch_cpu.so)
APPLY = "apply --target cpu --in-place --no-imports --json"
TIMED = """
import json, subprocess, sys, time
load = open("/proc/loadavg").read().split()[:3]
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": p.returncode, "s": time.perf_counter() - t0, "load": load, "out": p.stdout[-20000:],
                  "err": p.stderr[-3000:]}))
"""


SCAN_PARTS = """
import json, sys, time
from pathlib import Path
from imageforge.inplace.changescan import ChangeScan, KernelClock
class Unarmed(KernelClock):  # no word on the clock: the full lstat state of every entry before (two scans)
    def arm(self): return False
tops = [Path(sys.argv[1]), Path(sys.argv[2])]
Path("/tmp/scan-marker").mkdir(exist_ok=True)
rows = []
for rep in range(int(sys.argv[3])):
    for name, clock in (("one scan", KernelClock), ("two scans", Unarmed)):
        s = ChangeScan(tops, [], [True, False], Path("/tmp/scan-marker"), clock=clock())
        t0 = time.perf_counter(); s.before(); t1 = time.perf_counter(); changed = s.changes(); t2 = time.perf_counter()
        rows.append({"way": name, "before_s": round(t1 - t0, 3), "after_s": round(t2 - t1, 3),
                     "entries": len(s.names), "changed": len(changed[0])})
print(json.dumps(rows))
"""


def scan_parts(box: Box, venv: str, repeats: int) -> list[dict[str, Any]]:
    """The undeclared-change scan alone over the cpu box's site-packages and bin: one scan (names before, lstat
    after) vs two (lstat before and after), alternating."""
    code, out = box.sh(f"env -u PYTHONDONTWRITEBYTECODE {venv}/bin/python -c {shlex.quote(SCAN_PARTS)} "
                       f"/opt/venv/lib/python3.11/site-packages /opt/venv/bin {repeats}")
    assert code == 0, out[-3000:]
    rows: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    return rows


BURN = "import os; open('/tmp/burn.%d' % os.getpid(), 'w').close()\nwhile True: pass"


def burn(box: Box, processes: int, settle_s: float) -> None:
    """``processes`` busy loops in the box (the machine's load, as other work makes it), then
    ``settle_s`` for the load average to follow."""
    for _ in range(processes):
        box.container.exec_run(["python3", "-c", BURN], detach=True)
    time.sleep(settle_s)


def unburn(box: Box) -> None:
    box.sh("for f in /tmp/burn.*; do [ -e \"$f\" ] && kill \"${f#/tmp/burn.}\"; rm -f \"$f\"; done; true")


def other_wheel(checkout: Path, out: Path) -> Path:
    """imageforge's wheel of another checkout (its tracked files copied first: the checkout is never written)."""
    with tempfile.TemporaryDirectory(prefix="imageforge-bench-src-") as tmp:
        for rel in repo_files(checkout):
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkout / rel, Path(tmp) / rel)
        subprocess.run([sys.executable, "-m", "pip", "-q", "wheel", "--no-deps", "--no-build-isolation", "-w",
                        str(out), tmp], check=True)
    [wheel] = list(out.glob("imageforge-*.whl"))
    return wheel


def timed(box: Box, venv: str, args: str) -> dict[str, Any]:
    code, out = box.sh(f"env -u PYTHONDONTWRITEBYTECODE {BOX_VENV}/bin/python -c {shlex.quote(TIMED)} "
                       f"{venv}/bin/imageforge {args}")
    assert code == 0, out
    row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if row["rc"] != 0:
        raise SystemExit(f"imageforge {args} ({venv}) -> exit {row['rc']}\n{row['out'][-3000:]}\n{row['err']}")
    return row


def importtime(box: Box, venv: str) -> list[tuple[str, float]]:
    code, out = box.sh(f"env -u PYTHONDONTWRITEBYTECODE {venv}/bin/python -X importtime -c "
                       f"'import sys; sys.argv = [\"imageforge\", *sys.argv[1:]]; "
                       f"from imageforge.cli.launch import main; main()' {APPLY} 2>&1 >/dev/null "
                       f"&& {venv}/bin/imageforge revert >/dev/null")
    assert code == 0, out[-3000:]
    rows = []
    for line in out.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit() and int(cumulative) > 5000:
                rows.append((name.rstrip(), int(cumulative) / 1e6))
    return rows


def _seconds(report: dict[str, Any], step: str) -> float | None:
    return next((s["seconds"] for s in report["steps"] if s["id"] == step), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--against", type=Path, default=Path("/work/main"))
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--burn", type=int, default=0, metavar="N",
                        help="N busy loops in the box during the timed rounds (load), after a 60 s settle")
    parser.add_argument("--scan-parts", type=int, default=0, metavar="N", help="N rounds of the scan alone")
    args = parser.parse_args()
    box = make_box(log=lambda line: print(line, file=sys.stderr))
    try:
        with tempfile.TemporaryDirectory(prefix="imageforge-bench-wheel-") as tmp:
            wheel = other_wheel(args.against, Path(tmp))
            assert box.container.put_archive("/", _tar([(f"{BOX_WHEELS.lstrip('/')}/b/{wheel.name}", wheel)]))
        code, out = box.sh(f"/usr/bin/python3 -m venv {SIDE_B} && {SIDE_B}/bin/pip install -q --no-index "
                           f"--find-links {BOX_WHEELS} {BOX_WHEELS}/b/{wheel.name}", timeout=600)
        assert code == 0, out
        sides = {"this": BOX_VENV, "against": SIDE_B}
        rows: list[dict[str, Any]] = []
        if args.burn:
            burn(box, args.burn, 60.0)
        warmup: dict[str, Any] = {}
        for name, side in sides.items():  # warm-up: the page cache and the ELF summaries, each side once (apart)
            a = timed(box, side, APPLY)
            report = json.loads(a["out"][a["out"].index("{"):])
            warmup[name] = {"apply_s": round(a["s"], 3), "native_step_s": _seconds(report, NATIVE_STEP),
                            "load": a["load"]}
            timed(box, side, "revert")
        for i in range(args.pairs):
            order = list(sides.items()) if i % 2 == 0 else list(reversed(sides.items()))
            for name, venv in order:
                a = timed(box, venv, APPLY)
                report = json.loads(a["out"][a["out"].index("{"):])
                r = timed(box, venv, "revert")
                steps = {s["id"]: s["seconds"] for s in report["steps"]}
                rows.append({"pair": i, "side": name, "apply_s": round(a["s"], 3), "revert_s": round(r["s"], 3),
                             "inside_s": report["seconds"], "ldconfig_step_s": steps.get("ldconfig"),
                             "native_step_s": steps.get(NATIVE_STEP), "load": a["load"]})
                print(json.dumps(rows[-1]), file=sys.stderr)
        unburn(box)
        summary: dict[str, Any] = {"rows": rows, "burn": args.burn, "warmup": warmup}
        for name in sides:
            mine = [r for r in rows if r["side"] == name]
            for key in ("apply_s", "revert_s", "inside_s", "ldconfig_step_s", "native_step_s"):
                if any(r[key] is None for r in mine):
                    continue
                values = sorted(r[key] for r in mine)
                summary[f"{name}_{key}"] = {"median": round(statistics.median(values), 3), "min": values[0],
                                            "max": values[-1]}
        if args.scan_parts:
            summary["scan_parts"] = scan_parts(box, BOX_VENV, args.scan_parts)
        if args.importtime:
            summary["importtime"] = {name: importtime(box, venv) for name, venv in sides.items()}
        print(json.dumps(summary, indent=1))
    finally:
        box.remove()


if __name__ == "__main__":
    main()
