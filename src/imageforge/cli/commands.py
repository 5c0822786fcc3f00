"""The `imageforge` command: the invoke task collection over the library's front door.

Each task parses its options and calls one function of `imageforge.app`. Installed, the collection is
the `imageforge` console command (`main`, invoke's `Program`); in the repository, `tasks.py` re-exports
it so `invoke TASK` works the same. Run `imageforge --list`, or `imageforge TASK --help`.
Exit codes: 0 ok, 1 usage (invoke's own), 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.program import Program
from invoke.tasks import Task

from .. import __version__, app
from ..errors import BuildError, ConfigError
from ..workload import Workload
from .options import PROFILE_HELP, RESOLVE_HELP, SET_HELP, SHARED_HELP, TARGET_HELP, command
from .output import EXIT_CLOSED_PIPE, Output, closed_pipe_quiet

if TYPE_CHECKING:
    from ..smoke import SmokeReport


STRICT_HELP = ("Exit 2 when a serving value makes an evaluator check fail (max-model-len above max_context_tokens, "
               "max-num-seqs 1 with the n guard, a parser or prefix caching missing) and no profile takes it on "
               "purpose")


@command(json=True, help={"strict": STRICT_HELP})
def validate(c: Context, cmd: Output, strict: bool = False) -> None:
    """Check the manifest: YAML, schema, files, paths, profiles of every target, their serving values against the
    evaluator's checks (warnings). No daemon needed."""
    summary = app.validate(cmd.settings, strict=strict)
    cmd.result(summary.text(), summary.to_json())


@command(json=True, iterable=["set_"],
         help={**RESOLVE_HELP, "no_daemon": "Do not ask the Docker daemon for cache state", "strict": STRICT_HELP})
def plan(c: Context, cmd: Output, target: str = "", profile: str = "", set_: list[str] | None = None,
         no_daemon: bool = False, strict: bool = False) -> None:
    """Show every resolved value (and where it came from), the ordered steps, cache keys and HIT/MISS; warn
    where a serving value makes an evaluator check fail."""
    result = app.plan(cmd.settings, target or None, profile or None, set_ or [], use_daemon=not no_daemon,
                      strict=strict)
    cmd.result(result.text(), result.to_json())


@command(help={"target": "Target whose recipe base image to make (default: cpu)"})
def base(c: Context, cmd: Output, target: str = "cpu") -> None:
    """Make the target's base image from its recipe (OS image, wheelhouse, vLLM venv) and its model."""
    ref = app.base(cmd.settings, target)
    cmd.result(f"BASE={ref}")


@command(json=True, iterable=["set_"], help={
    **RESOLVE_HELP, "verbose": "Show script and verification output live",
    "locked": "Fail (exit 2, nothing built) when anything differs from build.lock (see `imageforge lock`)",
    "verify_imports": "Also import verify.imports in the image before any tag moves (10-30 s of vLLM's start-up "
    "on new content; by default the first server start proves them)"})
def build(c: Context, cmd: Output, target: str = "", profile: str = "", set_: list[str] | None = None,
          verbose: bool = False, locked: bool = False, verify_imports: bool = False) -> None:
    """Build (or reuse from cache) every layer of TARGET:PROFILE, verify it, then move its tags."""
    result = app.build(cmd.settings, target or None, profile or None, set_ or [], verbose=verbose, quiet=cmd.quiet,
                       locked=locked, verify_imports=verify_imports)
    cmd.result(f"IMAGE={result.tags[0]}" if result.tags else None, result.to_json())


@command(help={"dir": "Directory of the new project (default: the current one; with --from: DIR itself)",
               "force": "Overwrite files that are already there",
               "from_": "Adopt a team's repository: its root Dockerfile and computility-run.yaml become build.yaml",
               "base": "With --from: the base image to use instead of the Dockerfile's FROM (a local image)",
               "no_scan": "With --from: do not run the steps on the base to learn their touches: (no Docker)"})
