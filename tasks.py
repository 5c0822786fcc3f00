"""imageforge: one YAML manifest -> a patched, layered, smoke-tested vLLM serving image.

Thin invoke shell over the imageforge library: each task parses its options and calls one
function of the front door, `imageforge.app`. Run `invoke --list`, or `invoke --help TASK` for a
task's options.
Exit codes: 0 ok, 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.tasks import Task
from invoke.tasks import task as _invoke_task

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from imageforge import app  # noqa: E402
from imageforge.cli import user_errors  # noqa: E402
from imageforge.errors import ConfigError  # noqa: E402


class ForgeTask(Task[Any]):
    """invoke's Task with explicit short flags (``short={"output_tokens": "O"}``).

    invoke picks each option's short flag from the letters of its name, first free one first; for
    a dashed name whose letters are all taken it would pick "-" (``--=INT`` in the help). Here "-"
    is never picked (such an option has only its long name) and explicit short flags are reserved
    before any automatic choice.
    """

    def __init__(self, body: Callable[..., Any], *, short: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        self.short = dict(short or {})
        super().__init__(body, **kwargs)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        taken_names.update(self.short.values())
        taken_names.add("-")
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        if name in self.short:
            opts["names"] = [opts["names"][0], self.short[name]]
        return opts


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], ForgeTask]:
    """``invoke.task(...)`` making :class:`ForgeTask` objects (``short=`` is passed on to them)."""
    decorator: Callable[[Callable[..., Any]], ForgeTask] = _invoke_task(klass=ForgeTask, **kwargs)
    return decorator


TARGET_HELP = "Target name (default: the manifest's default_target)"
PROFILE_HELP = "Profile name (default: the target's default_profile)"
SET_HELP = "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable"
MANIFEST_HELP = "Manifest file (default: $IMAGEFORGE_MANIFEST or ./build.yaml)"
TRACEBACK_HELP = "Show Python tracebacks (also IMAGEFORGE_TRACEBACK=1)"
#: In-place mode (issue 21): the target's files under --root, served as a process (no Docker).
IN_PLACE_HELP = {
    "in_place": "On this machine, no Docker: serve the target's files under --root as a process",
    "root": "In-place: the root the target's files live under (default /)",
    "python": "In-place: the target's interpreter (default python3 on PATH)",
}
HOST_ADDRESS_HELP = (
    "Address of the Docker host where ports are published and reached "
    "(default 127.0.0.1; also IMAGEFORGE_HOST_ADDRESS)"
)
#: The options that pick what is resolved, shared by plan and build.
RESOLVE_HELP = {"target": TARGET_HELP, "profile": PROFILE_HELP, "set_": SET_HELP, "manifest": MANIFEST_HELP,
                "traceback": TRACEBACK_HELP}


@task(
    help={"manifest": MANIFEST_HELP, "json": "Print one JSON object", "traceback": TRACEBACK_HELP},
)
def validate(c: Context, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Check the manifest: YAML, schema, files, paths, profiles of every target. No daemon needed."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        summary = app.validate(s)
        _print(summary.to_json() if json else summary.text(), json)


@task(iterable=["set_"], help={**RESOLVE_HELP, "json": "Print one JSON object",
                                "no_daemon": "Do not ask the Docker daemon for cache state"})
def plan(c: Context, target: str = "", profile: str = "", set_: list[str] | None = None, manifest: str = "",
         json: bool = False, no_daemon: bool = False, traceback: bool = False) -> None:
    """Show every resolved value (and where it came from), the ordered steps, cache keys and HIT/MISS."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        result = app.plan(s, target or None, profile or None, set_ or [], use_daemon=not no_daemon)
        _print(result.to_json() if json else result.text(), json)


@task(help={"unit": "Only the fast tests (no Docker daemon)", "k": "pytest -k expression",
            "lint": "Run ruff and mypy first (default true)"})
