"""What the server-start benchmarks share (start_cache.py, start_method.py): the target from the command line, one
real start of its server through ``imageforge.serve.container`` (the path `run`, `smoke --target`, equiv, bisect,
ablate and sweep take), and arms started interleaved, one of each per round."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve.container import ContainerRuntime

REPO = Path(__file__).resolve().parents[1]

Start = tuple[float, float | None]  # seconds from the container's start to /health OK, its CPU seconds by then


def target_from_args(doc: str, *, repeat: int) -> tuple[argparse.Namespace, Resolved]:
    """``--manifest``, ``--target``, ``--profile`` and ``--repeat`` parsed; the target resolved."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--manifest", default=str(REPO / "build.yaml"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--repeat", type=int, default=repeat)
    args = parser.parse_args()
    return args, resolve(load_manifest(Path(args.manifest)), args.target, args.profile, environ=os.environ)


def cpu_seconds(container_id: str) -> float | None:
    """The container's CPU time so far (cgroup v1 cpuacct, Docker's cgroupfs layout), or None where not found."""
    for parent in ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct/docker"):
        path = Path(parent) / container_id / "cpuacct.usage"
        if path.is_file():
            return int(path.read_text()) / 1e9
    return None


def start_once(resolved: Resolved) -> Start:
    """One start of the target's image (built, or reused), stopped again once it answers."""
    runtime = ContainerRuntime()
    prepared = runtime.prepare(resolved, environ=os.environ, log=lambda _line: None)
    with runtime.serving(resolved, prepared, environ=os.environ, log=lambda _line: None) as server:
        seconds, cpu = server.startup_seconds, cpu_seconds(server.container.id)
    assert seconds is not None
    return round(float(seconds), 2), None if cpu is None else round(cpu, 2)


def interleaved(arms: dict[str, Resolved], repeat: int) -> dict[str, list[Start]]:
    """``repeat`` rounds, each starting every arm once in the order given."""
    runs: dict[str, list[Start]] = {name: [] for name in arms}
    for _ in range(repeat):
        for name, arm in arms.items():
            runs[name].append(start_once(arm))
    return runs