def init(c: Context, cmd: Output, dir: str = "", force: bool = False, from_: str = "", base: str = "",
         no_scan: bool = False) -> None:
    """Write a starter project: build.yaml (the cpu target), images/cpu (its base recipe), smoke/ (its suite);
    --from DIR: a build.yaml that reproduces DIR's build (a script step per RUN, its touches: from running it in
    a throwaway container of the base, serving from its run file)."""
    if from_:
        path, untranslated = app.init_from(cmd.settings, Path(from_), Path(dir or from_), base=base or None,
                                           force=force, scan=not no_scan)
        cmd.result(f"wrote   {path}")
        for line in untranslated:
            cmd.result(f"not translated: {line}")
        return
    from ..starter import write_starter

    for line in write_starter(Path(dir or "."), force=force):
        cmd.result(line)


# --------------------------------------------------------------------------- tools around the engine


@command(json=True, help={
    "target": TARGET_HELP, "profile": "Only this profile's steps (default: the shared steps and every profile's)",
    "diff": "Print the unified diff each step would make"})
def check_patches(c: Context, cmd: Output, target: str = "", profile: str = "", diff: bool = False) -> None:
    """Dry-run every patch/overlay/symlink step against the real base image (nothing built). Exit 3 if any fails."""
    app.check_patches(cmd.settings, target or None, profile or None, diff=diff,
                      show=lambda report: cmd.result(report.text(), report.to_json()))


@command(json=True, help={
    "target": TARGET_HELP, "profile": "Profile whose steps are checked (default: the target's default profile)",
    "strict": "Warnings fail the run too",
    "allow_dirty": "Go on when files the submission ships are untracked or modified in git (then warnings)",
    "in_place": "No Docker: the phases that need none, over this machine's files (file steps as `apply --in-place "
                "--dry-run`, script steps read, never run); nothing is written",
    "root": "With --in-place: the root the target's files live under (default /)",
    "python": "With --in-place: the target's interpreter (default: python3 on PATH)"})
def preflight(c: Context, cmd: Output, target: str = "", profile: str = "", strict: bool = False,
              allow_dirty: bool = False, in_place: bool = False, root: str = "", python: str = "") -> None:
    """Every check that needs no card, one run, every finding: validate, the steps (scripts in a sandbox), the
    final tree's Python/imports/vendor API, scripts, pins, CRLF, flags, the submission tree, git. Exit 3 on an error.
    --in-place: the same report from the phases that need no Docker (the card's machine)."""
    if (root or python) and not in_place:
        raise ConfigError("--root and --python are for preflight --in-place", hint="add --in-place")
    app.preflight(cmd.settings, target or None, profile or None, strict=strict, allow_dirty=allow_dirty,
                  root=Path(root or "/") if in_place else None, python=python or "python3",
                  show=lambda report: cmd.result(report.text(), report.to_json()), log=cmd.log)


@command(json=True, manifest=False, iterable=["module", "walk", "ops", "library"], help={
    "in_place": "Probe this machine's Python (the only mode: run it on the card's box)",
    "python": "The target interpreter (default: python3 on PATH)",
    "out": "The record to write (default vendor-api.json)",
    "module": "An extension module to record (repeatable; default: vllm._C, vllm._moe_C)",
    "walk": "A package recorded with all its submodules (repeatable; default: ixformer)",
    "ops": "A torch.ops namespace to record with its schemas (repeatable; default: _C, _moe_C, _C_cache_ops, "
           "_C_custom_ar)",
    "library": "A shared library (glob) whose soname, needed and exports to record (repeatable)"})
def probe(c: Context, cmd: Output, in_place: bool = False, python: str = "python3", out: str = "vendor-api.json",
          module: list[str] | None = None, walk: list[str] | None = None, ops: list[str] | None = None,
          library: list[str] | None = None) -> None:
    """Record the vendor's API (names, kinds, signatures; libraries' exports; versions) for preflight."""
    from ..vendor_api.probe import DEFAULT_MODULES, DEFAULT_OPS, DEFAULT_WALK

    if not in_place:
        raise ConfigError("probe works in place only: give --in-place (run it where the vendor's Python is)")
    result = app.probe(out=out, python=python, modules=module or DEFAULT_MODULES, walk=walk or DEFAULT_WALK,
                       ops=ops or DEFAULT_OPS, libraries=library or ())
    cmd.result(result.text(), result.to_json())


