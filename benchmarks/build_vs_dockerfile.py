"""Build engine vs a hand-written Dockerfile, both measured in the same run (issue 5).

    .venv/bin/python benchmarks/build_vs_dockerfile.py [--profile conservative] [--repeat 5] [--write-results]

imageforge builds the `cpu` target of a copy of build.yaml (in a tmp dir, image renamed
``imageforge-bench/cpu`` so no real tag moves; base given as the cpu base image's reference);
``docker build`` (legacy builder, DOCKER_BUILDKIT=0) builds benchmarks/Dockerfile.cpu, which makes the
same image by hand.  Both sides get the same salt in the first patch, so the first build is cold
for both (nothing of it in any cache), and every time is a whole process (`invoke build ...` /
`docker build ...`), measured with a wall clock.

Scenarios: first build on the base; no-op rebuild (median of --repeat); one overlay changed (the
first one in the manifest: the most steps redone); a profile-only change (one serving arg of the
profile).  imageforge's verification step (stale bytecode, py_compile, imports of the patched
modules in the image) has no Dockerfile counterpart: users wait for it, so the ratio counts it
(issue 25); the ratio without it is shown next to it. The same Dockerfile is built a second time per
round with its own salt (A/A): its ratio to the first says how much of a difference is noise.
Prints a markdown table; --write-results puts it into bench/RESULTS.md under
``## Build engine vs Dockerfile (issue 5)`` (only that section is replaced).
"""

from __future__ import annotations

import argparse
import datetime as dt
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

INVOKE = str(REPO / ".venv" / "bin" / "invoke")
SECTION = "## Build engine vs Dockerfile (issue 5)"
FIRST_PATCH_NEW = '"BASE_BLOCK = 64  # imageforge: SMEM-bound tile (notes: 48 KiB per block)"'
KiB = 1024
MADE: list[tuple[str, str]] = []  # (side, image id) of everything this run built, for the cleanup


@dataclass
class Run:
    seconds: float
    redone: int
    total: int
    verify: float = 0.0
    image: str = ""
    steps: tuple[tuple[str, str, float], ...] = ()  # imageforge: (kind, cache, seconds) per step


def sh(cmd: list[str], *, cwd: Path = REPO, env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    dt_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return dt_s, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- the two sides


class Imageforge:
    def __init__(self, work: Path, base_ref: str, salt: str, profile: str) -> None:
        self.root = work / "imageforge"
        self.profile = profile
        files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        for rel in files.split():
            if rel.startswith(("overlays/", "smoke/")) or rel == "build.yaml":
                dest = self.root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, dest)
        # the working tree's overlays may be ahead of git: take the files as they are now
        for rel in ("overlays", "smoke"):
            shutil.copytree(REPO / rel, self.root / rel, dirs_exist_ok=True)
        shutil.copy2(REPO / "build.yaml", self.root / "build.yaml")
        text = (self.root / "build.yaml").read_text()
        start, end = text.index("\n  cpu:\n"), text.index("\n  bi100:\n")
        cpu = text[start:end]
        cpu = re.sub(r"\n      recipe: images/cpu[^\n]*", f'\n      image: "{base_ref}"', cpu, count=1)
        cpu = cpu.replace("\n    image: imageforge/cpu\n", "\n    image: imageforge-bench/cpu\n", 1)
        # an image base's flags default to a static read of the parser source; the recipe base's are introspected
        cpu = cpu.replace("\n    package:\n", "\n    package:\n      flags: introspect\n", 1)
        assert FIRST_PATCH_NEW in cpu, "benchmarks/Dockerfile.cpu and this script follow the manifest's first patch"
        cpu = cpu.replace(FIRST_PATCH_NEW, FIRST_PATCH_NEW[:-1] + f' bench-{salt}"', 1)
        self.manifest = self.root / "build.yaml"
        self.manifest.write_text(text[:start] + cpu + text[end:])

    def build(self, profile: str | None = None) -> Run:
        seconds, out = sh([INVOKE, "build", "--manifest", str(self.manifest), "--target", "cpu", "--profile",
                           profile or self.profile, "--json"])
        data, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])  # the log lines on stderr follow it
        steps = data["steps"]
        MADE.extend(("imageforge", s["image_id"]) for s in steps if s["cache"] != "HIT")
        verify = sum(s["seconds"] for s in steps if s["stage"] == "verify" and s["cache"] != "HIT")
        return Run(seconds, sum(1 for s in steps if s["cache"] != "HIT"), len(steps), verify, data["image_id"],
                   tuple((s["kind"], s["cache"], float(s["seconds"])) for s in steps))

    def first_overlay(self) -> tuple[str, str]:
        from imageforge.manifest_load import load_manifest

        t = load_manifest(self.manifest).targets["cpu"]
        step = next(s for s in t.steps if s.kind == "overlay")
        return str(step.spec["source"]), str(step.spec["dest"])

    def change_profile(self) -> None:
        text = self.manifest.read_text()
        start, end = text.index("\n  cpu:\n"), text.index("\n  bi100:\n")
        cpu = text[start:end]
        m = re.search(rf"\n      {self.profile}:\n(?:        [^\n]*\n)*?        args: \{{max-num-seqs: (\d+)", cpu)
        assert m, f"profile {self.profile} with max-num-seqs in the cpu target"
        cpu = cpu[:m.start(1)] + str(int(m.group(1)) + 1) + cpu[m.end(1):]
        self.manifest.write_text(text[:start] + cpu + text[end:])

    def serving_config(self) -> bytes:
        from imageforge.manifest_load import load_manifest
        from imageforge.resolve import resolve
        from imageforge.serving import render_serving_config

        return render_serving_config(resolve(load_manifest(self.manifest), "cpu", self.profile, environ={}))


