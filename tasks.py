"""imageforge: one YAML manifest -> a patched, layered, smoke-tested vLLM serving image.

Thin invoke shell over the imageforge library: each task parses its options and calls one
function. Run `invoke --list`, or `invoke --help TASK` for a task's options.
Exit codes: 0 ok, 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context
from invoke.tasks import task

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from imageforge.cli import user_errors  # noqa: E402

TARGET_HELP = "Target name (default: the manifest's default_target)"
PROFILE_HELP = "Profile name (default: the target's default_profile)"
SET_HELP = "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable"
MANIFEST_HELP = "Manifest file (default: $IMAGEFORGE_MANIFEST or ./build.yaml)"
TRACEBACK_HELP = "Show Python tracebacks (also IMAGEFORGE_TRACEBACK=1)"
HOST_ADDRESS_HELP = (
    "Address of the Docker host where ports are published and reached "
    "(default 127.0.0.1; also IMAGEFORGE_HOST_ADDRESS)"
)


@task(
    help={"manifest": MANIFEST_HELP, "json": "Print one JSON object", "traceback": TRACEBACK_HELP},
)
def validate(c: Context, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Check the manifest: YAML, schema, files, paths, profiles of every target. No daemon needed."""
    from imageforge.resolve import validate_all

    with user_errors(traceback):
        summary = validate_all(manifest or None)
        _print(summary.to_json() if json else summary.text(), json)


@task(
    iterable=["set_"],
    help={
        "target": TARGET_HELP,
        "profile": PROFILE_HELP,
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "no_daemon": "Do not ask the Docker daemon for cache state",
        "traceback": TRACEBACK_HELP,
    },
)
def plan(
    c: Context,
    target: str = "",
    profile: str = "",
    set_: list[str] | None = None,
    manifest: str = "",
    json: bool = False,
    no_daemon: bool = False,
    traceback: bool = False,
) -> None:
    """Show every resolved value (and where it came from), the ordered steps, cache keys and HIT/MISS."""
    from imageforge.plan import plan_for_cli

    with user_errors(traceback):
        result = plan_for_cli(manifest or None, target or None, profile or None, set_ or [], use_daemon=not no_daemon)
        _print(result.to_json() if json else result.text(), json)


@task(help={"unit": "Only the fast tests (no Docker daemon)", "k": "pytest -k expression",
            "lint": "Run ruff and mypy first (default true)"})
def test(c: Context, unit: bool = False, k: str = "", lint: bool = True) -> None:
    """Lint, type-check and run the tests (sets up the Docker engine and base images first)."""
    py = sys.executable
    if lint:
        c.run(f"{py} -m ruff check src tests tasks.py benchmarks bench overlays images", pty=False)
        c.run(f"{py} -m mypy", pty=False)
    paths = "tests/unit tests/overlays" if unit else "tests"
    if not unit:
        from imageforge.build import prepare_base

        with user_errors():
            prepare_base(str(ROOT / "build.yaml"), "cpu")
    selector = f" -k {json_quote(k)}" if k else ""
    c.run(f"{py} -m pytest {paths}{selector}", pty=False)


@task(help={"target": "Target whose recipe base image to make (default: cpu)", "manifest": MANIFEST_HELP,
            "traceback": TRACEBACK_HELP})
def base(c: Context, target: str = "cpu", manifest: str = "", traceback: bool = False) -> None:
    """Make the target's base image from its recipe (OS image, wheelhouse, vLLM venv) and its model."""
    from imageforge.build import prepare_base

    with user_errors(traceback):
        ref = prepare_base(manifest or None, target)
        print(f"BASE={ref}")