@command(positional=[], help={
    "target": TARGET_HELP,
    "file": "The file in the image: relative to the package's site directory (vllm/...) or absolute",
    "edited": "Your edited copy of that file (local path)",
    "base_only": "Diff against the base image's file, not the file after the target's existing steps",
    "id_prefix": "Step id prefix (default: the file's name)"})
def patch_from(c: Context, cmd: Output, file: str = "", edited: str = "", target: str = "", base_only: bool = False,
               id_prefix: str = "") -> None:
    """Print the fewest anchored `patch` steps (YAML to paste) that turn an image file into EDITED."""
    if not file or not edited:
        raise ConfigError("patch-from needs --file (the file in the image) and --edited (your copy of it)")
    result = app.patch_from(cmd.settings, target or None, file, edited, against_base=base_only, id_prefix=id_prefix)
    cmd.result(result.yaml.rstrip("\n"))


@command(help={"target": TARGET_HELP})
def lock(c: Context, cmd: Output, target: str = "") -> None:
    """Write build.lock: base image ID, package version, overlay/script sha256, manifest digest."""
    path, entry = app.lock(cmd.settings, target or None)
    cmd.result(f"locked {path}: base {entry['base']['reference']} ({entry['base']['image_id']}), "
               f"{entry['package']['distribution']} {entry['package']['version']}, "
               f"{len(entry['inputs'])} input(s), manifest {entry['manifest_digest'][:12]}")


@command(json=True, help={
    "target": TARGET_HELP, "profile": PROFILE_HELP,
    "out": "Output directory (default: <manifest dir>/dist)",
    "gzip": "Compress the tarball (gzip -1)",
    "push": "Also push to this repository (e.g. 127.0.0.1:5000/imageforge/cpu); credentials from Docker's config",
    "no_save": "Do not write the tarball (with --push: push only)"})
def export(c: Context, cmd: Output, target: str = "", profile: str = "", out: str = "", gzip: bool = False,
           push: str = "", no_save: bool = False) -> None:
    """The deliverable: `docker save` tarball + .sha256 + .json description of TARGET:PROFILE; --push REPO."""
    result = app.export(cmd.settings, target or None, profile or None, out=out or None, push=push or None,
                        gzip_=gzip, save=not no_save, quiet=cmd.quiet)
    cmd.result(result.text(), result.to_json())


@command(json=True, help={
    "keep": "Final images kept per target/profile, newest first (default 3)",
    "dry_run": "Only print what would be removed",
    "target": "Only this target (default: every target of the manifest)",
    "min_age": "Never remove images or stopped containers younger than this many seconds (default 600)"})
def clean(c: Context, cmd: Output, keep: int = 3, dry_run: bool = False, target: str = "",
          min_age: float = 600.0) -> None:
    """Remove labelled build images and containers that no retention rule keeps; print what was freed."""
    result = app.clean(cmd.settings, keep=keep, dry_run=dry_run, target=target or None, min_age=min_age)
    cmd.result(result.text(), result.to_json())


# --------------------------------------------------------------------------- run, stop, smoke, demo


@command(json=True, host=True, in_place=True, iterable=["set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile name (default: the target's default_profile); built first if needed",
    "base": "Run the base image with the serving args as `vllm serve` flags (no build)",
    "port": "Host port on 127.0.0.1 (default: run.port when free, else a free one)",
    "set_": SET_HELP,
    "timeout": "Seconds to wait for /health (default: the target's smoke.startup_timeout)"})
def run(c: Context, cmd: Output, target: str = "", profile: str = "", base: bool = False, port: int = 0,
        set_: list[str] | None = None, timeout: float = 0.0) -> None:
    """Start TARGET's server on 127.0.0.1, wait until /health answers, leave it running; prints URL=..."""
    server = app.run(cmd.settings, target or None, profile or None, set_ or [], base=base, port=port or None,
                     timeout=timeout or None, runtime=cmd.runtime)
    cmd.log(cmd.runtime.detached_note(server))
    cmd.result(f"URL={server.url}", {"container": server.name, "image": server.image, "url": server.url})