class Dockerfile:
    def __init__(self, work: Path, base_ref: str, salt: str, forge: Imageforge, name: str = "dockerfile") -> None:
        self.ctx = work / name
        self.ctx.mkdir()
        self.base_ref = base_ref
        self.salt = salt
        self.tag = f"imageforge-bench/dockerfile:{salt}"
        shutil.copy2(REPO / "benchmarks" / "Dockerfile.cpu", self.ctx / "Dockerfile")
        from imageforge.manifest_load import load_manifest

        t = load_manifest(forge.manifest).targets["cpu"]
        for step in t.steps:
            if step.kind == "overlay":
                dest = self.ctx / "site" / str(step.spec["dest"])
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(step.source, dest)
            elif step.kind == "script":
                shutil.copy2(step.source, self.ctx / "ldconfig.sh")
        self.write_config(forge.serving_config())

    def write_config(self, data: bytes) -> None:
        (self.ctx / "serving.yaml").write_bytes(data)

    def build(self) -> Run:
        seconds, out = sh(["docker", "build", "-f", "Dockerfile",
                           "--build-arg", f"BASE={self.base_ref}", "--build-arg", f"SALT= bench-{self.salt}",
                           "-t", self.tag, "."], cwd=self.ctx, env={"DOCKER_BUILDKIT": "0"})
        steps = re.split(r"^Step \d+/\d+ : ", out, flags=re.M)[1:]
        total = len(steps)
        redone = sum(1 for s in steps if "Using cache" not in s and not s.startswith(("FROM", "ARG")))
        import docker

        image = str(docker.from_env().images.get(self.tag).id)
        MADE.append(("dockerfile", image))
        return Run(seconds, redone, total, 0.0, image)


def own_bytes(image: str, layers: int = 1) -> int:
    """Bytes the top ``layers`` history entries of ``image`` add."""
    import docker

    history = docker.from_env().api.history(image)
    return sum(int(h.get("Size") or 0) for h in history[:layers])


def layer_bytes_imageforge(image_id: str) -> int:
    import docker

    c = docker.from_env()
    img = c.api.inspect_image(image_id)
    parent = c.api.inspect_image(img["Parent"]) if img.get("Parent") else None
    return int(img["Size"]) - (int(parent["Size"]) if parent else 0)


# --------------------------------------------------------------------------- the run


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def spread(values: list[float]) -> str:
    """min [median] max of a list of seconds."""
    return f"{min(values):.2f} [{statistics.median(values):.2f}] {max(values):.2f}"


@dataclass
class Scenario:
    name: str
    goal: str
    forge: list[Run]
    dock: list[Run]
    again: list[Run]  # the same Dockerfile built a second time in the round, own salt: the A/A control

    def row(self) -> tuple[str, ...]:
        """min [median] max over the rounds; the ratio counts imageforge's verification (issue 25)."""
        f = [r.seconds for r in self.forge]
        fv = [r.seconds - r.verify for r in self.forge]
        d = [r.seconds for r in self.dock]
        a = [r.seconds for r in self.again]
        last_f, last_d = self.forge[-1], self.dock[-1]
        med = statistics.median
        return (self.name, f"{spread(f)} ({last_f.redone}/{last_f.total})", spread(fv),
                f"{spread(d)} ({last_d.redone}/{last_d.total})", spread(a),
                f"{ratio(med(f), med(d))} [best {ratio(min(f), min(d))}]", ratio(med(fv), med(d)),
                ratio(med(a), med(d)), self.goal)