@task(
    iterable=["set_"],
    help={
        "target": TARGET_HELP,
        "profile": PROFILE_HELP,
        "set_": SET_HELP,
        "manifest": MANIFEST_HELP,
        "verbose": "Show script and verification output live",
        "json": "Print a JSON summary at the end",
        "locked": "Fail (exit 2, nothing built) when anything differs from build.lock (see `invoke lock`)",
        "traceback": TRACEBACK_HELP,
    },
)
def build(
    c: Context,
    target: str = "",
    profile: str = "",
    set_: list[str] | None = None,
    manifest: str = "",
    verbose: bool = False,
    json: bool = False,
    locked: bool = False,
    traceback: bool = False,
) -> None:
    """Build (or reuse from cache) every layer of TARGET:PROFILE, verify it, then move its tags."""
    from imageforge.build import build_for_cli

    with user_errors(traceback):
        result = build_for_cli(manifest or None, target or None, profile or None, set_ or [], verbose=verbose,
                               quiet=json, locked=locked)
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
    from imageforge.checkpatches import check_patches_for_cli, fail_if_broken

    with user_errors(traceback):
        report = check_patches_for_cli(manifest or None, target or None, profile or None, diff=diff)
        _print(report.to_json() if json else report.text(), json)
        fail_if_broken(report)


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
    from imageforge.checkpatches import patch_from_for_cli

    with user_errors(traceback):
        result = patch_from_for_cli(manifest or None, target or None, file, edited, against_base=base_only,
                                    id_prefix=id_prefix)
        print(result.yaml, end="")


@task(help={"target": TARGET_HELP, "manifest": MANIFEST_HELP,
            "traceback": TRACEBACK_HELP})
def lock(c: Context, target: str = "", manifest: str = "", traceback: bool = False) -> None:
    """Write build.lock: base image ID, package version, overlay/script sha256, manifest digest."""
    from imageforge.housekeeping import write_lock

    with user_errors(traceback):
        path, entry = write_lock(manifest or None, target or None)
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
    from imageforge.export import export as do_export

    with user_errors(traceback):
        result = do_export(manifest or None, target or None, profile or None, out=out or None, push=push or None,
                           gzip_=gzip, save=not no_save, log=(lambda _l: None) if json else print)
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
    from imageforge.housekeeping import clean as do_clean

    with user_errors(traceback):
        result = do_clean(manifest or None, keep=keep, dry_run=dry_run, target=target or None, min_age=min_age)
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
    },
)
def run(c: Context, target: str = "", profile: str = "", base: bool = False, port: int = 0,
        set_: list[str] | None = None, timeout: float = 0.0, manifest: str = "", host_address: str = "",
        traceback: bool = False) -> None:
    """Start TARGET's server on 127.0.0.1, wait until /health answers, leave it running; prints URL=..."""
    from imageforge.run import run_for_cli

    with user_errors(traceback):
        server = run_for_cli(manifest or None, target or None, profile or None, set_ or [], base=base,
                             port=port or None, timeout=timeout or None, host_address=host_address or None)
        print(f"container {server.name} ({server.image}) is serving; `invoke stop` removes it")
        print(f"URL={server.url}")


@task(help={"target": "Only this target's servers (default: all)",
            "all": "Also servers left by interrupted smoke runs or tests", "traceback": TRACEBACK_HELP})
def stop(c: Context, target: str = "", all: bool = False, traceback: bool = False) -> None:
    """Stop and remove the server containers `invoke run` started (found by label)."""
    from imageforge.run import stop_servers

    with user_errors(traceback):
        stop_servers(target or None, every=all)


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
    },
)
def smoke(c: Context, url: str = "", target: str = "", profile: str = "", suite: str = "", tags: str = "",
          base: bool = False, port: int = 0, wait: float = 0.0, set_: list[str] | None = None, manifest: str = "",
          host_address: str = "", traceback: bool = False) -> None:
    """Run the smoke suite: against --url, or build + start + test + remove TARGET:PROFILE. Exit 4 on a failure."""
    _use_host_address(host_address)
    from imageforge.smoke import smoke_for_cli

    with user_errors(traceback):
        smoke_for_cli(manifest or None, target or None, profile or None, set_ or [], url=url or None,
                      suite=suite or None, tags=tags or None, base=base, port=port or None, wait=wait)