@command(help={"target": "Only this target's servers (default: all)",
               "all": "Also servers left by interrupted smoke runs or tests",
               "in_place": "End the server processes `run --in-place` recorded (TERM, then KILL); no Docker"})
def stop(c: Context, cmd: Output, target: str = "", all: bool = False, in_place: bool = False) -> None:
    """Stop and remove the server containers `imageforge run` started (found by label); --in-place: its processes."""
    app.stop(target or None, every=all, s=cmd.settings,
             runtime=app.runtime(cmd.settings, process=in_place, serves=False))


@command(json=True, host=True, in_place=True, iterable=["set_", "param"], help={
    "url": "Test a server that is already running, e.g. http://127.0.0.1:8000",
    "target": "Target name (default: the manifest's default_target); names the suite and tags",
    "profile": "Profile to build, start, test and remove (default: the target's default_profile)",
    "suite": "Suite file (default: the target's smoke.suite)",
    "tags": "Comma-separated tags to run (default: the target's smoke.tags, else dummy-ok)",
    "base": "Test the base image with the serving args as flags (no build)",
    "port": "Host port for the server started here (default: a free one)",
    "wait": "With --url: seconds to wait for /health first (default 0)",
    "set_": SET_HELP,
    "junit": "Also write the JUnit XML report to this file",
    "param": "NAME=VALUE: a parameter of the suite (repeatable), e.g. max_context_tokens=131072; --json lists "
             "each parameter's value"})
def smoke(c: Context, cmd: Output, url: str = "", target: str = "", profile: str = "", suite: str = "",
          tags: str = "", base: bool = False, port: int = 0, wait: float = 0.0, set_: list[str] | None = None,
          junit: str = "", param: list[str] | None = None) -> None:
    """Run the smoke suite: against --url, or build + start + test + remove TARGET:PROFILE. Exit 4 on a failure.
    --json lists every check of the suite; those not run (tag not selected, a skip rule) as skipped, with why."""
    def show(report: SmokeReport) -> None:
        if junit and report.junit_path is not None:
            shutil.copyfile(report.junit_path, junit)
        cmd.result(f"smoke: {report.summary_line()}", report.to_json())

    app.smoke(cmd.settings, target or None, profile or None, set_ or [], url=url or None, suite=suite or None,
              tags=tags or None, base=base, port=port or None, wait=wait, show=show, runtime=cmd.runtime,
              params=param or [])


@command(host=True)
def demo(c: Context, cmd: Output) -> None:
    """README command 1: from nothing, make the Docker engine, the cpu base, the cpu image, then smoke it."""
    app.demo(cmd.settings)


# --------------------------------------------------------------------------- bench and sweep

@command(json=True, host=True, in_place=True, workload="bench", iterable=["set_"], optional=["replay"], help={
    "url": "Bench a server that is already running, e.g. http://127.0.0.1:8000",
    "replay": "The evaluator's replay instead: one request at a time, its metrics and target lines; bare: a "
              "seeded workload (--requests, --seed) scaled to the max-model-len; --replay FILE: your JSONL",
    "replay_out": "Keep the generated replay workload here (default: replay.jsonl in the run directory)",
    "max_model_len": "Scale the generated replay to this max-model-len (default: the server's)",
    "planned_output": "Replay: add max_tokens = the planned output to requests without a limit (default on; "
                      "--no-planned-output sends the bodies as they are, for real weights)",
    "require_targets": "Replay: exit 4 when one of the organisers' targets does not PASS (the target's replay.gate "
                       "redlines always gate)",
    "sample": "Replay FILE: about N requests of whole sessions, stratified (--seed picks them), and the full "
              "replay's predicted score, rates and wall time with 95 % intervals",
    "passes": "Replay --sample: run the sample R times, each on a prefix cache of its own; the spread between the "
              "passes (the machine's run-to-run spread) goes into the intervals (default 1: it is not in them)",
    "time_cap": "Replay: stop this many seconds after the first request; requests not started add nothing "
                "(default: the target's replay.time_cap, bi100 13 h; else --duration)",
    "target": TARGET_HELP + "; with --url --replay: only its replay: settings (time cap, gating redlines)",
    "profile": "Profile to build, start, bench and remove (default: the target's default_profile)",
    "set_": SET_HELP,
    "port": "Host port for the server started here (default: a free one)"})
