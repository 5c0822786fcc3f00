"""Verification facts by content: the cpu target's verify step on new content vs on content verified before.

    .venv/bin/python benchmarks/verify_reuse.py [--rounds 2]

Each round copies build.yaml's cpu target into a tmp dir (image ``imageforge-bench/verify-reuse``, base given as
the cpu base's reference, the first patch salted so the content is new), builds it (verify imports the patched
modules), then renames one patch step: a new layer chain with the same bytes, so the verify layer is built again
but its imports are reused ("imports REUSED"). Prints the verify step's seconds for both, and the whole builds'.
Removes what it built.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
INVOKE = str(REPO / ".venv" / "bin" / "invoke")
FIRST_PATCH_NEW = '"BASE_BLOCK = 64  # imageforge: SMEM-bound tile (notes: 48 KiB per block)"'
RENAMED = ("      - id: cpu-moe-apply-sorted\n", "      - id: cpu-moe-apply-sorted-renamed\n")


def build(manifest: Path) -> tuple[float, dict[str, object]]:
    t0 = time.perf_counter()
    proc = subprocess.run([INVOKE, "build", "--manifest", str(manifest), "--target", "cpu", "--json"],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = proc.stdout
    data: dict[str, object] = json.JSONDecoder().raw_decode(out[out.index("{"):])[0]
    return seconds, data


def verify_row(data: dict[str, object]) -> dict[str, object]:
    steps = data["steps"]
    assert isinstance(steps, list)
    row: dict[str, object] = next(s for s in steps if s["stage"] == "verify")
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from imageforge.base import base_image_status

    base_ref = base_image_status(REPO / "images" / "cpu").ref
    load_before = os.getloadavg()
    new: list[tuple[float, float]] = []
    reused: list[tuple[float, float]] = []
    made: list[str] = []
    try:
        for _ in range(args.rounds):
            work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
            try:
                for rel in ("overlays", "smoke"):
                    shutil.copytree(REPO / rel, work / rel)
                text = (REPO / "build.yaml").read_text()
                start, end = text.index("\n  cpu:\n"), text.index("\n  bi100:\n")
                cpu = re.sub(r"\n      recipe: images/cpu[^\n]*", f'\n      image: "{base_ref}"', text[start:end],
                             count=1)
                cpu = cpu.replace("\n    image: imageforge/cpu\n", "\n    image: imageforge-bench/verify-reuse\n", 1)
                # an image base: its flags would be read statically; the recipe base's are introspected
                cpu = cpu.replace("\n    package:\n", "\n    package:\n      flags: introspect\n", 1)
                cpu = cpu.replace(FIRST_PATCH_NEW, FIRST_PATCH_NEW[:-1] + f' bench-{secrets.token_hex(4)}"', 1)
                assert RENAMED[0] in cpu
                manifest = work / "build.yaml"
                manifest.write_text(text[:start] + cpu + text[end:])
                seconds, data = build(manifest)
                row = verify_row(data)
                assert row["cache"] == "BUILT", row
                new.append((float(str(row["seconds"])), seconds))
                made += [str(s["image_id"]) for s in data["steps"] if s["cache"] != "HIT"]  # type: ignore[attr-defined]
                manifest.write_text(manifest.read_text().replace(*RENAMED))
                seconds, data = build(manifest)
                row = verify_row(data)
                assert row["cache"] == "REUSED", row
                reused.append((float(str(row["seconds"])), seconds))
                made += [str(s["image_id"]) for s in data["steps"] if s["cache"] != "HIT"]  # type: ignore[attr-defined]
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        import docker

        c = docker.from_env()
        for raw in c.api.images(filters={"reference": "imageforge-bench/verify-reuse"}):
            for tag in raw.get("RepoTags") or []:
                with contextlib.suppress(docker.errors.APIError):
                    c.api.remove_image(tag, noprune=True)
        for image in reversed(made):
            with contextlib.suppress(docker.errors.APIError):
                c.api.remove_image(image, noprune=True)
    load_after = os.getloadavg()

    def spread(values: list[float]) -> str:
        return f"{min(values):.2f} [{statistics.median(values):.2f}] {max(values):.2f}"

    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {args.rounds} rounds; "
          "seconds min [median] max")
    print()
    print("| verify on | verify step s | whole build s |")
    print("| --- | --- | --- |")
    print(f"| new content (imports run) | {spread([v for v, _ in new])} | {spread([b for _, b in new])} |")
    print(f"| content verified before (imports REUSED) | {spread([v for v, _ in reused])} | "
          f"{spread([b for _, b in reused])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