@task(help={"manifest": MANIFEST_HELP, "traceback": TRACEBACK_HELP})
def demo(c: Context, manifest: str = "", traceback: bool = False) -> None:
    """README command 1: from nothing, make the Docker engine, the cpu base, the cpu image, then smoke it."""
    from imageforge.smoke import demo_for_cli

    with user_errors(traceback):
        demo_for_cli(manifest or None)


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
    },
)
def bench(c: Context, url: str = "", target: str = "", profile: str = "", set_: list[str] | None = None,
          port: int = 0, requests: int = 32, concurrency: int = 8, prompt_tokens: int = 256, output_tokens: int = 64,
          shared_prefix: float = 0.5, seed: int = 0, api: str = "completions", model: str = "",
          duration: float = 300.0, timeout: float = 120.0, warmup: int = 1, max_error_rate: float = 0.0,
          repeat: int = 1, replay: str = "", replay_out: str = "", max_model_len: int = 0,
          planned_output: bool = True, require_targets: bool = False, manifest: str = "", json: bool = False,
          host_address: str = "", traceback: bool = False) -> None:
    """Load-test --url, or build + serve + bench + remove TARGET:PROFILE: TPS, score, latencies. Exit 4 on failure.

    --replay: the evaluator's workload one request at a time, its metrics and PASS/FAIL lines, bench.json + PNG."""
    _use_host_address(host_address)
    from imageforge.bench import bench_for_cli, replay_options, workload_from_cli

    with user_errors(traceback):
        workload = workload_from_cli(requests, concurrency, prompt_tokens, output_tokens, shared_prefix, seed, api,
                                     model, duration, timeout, warmup, max_error_rate, repeat)
        options = replay_options(replay, replay_out, requests=requests, seed=seed, max_model_len=max_model_len,
                                 planned_output=planned_output, duration=duration, timeout=timeout,
                                 max_error_rate=max_error_rate, require_targets=require_targets)
        result = bench_for_cli(manifest or None, target or None, profile or None, set_ or [], url=url or None,
                               workload=workload, port=port or None, replay=options)
        if json:
            _print(result.to_json()["report"] if options else result.summary(), True)


@task(
    iterable=["param", "set_"],
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
    },
)
def sweep(c: Context, target: str = "", profile: str = "", param: list[str] | None = None,
          set_: list[str] | None = None, requests: int = 0, concurrency: int = 0, prompt_tokens: int = 256,
          output_tokens: int = 64, shared_prefix: float = 0.5, seed: int = 0, api: str = "completions",
          model: str = "", duration: float = 300.0, timeout: float = 120.0, warmup: int = 1,
          max_error_rate: float = 0.0, repeat: int = 1, interleave: bool = True, manifest: str = "",
          json: bool = False, host_address: str = "", traceback: bool = False) -> None:
    """For each --param combination: build (config layer only), serve, bench, remove; table, sweep.json/.md/.png."""
    _use_host_address(host_address)
    from imageforge.bench import sweep_for_cli, workload_from_cli

    with user_errors(traceback):
        workload = workload_from_cli(requests, concurrency, prompt_tokens, output_tokens, shared_prefix, seed, api,
                                     model, duration, timeout, warmup, max_error_rate, repeat)
        result = sweep_for_cli(manifest or None, target or None, profile or None, param or [], set_ or [],
                               workload=workload, requests_given=bool(requests), concurrency_given=bool(concurrency),
                               interleave=interleave)
        if json:
            _print(result.to_json(), True)


def json_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _use_host_address(value: str) -> None:
    """--host-address wins over $IMAGEFORGE_HOST_ADDRESS for everything this task starts."""
    if value:
        os.environ["IMAGEFORGE_HOST_ADDRESS"] = value


def _print(payload: object, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(payload)


ns = Collection(validate, plan, base, build, test, check_patches, patch_from, lock, export, clean, run, stop,
                smoke, demo, bench, sweep)
ns.configure({"run": {"echo": True}})
os.environ.setdefault("PYTHONUNBUFFERED", "1")