def bench(c: Context, cmd: Output, url: str = "", target: str = "", profile: str = "",
          set_: list[str] | None = None, port: int = 0, replay: str = "", replay_out: str = "",
          max_model_len: int = 0, planned_output: bool = True, require_targets: bool = False,
          time_cap: float = 0, sample: int = 0, passes: int = 1, workload: Workload | None = None) -> None:
    """Load-test --url, or build + serve + bench + remove TARGET:PROFILE: TPS, score, latencies. Exit 4 on failure.

    --replay: the evaluator's workload one request at a time, its metrics (weighted_tps: the platform's score),
    its redlines with their sources, bench.json + PNG.
    Workload options also answer to `vllm bench serve`'s names: --num-prompts, --max-concurrency,
    --random-input-len, --random-output-len, --request-rate (Poisson arrivals); the report adds p99s and ITL."""
    from ..bench import replay_options

    w = workload or Workload()
    options = replay_options(replay, replay_out, requests=w.requests, seed=w.seed, max_model_len=max_model_len,
                             planned_output=planned_output, duration=w.duration, timeout=w.timeout,
                             max_error_rate=w.max_error_rate, require_targets=require_targets,
                             time_cap=time_cap, sample=sample, passes=passes)

    def show(result: Any) -> None:  # before the verdict: the JSON document also when the bench fails
        if options:
            cmd.result("\n".join(result.lines()), result.to_json()["report"], logged=True)
        else:
            cmd.result(None, result.summary())  # text: the table is already on stdout (print_bench)

    app.bench(cmd.settings, target or None, profile or None, set_ or [], url=url or None, port=port or None,
              workload=w, replay=options, show=show, runtime=cmd.runtime)


@command(json=True, host=True, in_place=True, workload="sweep", iterable=["param", "set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile the points start from (default: the target's default_profile)",
    "param": "KEY=V1,V2,...: a serving value to sweep (e.g. max-num-seqs=1,4,8); repeatable (all combinations)",
    "set_": "Override a value for every point: KEY=VALUE; repeatable",
    "interleave": "With --repeat > 1: every point's server up at once, rounds of one run per point in rotating "
                  "order, paired ratios to the first point (default on; --no-interleave: one point after the "
                  "other)"})
def sweep(c: Context, cmd: Output, target: str = "", profile: str = "", param: list[str] | None = None,
          set_: list[str] | None = None, interleave: bool = True, workload: Workload | None = None) -> None:
    """For each --param combination: build (config layer only), serve, bench, remove; table, sweep.json/.md/.png."""
    w = workload or Workload()
    requests_given, concurrency_given = bool(w.requests), bool(w.concurrency)  # 0: from the swept values
    defaults = Workload()
    w = dataclasses.replace(w, requests=w.requests or defaults.requests,
                            concurrency=w.concurrency or defaults.concurrency)
    result = app.sweep(cmd.settings, target or None, profile or None, param or [], set_ or [], workload=w,
                       interleave=interleave, requests_given=requests_given, concurrency_given=concurrency_given,
                       runtime=cmd.runtime)
    cmd.result(None, result.to_json())


# --------------------------------------------------------------------------- accuracy gate, forensics


@command(json=True, host=True, in_place=True, iterable=["set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile under test (default: the target's default_profile)",
    "against": "Reference: base (the target's base image, nothing patched; default), a PROFILE, an IMAGE, or a "
               "record FILE (equiv --record)",
    "record": "Serve only the reference and write its teacher-forced evidence to FILE (compare later with "
              "--against FILE)",
    "url": "With --record FILE: record a server that is already running, e.g. http://127.0.0.1:8000 (nothing "
           "applied, started or stopped; it must compute in --dtype)",
    "dtype": "float32 or bfloat16 on both sides (default: the target's equiv.dtype, else float32)",
    "top_k": "prompt_logprobs per position (default: the target's equiv.top_k)",
    "greedy_tokens": "Greedy continuation tokens, for the first divergence (default: equiv.greedy_tokens)",
    "prompts": "Use only the first N prompts of the target's equiv prompt set (default: all)",
    "set_": SET_HELP})
