"""Cold build of the emitted submission tree (plain ``docker build``) vs imageforge's build of the target.

    .venv/bin/python benchmarks/submission_build.py [--profile conservative] [--rounds 3] [--write-results]

Each round salts the first patch of a copy of build.yaml's ``cpu`` target (bench/build_vs_dockerfile.py's
``Imageforge`` side: image ``imageforge-bench/cpu``, base given by reference), so nothing of it is cached;
imageforge builds it (``invoke build``, a whole process); the submission tree of the same manifest is
written (not timed in the build column) and built with ``DOCKER_BUILDKIT=0 docker build --no-cache``
(a whole process).  The two sides alternate which goes first.  --write-results puts the table into
bench/RESULTS.md as the **Latest** part of the section ``## Submission tree vs imageforge build``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from build_vs_dockerfile import MADE, Imageforge, cleanup, sh, write_latest  # noqa: E402

SECTION = "## Submission tree vs imageforge build"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()

    from imageforge import base as base_mod
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve
    from imageforge.submission import discover_base, write_submission

    base_ref = base_mod.base_image_status(REPO / "images" / "cpu").ref
    load_before = load()
    forge_s: list[float] = []
    verify_s: list[float] = []
    docker_s: list[float] = []
    write_s: list[float] = []
    facts = None
    with tempfile.TemporaryDirectory(prefix="imageforge-bench-submission-") as tmp:
        try:
            for n in range(args.rounds):
                salt = secrets.token_hex(4)
                work = Path(tmp) / f"round-{n}"
                work.mkdir()
                forge = Imageforge(work, base_ref, salt, args.profile)
                resolved = resolve(load_manifest(forge.manifest), "cpu", args.profile, environ=os.environ)
                if facts is None:
                    _, facts = discover_base(resolved, os.environ, lambda _line: None)
                t0 = time.perf_counter()
                tree = work / "tree"
                write_submission(resolved, tree, environ=os.environ, base_ref=base_ref, base=facts,
                                 log=lambda _line: None)
                write_s.append(time.perf_counter() - t0)
                tag = f"imageforge-bench/submission:{salt}"

                def docker_side(tree: Path = tree, tag: str = tag) -> None:
                    seconds, _ = sh(["docker", "build", "--no-cache", "--tag", tag, str(tree)],
                                    env={"DOCKER_BUILDKIT": "0"})
                    docker_s.append(seconds)
                    image = subprocess.run(["docker", "images", "-q", "--no-trunc", tag], capture_output=True,
                                           text=True, check=True).stdout.strip()
                    MADE.append(("dockerfile", image))

                def forge_side(forge: Imageforge = forge) -> None:
                    run = forge.build()
                    assert run.redone == run.total, "the imageforge side must be cold"
                    forge_s.append(run.seconds)
                    verify_s.append(run.verify)

                for side in ((forge_side, docker_side) if n % 2 == 0 else (docker_side, forge_side)):
                    side()
                print(f"round {n + 1}: imageforge {forge_s[-1]:.1f} s (verify {verify_s[-1]:.1f} s), "
                      f"docker build {docker_s[-1]:.1f} s, tree written in {write_s[-1]:.2f} s", flush=True)
        finally:
            cleanup()
    load_after = load()

    def cell(values: list[float], digits: int = 1) -> str:
        return f"{statistics.median(values):.{digits}f} s [{min(values):.{digits}f}-{max(values):.{digits}f}]"

    server = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                            text=True).stdout.strip()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {stamp} with `benchmarks/submission_build.py --rounds {args.rounds}` "
        f"(profile {args.profile}): 2 cores "
        f"shared with other work (load average {load_before} before, {load_after} after), Docker "
        f"{server}, legacy builder. Each round is cold on both sides (first patch salted; `docker build "
        "--no-cache`), whole processes, wall clock, sides alternating; median [min-max] of the rounds.",
        "",
        "| side | cold build, median [min-max] |",
        "| --- | --- |",
        f"| imageforge (`invoke build`, 10 layers, verification as `build` does it by default) | {cell(forge_s)} |",
        f"| of which verify (imageforge only) | {cell(verify_s)} |",
        f"| imageforge without verify | {cell([f - v for f, v in zip(forge_s, verify_s, strict=True)])} |",
        f"| emitted tree (`docker build --no-cache`, no imports: the platform's builder may have no device) | "
        f"{cell(docker_s)} |",
        f"| writing the tree (`write_submission`, not part of either build) | {cell(write_s, 2)} |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.write_results:
        write_latest(REPO / "bench" / "RESULTS.md", SECTION, table)


if __name__ == "__main__":
    main()