def per_kind(scenarios: dict[str, Scenario]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for sc in scenarios.values():
        for run in sc.forge:
            for kind, cache, seconds in run.steps:
                if cache != "HIT" and kind != "verify":
                    out.setdefault(kind, []).append(seconds)
    return out


def one_round(base_ref: str, profile: str, dockerfile_first: bool, scenarios: dict[str, Scenario],
              notes: dict[str, Any], repeat: int) -> None:
    salt = secrets.token_hex(4)
    work = Path(tempfile.mkdtemp(prefix="bench-build-"))
    try:
        forge = Imageforge(work, base_ref, salt, profile)
        dock = Dockerfile(work, base_ref, salt, forge)
        again = Dockerfile(work, base_ref, secrets.token_hex(4), forge, name="dockerfile-again")

        def both(key: str) -> tuple[Run, Run]:
            # interleaved: the order rotates per round, so no side always runs first (or right after another)
            order = ["forge", "dock", "again"]
            turn = (len(scenarios[key].forge) + (1 if dockerfile_first else 0)) % 3
            runs: dict[str, Run] = {}
            for side in order[turn:] + order[:turn]:
                runs[side] = {"forge": forge.build, "dock": dock.build, "again": again.build}[side]()
            scenarios[key].forge.append(runs["forge"])
            scenarios[key].dock.append(runs["dock"])
            scenarios[key].again.append(runs["again"])
            return runs["forge"], runs["dock"]

        # 1. first build on the base: cold on both sides (the salt is new)
        both("first")
        # 2. no-op rebuilds (whole processes)
        for _ in range(repeat):
            both("noop")
        # 3. one overlay changed: the manifest's first overlay step (the most steps redone)
        source, dest = forge.first_overlay()
        notes["overlay"] = Path(source).name
        stamp = f"\n# bench {secrets.token_hex(4)}\n"
        for path in (forge.root / source, dock.ctx / "site" / dest, again.ctx / "site" / dest):
            path.write_text(path.read_text() + stamp)
        both("overlay")
        # 4. profile-only change: one serving arg of the profile
        forge.change_profile()
        dock.write_config(forge.serving_config())
        again.write_config(forge.serving_config())
        f4, d4 = both("profile")
        notes.setdefault("extra_f", []).append(layer_bytes_imageforge(f4.image))
        notes.setdefault("extra_d", []).append(own_bytes(d4.image, 3))  # COPY serving.yaml, ENV, CMD
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all scenarios, each with a new salt")
    parser.add_argument("--repeat", type=int, default=3, help="no-op rebuilds per side and round")
    parser.add_argument("--write-results", action="store_true", help="replace our section of bench/RESULTS.md")
    parser.add_argument("--keep-images", action="store_true", help="leave the bench images on the daemon")
    args = parser.parse_args()

    from imageforge.base import base_image_status
    from imageforge.docker_engine import ensure_daemon

    ensure_daemon()
    status = base_image_status(REPO / "images" / "cpu")
    if not status.vllm_present:
        raise SystemExit("the cpu base image is missing: run `invoke base --target cpu` first")
    base_ref = status.ref
    scenarios = {
        "first": Scenario("first build on the base", "<= 0.5x", [], [], []),
        "noop": Scenario("no-op rebuild", "<= 0.5 s", [], [], []),
        "overlay": Scenario("one overlay changed", "<= 0.5x", [], [], []),
        "profile": Scenario("profile-only change (max-num-seqs + 1)", "<= 1.0x", [], [], []),
    }
    notes: dict[str, Any] = {}
    # The serving flags of this base and parser are learnt once (as by any earlier build or plan on it); the
    # rounds then measure builds, not the one-time introspection.
    warm = Path(tempfile.mkdtemp(prefix="bench-build-warm-"))
    try:
        sh([INVOKE, "plan", "--manifest", str(Imageforge(warm, base_ref, "warm", args.profile).manifest),
            "--target", "cpu"])
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    load_before = os.getloadavg()
    try:
        for n in range(args.rounds):
            one_round(base_ref, args.profile, n % 2 == 1, scenarios, notes, args.repeat)
        real_noop = [sh([INVOKE, "build", "--target", "cpu", "--profile", args.profile])[0]
                     for _ in range(args.repeat * args.rounds)]
    finally:
        if not args.keep_images:
            cleanup()
    load_after = os.getloadavg()

    import docker

    server = docker.from_env().version()
    scenarios["overlay"].name = f"one overlay changed ({notes.get('overlay')})"
    noop_f = [r.seconds for r in scenarios["noop"].forge]
    verify = [r.verify for key in ("first", "overlay") for r in scenarios[key].forge if r.verify]
    header = (f"Measured {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} with "
              f"`benchmarks/build_vs_dockerfile.py --rounds {args.rounds} --repeat {args.repeat}`: "
              f"{os.cpu_count()} cores "
              f"shared with other work (load average {load_before[0]:.1f} before, {load_after[0]:.1f} after), "
              f"Docker {server.get('Version')}, legacy builder (`DOCKER_BUILDKIT=0 docker build`, "
              "benchmarks/Dockerfile.cpu: one instruction per manifest step), "
              f"base {base_ref}, profile {args.profile}. "
              "Whole processes, wall clock, three sides interleaved in the same run (imageforge, the Dockerfile, "
              "the same Dockerfile again with its own salt: the A/A control; the order rotates), min [median] max "
              f"over {args.rounds} x first/overlay/profile and {args.rounds * args.repeat} x no-op; steps redone "
              "as (built/total). The ratio counts imageforge's verification (issue 25): median / median, best / "
              "best in brackets.")
    table = ["| scenario | imageforge, verification counted (steps redone) | imageforge without verification | "
             "Dockerfile (steps redone) | Dockerfile again (A/A) | ratio | ratio without verification | "
             "A/A ratio | goal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    table += ["| " + " | ".join(sc.row()) + " |" for sc in scenarios.values()]
    lines = [
        f"Verification (imageforge only; counted in the ratio column): best {min(verify):.2f} s (median "
        f"{statistics.median(verify):.2f}, max {max(verify):.2f}) per build that changes files: stale-bytecode check, "
        "py_compile of every changed .py, overlay sha256, symlinks, imports of the patched modules in the image.",
        "",
        f"- no-op rebuild: imageforge median {statistics.median(noop_f):.2f} s, max {max(noop_f):.2f} s; the "
        f"repository's own manifest (`invoke build --target cpu`, recipe base, whose lock and recipe are hashed "
        f"too): best {min(real_noop):.2f} s, median {statistics.median(real_noop):.2f} s.",
        f"- extra disk per profile image: imageforge {max(notes['extra_f'])} B (its config layer), Dockerfile "
        f"{max(notes['extra_d'])} B (COPY serving.yaml + ENV + CMD); goal <= {64 * KiB} B.",
        "- imageforge seconds per step built (best [median] over every build of the run): " + ", ".join(
            f"{kind} {min(v):.2f} [{statistics.median(v):.2f}] s" for kind, v in per_kind(scenarios).items())
        + "; the process "
        "itself (Python, invoke, docker SDK, manifest + schema, plan, one cache listing, tags) is the no-op time.",
    ]
    kinds = {k: min(v) for k, v in per_kind(scenarios).items()}
    noop = min(noop_f)
    reading = (
        "Reading (issue 5's, still true of the steps): a file step costs imageforge about as much as a "
        "legacy-builder COPY (create, put_archive, commit: "
        f"overlay {kinds.get('overlay', 0):.2f} s); imageforge is ahead only where a Dockerfile needs a RUN (patch "
        f"{kinds.get('patch', 0):.2f} s, no container started) and pays a {noop:.2f} s process start (Python, invoke, "
        "docker SDK, schema, plan) where the docker CLI pays well under 0.1 s -- most of the profile-only time. "
        "Meeting 0.5x would take a different engine (a resident build server, layers assembled without the "
        "daemon's commit), not tuning; what tuning gave is in the build-engine commit of issue 5 (one cache "
        "listing per build, kill instead of stop, cached glob listings, no re-tagging: no-op 0.47 -> 0.37 s, "
        "script step -0.9 s, symlink step -1.0 s)."
    )
    body = "\n".join([header, "", *table, "", *lines, "", reading])
    print(body)
    if args.write_results:
        write_section(REPO / "bench" / "RESULTS.md", body)
    return 0


def cleanup() -> None:
    """Remove what the bench built (salted, so no other build shares any of it), newest first."""
    import contextlib

    import docker

    c = docker.from_env()
    for raw in c.api.images(filters={"reference": "imageforge-bench/*"}):
        for tag in raw.get("RepoTags") or []:
            with contextlib.suppress(docker.errors.APIError):
                c.api.remove_image(tag, noprune=True)
    for side, image in reversed(MADE):
        with contextlib.suppress(docker.errors.APIError):  # gone already, or a parent of a later one
            c.api.remove_image(image, noprune=side == "imageforge")


def write_section(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else "# Measured results\n"
    block = f"{SECTION}\n\n{body}\n"
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + block + (text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