def equiv(c: Context, cmd: Output, target: str = "", profile: str = "", against: str = "base", dtype: str = "",
          top_k: int = 0, greedy_tokens: int = 0, prompts: int = 0, set_: list[str] | None = None,
          record: str = "", url: str = "") -> None:
    """Accuracy gate: serve TARGET:PROFILE and the reference at once, compare teacher-forced logprobs. Exit 4 over.

    One server at a time: --record FILE keeps the reference's evidence (--url: of a running server), --against
    FILE compares with it."""
    result = app.equiv(cmd.settings, target or None, profile or None, set_ or [], against=against, dtype=dtype,
                       top_k=top_k, greedy_tokens=greedy_tokens, prompts=prompts, record=record, url=url,
                       runtime=cmd.runtime, show=lambda r: cmd.result(r.text(), r.to_json(), logged=True))
    if result is None:  # --record: the evidence file is the result
        cmd.result(f"RECORD={record}", {"record": record})


@command(json=True, host=True, in_place=True, iterable=["check", "set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile whose steps are searched (default: the target's default_profile)",
    "check": "Smoke check id to bisect on (repeatable), or 'equiv' for the accuracy gate",
    "suite": "Suite file whose checks (with --tags) are run instead (default: the target's smoke.suite)",
    "tags": "Comma-separated tags selecting the suite's checks (default: the target's smoke.tags)",
    "repeat": "Runs per probed point; the flip rate is reported (default 1)",
    "flaky": "A point that flips: 'fail' (counts as failing, default) or 'unknown'",
    "set_": SET_HELP})
def bisect(c: Context, cmd: Output, target: str = "", profile: str = "", check: list[str] | None = None,
           suite: str = "", tags: str = "", repeat: int = 1, flaky: str = "fail",
           set_: list[str] | None = None) -> None:
    """Find the first step whose image fails --check (or the suite), by binary search over the steps. Exit 4 if one."""
    app.bisect(cmd.settings, target or None, profile or None, set_ or [], check=check or [], suite=suite,
               tags=tags, repeat=repeat, flaky=flaky, runtime=cmd.runtime,
               show=lambda r: cmd.result(r.text(), r.to_json(), logged=True))


@command(json=True, host=True, in_place=True, workload="ablate", iterable=["set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile of the full image (default: the target's default_profile)",
    "steps": "Comma-separated step ids to ablate (default: every step not marked required)",
    "repeat": "ABAB rounds per variant: full, variant, full, variant ... (default 3)",
    "out": "Directory for ablate.txt/.json/.csv (default: the run directory)",
    "no_equiv": "Do not compare each variant with the full image by equiv",
    "set_": SET_HELP})
def ablate(c: Context, cmd: Output, target: str = "", profile: str = "", steps: str = "", repeat: int = 3,
           out: str = "", no_equiv: bool = False, set_: list[str] | None = None,
           workload: Workload | None = None) -> None:
    """For each step: the image without it, benched ABAB against the full image, and its equiv verdict; a table.

    --in-place: one server at a time on this machine (full, each variant, full)."""
    result = app.ablate(cmd.settings, target or None, profile or None, set_ or [], workload=workload or Workload(),
                        steps=steps, repeat=repeat, out=out, equiv=not no_equiv, runtime=cmd.runtime)
    cmd.result(result.text(), result.to_json(), logged=True)


# --------------------------------------------------------------------------- what the platform builds


@command(json=True, iterable=["set_"], help={
    "target": TARGET_HELP, "profile": PROFILE_HELP,
    "out": "Directory of the tree (written, or with --check read)",
    "check": "Only compare the tree at --out with the manifest (files, hashes, yaml argv/env, bash -n, LF); exit 2",
    "git": "git init (once) and commit the written tree, ready to push as the submission repository",
    "set_": SET_HELP})
