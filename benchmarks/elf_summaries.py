"""The native step's ELF checks against the cpu base, with and without the kept ELF summaries.

    flock /tmp/imageforge-integration.lock .venv/bin/python benchmarks/elf_summaries.py [--repeats 3]

What check-patches, preflight and the build pay for the cpu target's native step (``moe-group-kernel``): its
extension's ``DT_NEEDED`` closure (libtorch_cpu.so 415 MB, libc10, the interpreter, ...) read through a container
created from the cpu base (:class:`imageforge.steps.ContainerFS`: the daemon's archive), then checked. Per repeat,
three ways: ``read`` (no store: every object read, the code before the store), ``cold`` (an empty store: every object
read, its summary kept), ``kept`` (the store ``cold`` filled: nothing read). Each in a new resolver, as a new
command would. Prints one JSON object (seconds per way and repeat, the machine's load before each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from imageforge.docker_engine import client  # noqa: E402
from imageforge.manifest.load import load_manifest  # noqa: E402
from imageforge.manifest.resolve import resolve  # noqa: E402
from imageforge.steps import ContainerFS  # noqa: E402
from imageforge.steps.native import NativeSpec, elf_findings  # noqa: E402
from imageforge.vendor_api.elfcache import SummaryStore  # noqa: E402
from imageforge.vendor_api.elfcheck import Resolver  # noqa: E402
from tests.integration.helpers import cpu_base_refs  # noqa: E402

SITE = "/opt/venv/lib/python3.11/site-packages"
STEP = "moe-group-kernel"


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    step = next(s for s in resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={}).steps if s.id == STEP)
    spec = NativeSpec.of(step)
    container = client().containers.create(cpu_base_refs()[1], command=["true"], network_disabled=True,
                                           labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test"})
    rows: list[dict[str, Any]] = []
    try:
        fs = ContainerFS(container, pristine=True)
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="imageforge-elf-bench-") as tmp:
                store = SummaryStore(Path(tmp))
                for way, given in (("read", None), ("cold", store), ("kept", store)):
                    before = load()
                    t0 = time.perf_counter()
                    found = elf_findings(step, fs, SITE, {}, resolver=Resolver(fs, spec.library_path, store=given))
                    seconds = time.perf_counter() - t0
                    assert found == [], found
                    rows.append({"repeat": repeat, "way": way, "s": round(seconds, 3), "load": before})
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        container.remove(force=True)
    summary: dict[str, Any] = {"rows": rows}
    for way in ("read", "cold", "kept"):
        values = sorted(r["s"] for r in rows if r["way"] == way)
        summary[way] = {"median": round(statistics.median(values), 3), "min": values[0], "max": values[-1]}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