def test(c: Context, unit: bool = False, k: str = "", lint: bool = True) -> None:
    """Lint, type-check and run the tests (sets up the Docker engine and base images first)."""
    py = sys.executable
    if lint:
        lint_paths = [p for p in ("src", "tests", "tasks.py", "bench", "benchmarks", "overlays", "images")
                      if (ROOT / p).exists()]  # ruff fails on a path that is not there
        c.run(f"{py} -m ruff check {' '.join(lint_paths)}", pty=False)
        c.run(f"{py} -m mypy", pty=False)
    paths = "tests/unit tests/overlays" if unit else "tests"
    if not unit:
        with user_errors():
            app.base(app.settings(manifest=str(ROOT / "build.yaml")), "cpu")
    selector = f" -k {json_quote(k)}" if k else ""
    c.run(f"{py} -m pytest {paths}{selector}", pty=False)


@task(help={"target": "Target whose recipe base image to make (default: cpu)", "manifest": MANIFEST_HELP,
            "traceback": TRACEBACK_HELP})
def base(c: Context, target: str = "cpu", manifest: str = "", traceback: bool = False) -> None:
    """Make the target's base image from its recipe (OS image, wheelhouse, vLLM venv) and its model."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        ref = app.base(s, target)
        print(f"BASE={ref}")


@task(iterable=["set_"], help={
    **RESOLVE_HELP, "verbose": "Show script and verification output live", "json": "Print a JSON summary at the end",
    "locked": "Fail (exit 2, nothing built) when anything differs from build.lock (see `invoke lock`)"})
def build(c: Context, target: str = "", profile: str = "", set_: list[str] | None = None, manifest: str = "",
          verbose: bool = False, json: bool = False, locked: bool = False, traceback: bool = False) -> None:
    """Build (or reuse from cache) every layer of TARGET:PROFILE, verify it, then move its tags."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        result = app.build(s, target or None, profile or None, set_ or [], verbose=verbose, quiet=json,
                           locked=locked)
        if json:
            _print(result.to_json(), True)


# --------------------------------------------------------------------------- issue 5: tools around the engine


@task(
    help={
        "target": TARGET_HELP,
        "profile": "Only this profile's steps (default: the shared steps and every profile's)",
        "diff": "Print the unified diff each step would make",
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "traceback": TRACEBACK_HELP,
    },
)
def check_patches(c: Context, target: str = "", profile: str = "", diff: bool = False, manifest: str = "",
                  json: bool = False, traceback: bool = False) -> None:
    """Dry-run every patch/overlay/symlink step against the real base image (nothing built). Exit 3 if any fails."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        app.check_patches(s, target or None, profile or None, diff=diff,
                          show=lambda report: _print(report.to_json() if json else report.text(), json))


@task(
    help={
        "target": TARGET_HELP,
        "file": "The file in the image: relative to the package's site directory (vllm/...) or absolute",
        "edited": "Your edited copy of that file (local path)",
        "base_only": "Diff against the base image's file, not the file after the target's existing steps",
        "id_prefix": "Step id prefix (default: the file's name)",
        "manifest": MANIFEST_HELP,
        "traceback": TRACEBACK_HELP,
    },
)
def patch_from(c: Context, file: str, edited: str, target: str = "", base_only: bool = False, id_prefix: str = "",
               manifest: str = "", traceback: bool = False) -> None:
    """Print the fewest anchored `patch` steps (YAML to paste) that turn an image file into EDITED."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        result = app.patch_from(s, target or None, file, edited, against_base=base_only, id_prefix=id_prefix)
        print(result.yaml, end="")


@task(help={"target": TARGET_HELP, "manifest": MANIFEST_HELP,
            "traceback": TRACEBACK_HELP})
def lock(c: Context, target: str = "", manifest: str = "", traceback: bool = False) -> None:
    """Write build.lock: base image ID, package version, overlay/script sha256, manifest digest."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        path, entry = app.lock(s, target or None)
        print(f"locked {path}: base {entry['base']['reference']} ({entry['base']['image_id']}), "
              f"{entry['package']['distribution']} {entry['package']['version']}, "
              f"{len(entry['inputs'])} input(s), manifest {entry['manifest_digest'][:12]}")


@task(
    help={
        "target": TARGET_HELP,
        "profile": PROFILE_HELP,
        "out": "Output directory (default: <manifest dir>/dist)",
        "gzip": "Compress the tarball (gzip -1)",
        "push": "Also push to this repository (e.g. 127.0.0.1:5000/imageforge/cpu); credentials from Docker's config",
        "no_save": "Do not write the tarball (with --push: push only)",
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "traceback": TRACEBACK_HELP,
    },
)
def export(c: Context, target: str = "", profile: str = "", out: str = "", gzip: bool = False, push: str = "",
           no_save: bool = False, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """The deliverable: `docker save` tarball + .sha256 + .json description of TARGET:PROFILE; --push REPO."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        result = app.export(s, target or None, profile or None, out=out or None, push=push or None, gzip_=gzip,
                            save=not no_save, quiet=json)
        _print(result.to_json() if json else result.text(), json)