def submission(c: Context, cmd: Output, out: str = "", target: str = "", profile: str = "", check: bool = False,
               git: bool = False, set_: list[str] | None = None) -> None:
    """Write the tree the platform builds: root Dockerfile, computility-run.yaml, context; --check an existing one."""
    if not out:
        raise ConfigError("submission needs --out DIR (the tree to write, or with --check to read)")
    if check and git:
        raise ConfigError("submission: --check only reads the tree; --git writes it", hint="drop one of them")
    log = cmd.log if cmd.as_json else cmd.line  # the lines are the text result
    if check:
        files = app.check_submission(cmd.settings, target or None, profile or None, set_ or [], out=out, log=log)
        cmd.result(None, {"out_dir": out, "ok": True, "files_checked": files})
    else:
        result = app.submission(cmd.settings, target or None, profile or None, set_ or [], out=out, git=git,
                                log=log)
        cmd.result(None, result.to_json())


@command(json=True, manifest=False, help={
    "python": "CPython version of the machine it is for (default 3.10: the card's box)",
    "out": "Folder to write (default: .imageforge/wheelhouse/cpXY); emptied when it holds an earlier one"})
def wheels(c: Context, cmd: Output, python: str = "3.10", out: str = "") -> None:
    """Offline wheelhouse for a box without PyPI: wheels, hashed requirements.txt, <= 4 MB parts + their joiner."""
    tag = "cp" + python.replace(".", "")
    result = app.wheels(python, out or str(Path(".imageforge") / "wheelhouse" / tag))
    cmd.result(result.text(), result.to_json())


@command(json=True, manifest=False)
def engine(c: Context, cmd: Output) -> None:
    """Make the Docker engine answer: the docker CLI's endpoint (DOCKER_HOST, else the current docker context);
    on this machine's socket installs docker.io and starts dockerd when none answers."""
    info = app.engine(log=cmd.log)
    cmd.result(f"Docker {info['server_version']} ({info['os']}/{info['arch']}) at {info['endpoint']} "
               f"({info['source']}, {'local' if info['local'] else 'remote'})", info)


# ----------------------------------------------------------------- in place (no Docker): apply, revert, status


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@command(json=True, help={
    "target": TARGET_HELP, "profile": PROFILE_HELP,
    "in_place": "Apply to this machine's files (the only mode: images are made by `build`)",
    "root": "The file system root to apply under (default /)",
    "python": "The target's interpreter (default: python3 on PATH); its package is the one patched",
    "steps": "Only these step ids (comma-separated)", "skip": "Every step but these (comma-separated)",
    "dry_run": "Write nothing; print what each step would do (check-patches' table)",
    "no_imports": "Skip the import check of verify (e.g. no torch on this machine)",
    "force": "Go on past drifted files (their copies are kept aside)"})
def apply(c: Context, cmd: Output, target: str = "", profile: str = "", in_place: bool = False, root: str = "/",
          python: str = "python3", steps: str = "", skip: str = "", dry_run: bool = False, no_imports: bool = False,
          force: bool = False) -> None:
    """Apply TARGET:PROFILE's steps to this machine's files (--in-place), journaled; `revert` undoes them."""
    if not in_place:
        raise ConfigError("apply works in place only: give --in-place", hint="images are made by `build`")
    report = app.apply(cmd.settings, target or None, profile or None, root=root, python=python,
                                steps=_ids(steps), skip=_ids(skip), dry_run=dry_run, imports=not no_imports,
                                force=force, show=lambda _text: None, log=cmd.log)
    cmd.result(report.text(), report.to_json())
    if dry_run and not report.ok:
        raise BuildError(f"{len(report.failed)} step(s) would not apply in place")


@command(json=True, help={
    "action": "build: run the native step's `build:` here, check and import what it made, rewrite its pins",
    "target": "Target whose native step is built", "step": "The native step's id",
    "check": "Compare the fresh build's sha256 with the pins only (exit 3 when one differs); rewrite nothing",
    "in_place": SHARED_HELP["in_place"], "root": SHARED_HELP["root"], "python": SHARED_HELP["python"]})