@task(
    help={
        "keep": "Final images kept per target/profile, newest first (default 3)",
        "dry_run": "Only print what would be removed",
        "target": "Only this target (default: every target of the manifest)",
        "min_age": "Never remove images or stopped containers younger than this many seconds (default 600)",
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "traceback": TRACEBACK_HELP,
    },
)
def clean(c: Context, keep: int = 3, dry_run: bool = False, target: str = "", min_age: float = 600.0,
          manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Remove labelled build images and containers that no retention rule keeps; print what was freed."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        result = app.clean(s, keep=keep, dry_run=dry_run, target=target or None, min_age=min_age)
        _print(result.to_json() if json else result.text(), json)


# --------------------------------------------------------------------------- issues 6-7: run, stop, smoke, demo


@task(
    iterable=["set_"],
    help={
        "target": TARGET_HELP,
        "profile": "Profile name (default: the target's default_profile); built first if needed",
        "base": "Run the base image with the serving args as `vllm serve` flags (no build)",
        "port": "Host port on 127.0.0.1 (default: run.port when free, else a free one)",
        "set_": SET_HELP,
        "timeout": "Seconds to wait for /health (default: the target's smoke.startup_timeout)",
        "manifest": MANIFEST_HELP,
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def run(c: Context, target: str = "", profile: str = "", base: bool = False, port: int = 0,
        set_: list[str] | None = None, timeout: float = 0.0, manifest: str = "", host_address: str = "",
        traceback: bool = False, in_place: bool = False, root: str = "", python: str = "") -> None:
    """Start TARGET's server on 127.0.0.1, wait until /health answers, leave it running; prints URL=..."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        where = app.in_place(s, enabled=in_place, root=root, python=python)
        server = app.run(s, target or None, profile or None, set_ or [], base=base, port=port or None,
                         timeout=timeout or None, in_place=where)
        if where is not None:
            print(f"pid {server.name.removeprefix('pid ')} ({server.image}) is serving; log "
                  f"{server.run_dir / 'server.log'}; `invoke stop --in-place` ends it")
        else:
            print(f"container {server.name} ({server.image}) is serving; `invoke stop` removes it")
        print(f"URL={server.url}")


@task(help={"target": "Only this target's servers (default: all)",
            "all": "Also servers left by interrupted smoke runs or tests", "traceback": TRACEBACK_HELP,
            "in_place": "End the server processes `run --in-place` recorded (TERM, then KILL); no Docker",
            "manifest": MANIFEST_HELP})
def stop(c: Context, target: str = "", all: bool = False, traceback: bool = False, in_place: bool = False,
         manifest: str = "") -> None:
    """Stop and remove the server containers `invoke run` started (found by label); --in-place: its processes."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        app.stop(target or None, every=all, s=s, in_place=in_place)


@task(
    iterable=["set_"],
    help={
        "url": "Test a server that is already running, e.g. http://127.0.0.1:8000",
        "target": "Target name (default: the manifest's default_target); names the suite and tags",
        "profile": "Profile to build, start, test and remove (default: the target's default_profile)",
        "suite": "Suite file (default: the target's smoke.suite)",
        "tags": "Comma-separated tags to run (default: the target's smoke.tags, else dummy-ok)",
        "base": "Test the base image with the serving args as flags (no build)",
        "port": "Host port for the server started here (default: a free one)",
        "wait": "With --url: seconds to wait for /health first (default 0)",
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def smoke(c: Context, url: str = "", target: str = "", profile: str = "", suite: str = "", tags: str = "",
          base: bool = False, port: int = 0, wait: float = 0.0, set_: list[str] | None = None, manifest: str = "",
          host_address: str = "", traceback: bool = False, in_place: bool = False, root: str = "",
          python: str = "") -> None:
    """Run the smoke suite: against --url, or build + start + test + remove TARGET:PROFILE. Exit 4 on a failure."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        app.smoke(s, target or None, profile or None, set_ or [], url=url or None, suite=suite or None,
                  tags=tags or None, base=base, port=port or None, wait=wait,
                  in_place=app.in_place(s, enabled=in_place, root=root, python=python))


@task(help={"manifest": MANIFEST_HELP, "traceback": TRACEBACK_HELP})
def demo(c: Context, manifest: str = "", traceback: bool = False) -> None:
    """README command 1: from nothing, make the Docker engine, the cpu base, the cpu image, then smoke it."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        app.demo(s)


# --------------------------------------------------------------------------- bench and sweep

WORKLOAD_HELP = {
    "requests": "Requests to send (default 32; sweep: 4 x concurrency)",
    "concurrency": "Requests in flight at once (default 8; sweep: the largest max-num-seqs swept)",
    "prompt_tokens": "Prompt length in tokens (default 256)",
    "output_tokens": "Generated tokens per request, forced with min_tokens + ignore_eos (default 64)",
    "shared_prefix": "Fraction of each prompt shared by all requests, for the prefix cache (default 0.5)",
    "seed": "Seed of the prompts (default 0; the same seed sends the same prompts)",
    "api": "completions (token-ID prompts, exact lengths) or chat (default completions)",
    "model": "Model name (default: the first of /v1/models)",
    "duration": "Stop the bench (all repeats) after this many seconds even if requests remain (default 300)",
    "timeout": "Seconds per request (default 120)",
    "warmup": "Unmeasured warm-up requests first (default 1)",
    "max_error_rate": "Fail (exit 4) above this fraction of failed requests (default 0)",
    "repeat": "Runs on the same server (seeds seed, seed+1 ...); the median by score is reported (default 1)",
}


@task(
    iterable=["set_"],
    short={"output_tokens": "O"},  # invoke would pick "-" (all its letters are taken)
    optional=["replay"],
    help={
        "url": "Bench a server that is already running, e.g. http://127.0.0.1:8000",
        "replay": "The evaluator's replay instead: one request at a time, its metrics and target lines; bare: a "
                  "seeded workload (--requests, --seed) scaled to the max-model-len; --replay FILE: your JSONL",
        "replay_out": "Keep the generated replay workload here (default: replay.jsonl in the run directory)",
        "max_model_len": "Scale the generated replay to this max-model-len (default: the server's)",
        "planned_output": "Replay: add max_tokens = the planned output to requests without a limit (default on; "
                          "--no-planned-output sends the bodies as they are, for real weights)",
        "require_targets": "Replay: exit 4 when an evaluator target line does not PASS",
        "target": TARGET_HELP,
        "profile": "Profile to build, start, bench and remove (default: the target's default_profile)",
        "set_": SET_HELP,
        "port": "Host port for the server started here (default: a free one)",
        **WORKLOAD_HELP,
        "manifest": MANIFEST_HELP,
        "json": "Print bench.json's summary as one JSON object at the end",
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def bench(c: Context, url: str = "", target: str = "", profile: str = "", set_: list[str] | None = None,
          port: int = 0, requests: int = 32, concurrency: int = 8, prompt_tokens: int = 256, output_tokens: int = 64,
          shared_prefix: float = 0.5, seed: int = 0, api: str = "completions", model: str = "",
          duration: float = 300.0, timeout: float = 120.0, warmup: int = 1, max_error_rate: float = 0.0,
          repeat: int = 1, replay: str = "", replay_out: str = "", max_model_len: int = 0,
          planned_output: bool = True, require_targets: bool = False, manifest: str = "", json: bool = False,
          host_address: str = "", traceback: bool = False, in_place: bool = False, root: str = "",
          python: str = "") -> None:
    """Load-test --url, or build + serve + bench + remove TARGET:PROFILE: TPS, score, latencies. Exit 4 on failure.

    --replay: the evaluator's workload one request at a time, its metrics and PASS/FAIL lines, bench.json + PNG."""
    from imageforge.bench import replay_options

    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        workload = (requests, concurrency, prompt_tokens, output_tokens, shared_prefix, seed, api, model, duration,
                    timeout, warmup, max_error_rate, repeat)
        options = replay_options(replay, replay_out, requests=requests, seed=seed, max_model_len=max_model_len,
                                 planned_output=planned_output, duration=duration, timeout=timeout,
                                 max_error_rate=max_error_rate, require_targets=require_targets)
        result = app.bench(s, target or None, profile or None, set_ or [], url=url or None, port=port or None,
                           workload=workload, replay=options,
                           in_place=app.in_place(s, enabled=in_place, root=root, python=python))
        if json:
            _print(result.to_json()["report"] if options else result.summary(), True)


@task(
    iterable=["param", "set_"],
    short={"host_address": "H"},  # invoke would pick "-" (all its letters are taken)
    help={
        "target": TARGET_HELP,
        "profile": "Profile the points start from (default: the target's default_profile)",
        "param": "KEY=V1,V2,...: a serving value to sweep (e.g. max-num-seqs=1,4,8); repeatable (all combinations)",
        "set_": "Override a value for every point: KEY=VALUE; repeatable",
        **WORKLOAD_HELP,
        "interleave": "With --repeat > 1: every point's server up at once, rounds of one run per point in rotating "
                      "order, paired ratios to the first point (default on; --no-interleave: one point after the "
                      "other)",
        "manifest": MANIFEST_HELP,
        "json": "Print sweep.json as one JSON object at the end",
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def sweep(c: Context, target: str = "", profile: str = "", param: list[str] | None = None,
          set_: list[str] | None = None, requests: int = 0, concurrency: int = 0, prompt_tokens: int = 256,
          output_tokens: int = 64, shared_prefix: float = 0.5, seed: int = 0, api: str = "completions",
          model: str = "", duration: float = 300.0, timeout: float = 120.0, warmup: int = 1,
          max_error_rate: float = 0.0, repeat: int = 1, interleave: bool = True, manifest: str = "",
          json: bool = False, host_address: str = "", traceback: bool = False, in_place: bool = False,
          root: str = "", python: str = "") -> None:
    """For each --param combination: build (config layer only), serve, bench, remove; table, sweep.json/.md/.png."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        workload = (requests, concurrency, prompt_tokens, output_tokens, shared_prefix, seed, api, model, duration,
                    timeout, warmup, max_error_rate, repeat)
        result = app.sweep(s, target or None, profile or None, param or [], set_ or [], workload=workload,
                           requests_given=bool(requests), concurrency_given=bool(concurrency), interleave=interleave,
                           in_place=app.in_place(s, enabled=in_place, root=root, python=python))
        if json:
            _print(result.to_json(), True)


# --------------------------------------------------------------------------- issue 15: accuracy gate, forensics


@task(
    iterable=["set_"],
    short={"top_k": "k", "prompts": "n"},  # invoke would pick -o and -r
    help={
        "target": TARGET_HELP,
        "profile": "Profile under test (default: the target's default_profile)",
        "against": "Reference: base (the target's base image, nothing patched; default), a PROFILE, an IMAGE, or a "
                   "record FILE (equiv --record)",
        "dtype": "float32 or bfloat16 on both sides (default: the target's equiv.dtype, else float32)",
        "top_k": "prompt_logprobs per position (default: the target's equiv.top_k)",
        "greedy_tokens": "Greedy continuation tokens, for the first divergence (default: equiv.greedy_tokens)",
        "prompts": "Use only the first N prompts of the target's equiv prompt set (default: all)",
        "record": "Serve only the reference and write its teacher-forced evidence to FILE (compare later with "
                  "--against FILE)",
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def equiv(c: Context, target: str = "", profile: str = "", against: str = "base", dtype: str = "", top_k: int = 0,
          greedy_tokens: int = 0, prompts: int = 0, set_: list[str] | None = None, manifest: str = "",
          host_address: str = "", traceback: bool = False, record: str = "", in_place: bool = False, root: str = "",
          python: str = "") -> None:
    """Accuracy gate: serve TARGET:PROFILE and the reference at once, compare teacher-forced logprobs. Exit 4 over.

    One server at a time: --record FILE keeps the reference's evidence, --against FILE compares with it."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        app.equiv(s, target or None, profile or None, set_ or [], against=against, dtype=dtype, top_k=top_k,
                  greedy_tokens=greedy_tokens, prompts=prompts, record=record,
                  in_place=app.in_place(s, enabled=in_place, root=root, python=python))


@task(
    iterable=["check", "set_"],
    help={
        "target": TARGET_HELP,
        "profile": "Profile whose steps are searched (default: the target's default_profile)",
        "check": "Smoke check id to bisect on (repeatable), or 'equiv' for the accuracy gate",
        "suite": "Suite file whose checks (with --tags) are run instead (default: the target's smoke.suite)",
        "tags": "Comma-separated tags selecting the suite's checks (default: the target's smoke.tags)",
        "repeat": "Runs per probed point; the flip rate is reported (default 1)",
        "flaky": "A point that flips: 'fail' (counts as failing, default) or 'unknown'",
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def bisect(c: Context, target: str = "", profile: str = "", check: list[str] | None = None, suite: str = "",
           tags: str = "", repeat: int = 1, flaky: str = "fail", set_: list[str] | None = None, manifest: str = "",
           host_address: str = "", traceback: bool = False, in_place: bool = False, root: str = "",
           python: str = "") -> None:
    """Find the first step whose image fails --check (or the suite), by binary search over the steps. Exit 4 if one."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        app.bisect(s, target or None, profile or None, set_ or [], check=check or [], suite=suite, tags=tags,
                   repeat=repeat, flaky=flaky, in_place=app.in_place(s, enabled=in_place, root=root, python=python))


ABLATE_WORKLOAD_HELP = {k: v for k, v in WORKLOAD_HELP.items() if k != "repeat"}  # one run per ABAB round


@task(
    iterable=["set_"],
    short={"output_tokens": "O", "host_address": "H"},  # invoke would pick "-" (all their letters are taken)
    help={
        "target": TARGET_HELP,
        "profile": "Profile of the full image (default: the target's default_profile)",
        "steps": "Comma-separated step ids to ablate (default: every step not marked required)",
        "repeat": "ABAB rounds per variant: full, variant, full, variant ... (default 3)",
        "out": "Directory for ablate.txt/.json/.csv (default: the run directory)",
        "no_equiv": "Do not compare each variant with the full image by equiv",
        "set_": SET_HELP,
        **ABLATE_WORKLOAD_HELP,
        "manifest": MANIFEST_HELP,
        "host_address": HOST_ADDRESS_HELP,
        "traceback": TRACEBACK_HELP,
        **IN_PLACE_HELP,
    },
)
def ablate(c: Context, target: str = "", profile: str = "", steps: str = "", repeat: int = 3, out: str = "",
           no_equiv: bool = False, set_: list[str] | None = None, requests: int = 32, concurrency: int = 8,
           prompt_tokens: int = 256, output_tokens: int = 64, shared_prefix: float = 0.5, seed: int = 0,
           api: str = "completions", model: str = "", duration: float = 300.0, timeout: float = 120.0,
           warmup: int = 1, max_error_rate: float = 0.0, manifest: str = "", host_address: str = "",
           traceback: bool = False, in_place: bool = False, root: str = "", python: str = "") -> None:
    """For each step: the image without it, benched ABAB against the full image, and its equiv verdict; a table.

    --in-place: one server at a time on this machine (full, each variant, full)."""
    s = app.settings(manifest=manifest, traceback=traceback, host_address=host_address)
    with user_errors(s.traceback):
        workload = (requests, concurrency, prompt_tokens, output_tokens, shared_prefix, seed, api, model, duration,
                    timeout, warmup, max_error_rate)
        app.ablate(s, target or None, profile or None, set_ or [], workload=workload, steps=steps, repeat=repeat,
                   out=out, equiv=not no_equiv, in_place=app.in_place(s, enabled=in_place, root=root, python=python))


# --------------------------------------------------------------------------- issue 13: what the platform builds


@task(
    iterable=["set_"],
    help={
        "target": TARGET_HELP,
        "profile": PROFILE_HELP,
        "out": "Directory of the tree (written, or with --check read)",
        "check": "Only compare the tree at --out with the manifest (files, hashes, yaml argv/env, bash -n, LF); exit 2",
        "git": "git init (once) and commit the written tree, ready to push as the submission repository",
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "traceback": TRACEBACK_HELP,
    },
)
def submission(c: Context, out: str, target: str = "", profile: str = "", check: bool = False, git: bool = False,
               set_: list[str] | None = None, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Write the tree the platform builds: root Dockerfile, computility-run.yaml, context; --check an existing one."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        if check and git:
            raise ConfigError("submission: --check only reads the tree; --git writes it", hint="drop one of them")
        log = _quiet if json else print
        if check:
            files = app.check_submission(s, target or None, profile or None, set_ or [], out=out, log=log)
            if json:
                _print({"out_dir": out, "ok": True, "files_checked": files}, True)
        else:
            result = app.submission(s, target or None, profile or None, set_ or [], out=out, git=git, log=log)
            if json:
                _print(result.to_json(), True)


def _quiet(_line: str) -> None:
    return None


def json_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _print(payload: object, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(payload)


ns = Collection(validate, plan, base, build, test, check_patches, patch_from, lock, export, clean, run, stop,
                smoke, demo, bench, sweep, equiv, bisect, ablate, submission)
ns.configure({"run": {"echo": True}})
os.environ.setdefault("PYTHONUNBUFFERED", "1")


# ---------------------------------------------------------------- in place (no Docker): apply, revert, status


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@task(help={"target": TARGET_HELP, "profile": "Profile (default: the target's default_profile)",
            "in_place": "Apply to this machine's files (the only mode: images are made by `invoke build`)",
            "root": "The file system root to apply under (default /)",
            "python": "The target's interpreter (default: python3 on PATH); its package is the one patched",
            "steps": "Only these step ids (comma-separated)", "skip": "Every step but these (comma-separated)",
            "dry_run": "Write nothing; print what each step would do (check-patches' table)",
            "no_imports": "Skip the import check of verify (e.g. no torch on this machine)",
            "force": "Go on past drifted files (their copies are kept aside)",
            "manifest": MANIFEST_HELP, "json": "Print one JSON object", "traceback": TRACEBACK_HELP})
def apply(c: Context, target: str = "", profile: str = "", in_place: bool = False, root: str = "/",
          python: str = "python3", steps: str = "", skip: str = "", dry_run: bool = False, no_imports: bool = False,
          force: bool = False, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Apply TARGET:PROFILE's steps to this machine's files (--in-place), journaled; `revert` undoes them."""
    s = app.settings(manifest=manifest, traceback=traceback)
    with user_errors(s.traceback):
        if not in_place:
            raise ConfigError("apply works in place only: give --in-place", hint="images are made by `invoke build`")
        report = app.apply_in_place(s, target or None, profile or None, root=root, python=python,
                                    steps=_ids(steps), skip=_ids(skip), dry_run=dry_run, imports=not no_imports,
                                    force=force, show=_quiet if json else print, log=_quiet if json else print)
        if json:
            _print(report.to_json(), True)
        elif not dry_run:
            print(report.text())
        if dry_run and not report.ok:
            raise SystemExit(3)


@task(help={"root": "The root an in-place apply changed (default /)",
            "force": "Go on past drifted files (their copies are kept aside)", "json": "Print one JSON object",
            "traceback": TRACEBACK_HELP})
def revert(c: Context, root: str = "/", force: bool = False, json: bool = False, traceback: bool = False) -> None:
    """Put back every file an in-place apply changed (bytes, mode, owner, mtime, links) and remove its journal."""
    s = app.settings(traceback=traceback)
    with user_errors(s.traceback):
        report = app.revert(s, root=root, force=force, log=_quiet if json else print)
        _print(report.to_json() if json else report.text(), json)


@task(help={"root": "The root an in-place apply changed (default /)", "json": "Print one JSON object",
            "traceback": TRACEBACK_HELP})
def status(c: Context, root: str = "/", json: bool = False, traceback: bool = False) -> None:
    """What is applied in place (journal), drift, and the package against its dist-info RECORD (exit 3: not ok)."""
    s = app.settings(traceback=traceback)
    with user_errors(s.traceback):
        report = app.status(s, root=root)
        _print(report.to_json() if json else report.text(), json)
        if not report.ok:
            raise SystemExit(3)


ns.add_task(apply)
ns.add_task(revert)
ns.add_task(status)