def native(c: Context, cmd: Output, action: str = "", target: str = "", step: str = "", check: bool = False,
           in_place: bool = False, root: str = "", python: str = "") -> None:
    """Native extensions on the card's machine: `native build --target T --step ID --in-place [--check]`."""
    if action != "build":
        raise ConfigError(f"unknown native action {action!r}", expected="build", found=action or "nothing")
    if not in_place:
        raise ConfigError("native build runs on the machine with the compiler and the device: give --in-place",
                          hint="the image build never compiles: it installs the pinned files")
    if not step:
        raise ConfigError("native build needs --step ID (the native step)")
    report = app.native_build(cmd.settings, target or None, step, root=root or "/", python=python or "python3",
                              check=check, log=cmd.log)
    cmd.result(report.text(), report.to_json())
    if not report.ok:
        raise BuildError(f"native step {step}: " + ("a pin differs from the fresh build" if not report.findings
                                                    else f"{len(report.findings)} finding(s)"))


@command(json=True, manifest=False, help={"root": "The root an in-place apply changed (default /)",
                                          "force": "Go on past drifted files (their copies are kept aside)"})
def revert(c: Context, cmd: Output, root: str = "/", force: bool = False) -> None:
    """Put back every file an in-place apply changed (bytes, mode, owner, mtime, links) and remove its journal."""
    report = app.revert(cmd.settings, root=root, force=force, log=cmd.log)
    cmd.result(report.text(), report.to_json())


@command(json=True, manifest=False, help={"root": "The root an in-place apply changed (default /)"})
def status(c: Context, cmd: Output, root: str = "/") -> None:
    """What is applied in place (journal), drift, and the package against its dist-info RECORD (exit 3: not ok)."""
    report = app.status(cmd.settings, root=root)
    cmd.result(report.text(), report.to_json())
    if not report.ok:
        raise BuildError("the in-place status is not clean (drift, or package files changed outside the journal)")


TASKS: tuple[Task[Any], ...] = (validate, plan, base, build, init, check_patches, preflight, probe, patch_from, lock,
                                 export, clean, run, stop, smoke, demo, bench, sweep, equiv, bisect, ablate, submission,
                                 wheels, engine, apply, native, revert, status)


def collection(*extra: Task[Any]) -> Collection:
    """The command's task collection (plus ``extra`` tasks: the repository's tasks.py adds `test`)."""
    c = Collection(*TASKS, *extra)
    c.configure({"run": {"echo": True}})
    return c


ns = collection()
os.environ.setdefault("PYTHONUNBUFFERED", "1")


#: Tasks whose first word is an action (``native build``): invoke reads a word that names a task (``build``) as that
#: task, so the word is given to the task as its ``--action`` before invoke parses.
ACTIONS: dict[str, tuple[str, ...]] = {"native": ("build",)}


def with_actions(argv: list[str]) -> list[str]:
    """``argv`` with ``TASK ACTION`` (a task of :data:`ACTIONS` and one of its words) as ``TASK --action=ACTION``."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word in ACTIONS and out[i + 1] in ACTIONS[word]:
            out[i + 1] = f"--action={out[i + 1]}"
            break
    return out


class ForgeProgram(Program):
    """invoke's Program, with the action words of :data:`ACTIONS` read as the task's ``--action``."""

    def run(self, argv: list[str] | str | None = None, exit: bool = True) -> None:
        if argv is None:
            argv = sys.argv
        if isinstance(argv, str):
            argv = argv.split()
        super().run(with_actions(list(argv)), exit)


def program(namespace: Collection | None = None) -> Program:
    """invoke's Program over the collection, named `imageforge` (what `main` runs)."""
    return ForgeProgram(namespace=namespace or ns, version=__version__, name="imageforge", binary="imageforge")


def main() -> None:
    """The `imageforge` console command (a reader closing stdout ends it quietly, also in invoke's own listings).

    The console script enters through :func:`imageforge.cli.launch.main` (the caller's PYTHONPATH dropped first)."""
    with contextlib.suppress(Exit), closed_pipe_quiet():
        program().run()
        return
    sys.exit(EXIT_CLOSED_PIPE)
