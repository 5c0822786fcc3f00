"""The `imageforge` command: the invoke task collection over the library's front door.

Each task parses its options and calls one function of `imageforge.app`. Installed, the collection is
the `imageforge` console command (`main`, invoke's `Program`); in the repository, `tasks.py` re-exports
it so `invoke TASK` works the same. Run `imageforge --list`, or `imageforge TASK --help`.
Exit codes: 0 ok, 1 usage (invoke's own), 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.parser.context import ParserContext
from invoke.program import Program
from invoke.tasks import Task
from invoke.tasks import task as _invoke_task

from . import __version__, app
from .cli import EXIT_CLOSED_PIPE, Output, closed_pipe_quiet, command_io
from .errors import ConfigError

if TYPE_CHECKING:
    from .bench import Workload
    from .smoke import SmokeReport


#: The one flag table: these options have these short flags in every task that has them; every other option is
#: long-only, and ``-h`` is always help.
SHORT_FLAGS: Mapping[str, str] = MappingProxyType({
    "target": "t", "profile": "p", "manifest": "m", "set_": "s", "json": "j", "verbose": "v", "quiet": "q"})
#: Other long names an option answers to (``vllm bench serve``'s, where they mean the same).
LONG_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "requests": ("num-prompts",), "concurrency": ("max-concurrency",), "prompt_tokens": ("random-input-len",),
    "output_tokens": ("random-output-len",)})


class ForgeTask(Task[Any]):
    """invoke's Task with the one flag table: no automatic short flags, :data:`SHORT_FLAGS` and
    :data:`LONG_ALIASES` only."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["auto_shortflags"] = False
        super().__init__(body, **kwargs)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        names = [opts["names"][0], *LONG_ALIASES.get(name, ())]
        if name in SHORT_FLAGS:
            names.append(SHORT_FLAGS[name])
        opts["names"] = names
        return opts


_invoke_help_for = ParserContext.help_for


def _help_for(self: ParserContext, flag: str) -> tuple[str, str]:
    """invoke's option help line, with a value placeholder for float options too (``--duration=FLOAT``): invoke
    knows only STRING and INT. Set on invoke's ParserContext, so `invoke TASK --help` in the repository shows it."""
    namestr, helpstr = _invoke_help_for(self, flag)
    if self.flags[flag].kind is float:
        names = [f"{n}=FLOAT" if n.startswith("--") else f"{n} FLOAT" for n in self.names_for(flag)]
        namestr = ", ".join(sorted(names, key=len))
    return namestr, helpstr


ParserContext.help_for = _help_for  # type: ignore[method-assign]


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], ForgeTask]:
    """``invoke.task(...)`` making :class:`ForgeTask` objects."""
    decorator: Callable[[Callable[..., Any]], ForgeTask] = _invoke_task(klass=ForgeTask, **kwargs)
    return decorator


SHARED_HELP = {
    "manifest": "Manifest file (default: $IMAGEFORGE_MANIFEST or ./build.yaml)",
    "traceback": "Show Python tracebacks (also IMAGEFORGE_TRACEBACK=1)",
    "json": "Print the result as one JSON document on stdout (logs and progress stay on stderr)",
    "quiet": "No progress or log lines on stderr (errors still go there)",
    "host_address": "Address of the Docker host where ports are published and reached "
                    "(default 127.0.0.1; also IMAGEFORGE_HOST_ADDRESS)",
}


def _option(name: str, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)


def _workload_fields() -> dict[str, object]:
    """The workload options and their defaults, from the Workload dataclass (``model``: "" = discover it)."""
    from .bench import Workload

    return {f.name: ("" if f.default is None else f.default) for f in dataclasses.fields(Workload)}


def command(*, json: bool = False, manifest: bool = True, host: bool = False, workload: str = "",
            help: Mapping[str, str] | None = None, **kwargs: Any) -> Callable[[Callable[..., None]], ForgeTask]:
    """A task of the `imageforge` command. The body is ``body(c, out, ...own options)``; this adds the shared
    options -- ``--manifest`` (unless ``manifest=False``), ``--traceback``, ``--quiet``, ``--json`` (``json=True``),
    ``--host-address`` (``host=True``) and, with ``workload="bench"|"sweep"|"ablate"``, the workload options
    (defaults from :class:`imageforge.bench.Workload`; the body gets ``workload=Workload(...)``) -- and runs the
    body with the command's Settings in ``cmd.settings``, stdout kept for results (``cmd.result``), every other
    line on stderr, errors rendered with their exit code and a closed stdout ending quietly (:func:`cli.command_io`).
    """
    def decorate(body: Callable[..., None]) -> ForgeTask:
        shared: dict[str, object] = {}
        if manifest:
            shared["manifest"] = ""
        if json:
            shared["json"] = False
        if host:
            shared["host_address"] = ""
        shared["quiet"] = False
        shared["traceback"] = False
        load: dict[str, object] = {}
        if workload:
            load = _workload_fields()
            if workload == "sweep":
                load.update(requests=0, concurrency=0)  # 0: from the swept max-num-seqs
            if workload == "ablate":
                del load["repeat"]  # ablate's own --repeat: ABAB rounds
        own = list(inspect.signature(body).parameters.values())
        params = [own[0], *own[2:], *(_option(k, v) for k, v in load.items()),
                  *(_option(k, v) for k, v in shared.items())]

        @functools.wraps(body)
        def run(c: Context, **options: Any) -> None:
            given = {k: options.pop(k) for k in shared}
            w = {k: options.pop(k) for k in load}
            s = app.settings(manifest=str(given.get("manifest", "")), traceback=bool(given["traceback"]),
                             host_address=str(given.get("host_address", "")))
            with command_io(s.traceback, as_json=bool(given.get("json", False)), quiet=bool(given["quiet"]),
                            settings=s) as out:
                if workload:
                    from .bench import Workload

                    options["workload"] = Workload(**{**w, "model": w["model"] or None})
                body(c, out, **options)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        texts = dict(help or {})
        for name in [*load, *shared]:
            texts.setdefault(name, SHARED_HELP.get(name) or WORKLOAD_HELP[name])
        made: ForgeTask = task(help=texts, **kwargs)(run)
        return made

    return decorate


TARGET_HELP = "Target name (default: the manifest's default_target)"
PROFILE_HELP = "Profile name (default: the target's default_profile)"
SET_HELP = "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable"
#: The options that pick what is resolved, shared by plan and build.
RESOLVE_HELP = {"target": TARGET_HELP, "profile": PROFILE_HELP, "set_": SET_HELP}


@command(json=True)
def validate(c: Context, cmd: Output) -> None:
    """Check the manifest: YAML, schema, files, paths, profiles of every target. No daemon needed."""
    summary = app.validate(cmd.settings)
    cmd.result(summary.text(), summary.to_json())


@command(json=True, iterable=["set_"],
         help={**RESOLVE_HELP, "no_daemon": "Do not ask the Docker daemon for cache state"})
def plan(c: Context, cmd: Output, target: str = "", profile: str = "", set_: list[str] | None = None,
         no_daemon: bool = False) -> None:
    """Show every resolved value (and where it came from), the ordered steps, cache keys and HIT/MISS."""
    result = app.plan(cmd.settings, target or None, profile or None, set_ or [], use_daemon=not no_daemon)
    cmd.result(result.text(), result.to_json())


@command(help={"target": "Target whose recipe base image to make (default: cpu)"})
def base(c: Context, cmd: Output, target: str = "cpu") -> None:
    """Make the target's base image from its recipe (OS image, wheelhouse, vLLM venv) and its model."""
    ref = app.base(cmd.settings, target)
    cmd.result(f"BASE={ref}")


@command(json=True, iterable=["set_"], help={
    **RESOLVE_HELP, "verbose": "Show script and verification output live",
    "locked": "Fail (exit 2, nothing built) when anything differs from build.lock (see `imageforge lock`)"})
def build(c: Context, cmd: Output, target: str = "", profile: str = "", set_: list[str] | None = None,
          verbose: bool = False, locked: bool = False) -> None:
    """Build (or reuse from cache) every layer of TARGET:PROFILE, verify it, then move its tags."""
    result = app.build(cmd.settings, target or None, profile or None, set_ or [], verbose=verbose, quiet=cmd.quiet,
                       locked=locked)
    cmd.result(None, result.to_json())


@command(help={"dir": "Directory of the new project (default: the current one); existing files are kept",
               "force": "Overwrite files that are already there"})
def init(c: Context, cmd: Output, dir: str = ".", force: bool = False) -> None:
    """Write a starter project: build.yaml (the cpu target), images/cpu (its base recipe), smoke/ (its suite)."""
    from .starter import write_starter

    for line in write_starter(Path(dir), force=force):
        cmd.result(line)


# --------------------------------------------------------------------------- tools around the engine


@command(json=True, help={
    "target": TARGET_HELP, "profile": "Only this profile's steps (default: the shared steps and every profile's)",
    "diff": "Print the unified diff each step would make"})
def check_patches(c: Context, cmd: Output, target: str = "", profile: str = "", diff: bool = False) -> None:
    """Dry-run every patch/overlay/symlink step against the real base image (nothing built). Exit 3 if any fails."""
    app.check_patches(cmd.settings, target or None, profile or None, diff=diff,
                      show=lambda report: cmd.result(report.text(), report.to_json()))


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


@command(json=True, host=True, iterable=["set_"], help={
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
                     timeout=timeout or None)
    cmd.log(f"container {server.name} ({server.image}) is serving; `imageforge stop` removes it")
    cmd.result(f"URL={server.url}", {"container": server.name, "image": server.image, "url": server.url})


@command(manifest=False, help={"target": "Only this target's servers (default: all)",
                               "all": "Also servers left by interrupted smoke runs or tests"})
def stop(c: Context, cmd: Output, target: str = "", all: bool = False) -> None:
    """Stop and remove the server containers `imageforge run` started (found by label)."""
    app.stop(target or None, every=all)


@command(json=True, host=True, iterable=["set_"], help={
    "url": "Test a server that is already running, e.g. http://127.0.0.1:8000",
    "target": "Target name (default: the manifest's default_target); names the suite and tags",
    "profile": "Profile to build, start, test and remove (default: the target's default_profile)",
    "suite": "Suite file (default: the target's smoke.suite)",
    "tags": "Comma-separated tags to run (default: the target's smoke.tags, else dummy-ok)",
    "base": "Test the base image with the serving args as flags (no build)",
    "port": "Host port for the server started here (default: a free one)",
    "wait": "With --url: seconds to wait for /health first (default 0)",
    "set_": SET_HELP,
    "junit": "Also write the JUnit XML report to this file"})
def smoke(c: Context, cmd: Output, url: str = "", target: str = "", profile: str = "", suite: str = "",
          tags: str = "", base: bool = False, port: int = 0, wait: float = 0.0, set_: list[str] | None = None,
          junit: str = "") -> None:
    """Run the smoke suite: against --url, or build + start + test + remove TARGET:PROFILE. Exit 4 on a failure."""
    def show(report: SmokeReport) -> None:
        if junit and report.junit_path is not None:
            shutil.copyfile(report.junit_path, junit)
        cmd.result(f"smoke: {report.summary_line()}", report.to_json())

    app.smoke(cmd.settings, target or None, profile or None, set_ or [], url=url or None, suite=suite or None,
              tags=tags or None, base=base, port=port or None, wait=wait, show=show)


@command(host=True)
def demo(c: Context, cmd: Output) -> None:
    """README command 1: from nothing, make the Docker engine, the cpu base, the cpu image, then smoke it."""
    app.demo(cmd.settings)


# --------------------------------------------------------------------------- bench and sweep

WORKLOAD_HELP = {
    "requests": "Requests to send (default 32; sweep: 4 x concurrency)",
    "concurrency": "Requests in flight at once (default 8; sweep: the largest max-num-seqs swept)",
    "prompt_tokens": "Prompt length in tokens (default 256)",
    "output_tokens": "Generated tokens per request: max_tokens with ignore_eos (default 64)",
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


@command(json=True, host=True, workload="bench", iterable=["set_"], optional=["replay"], help={
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
    "port": "Host port for the server started here (default: a free one)"})
def bench(c: Context, cmd: Output, url: str = "", target: str = "", profile: str = "",
          set_: list[str] | None = None, port: int = 0, replay: str = "", replay_out: str = "",
          max_model_len: int = 0, planned_output: bool = True, require_targets: bool = False,
          workload: Workload | None = None) -> None:
    """Load-test --url, or build + serve + bench + remove TARGET:PROFILE: TPS, score, latencies. Exit 4 on failure.

    --replay: the evaluator's workload one request at a time, its metrics and PASS/FAIL lines, bench.json + PNG.
    Workload options also answer to `vllm bench serve`'s names: --num-prompts, --max-concurrency,
    --random-input-len, --random-output-len."""
    from .bench import Workload, replay_options

    w = workload or Workload()
    options = replay_options(replay, replay_out, requests=w.requests, seed=w.seed, max_model_len=max_model_len,
                             planned_output=planned_output, duration=w.duration, timeout=w.timeout,
                             max_error_rate=w.max_error_rate, require_targets=require_targets)
    result = app.bench(cmd.settings, target or None, profile or None, set_ or [], url=url or None,
                       port=port or None, workload=w, replay=options,
                       show=None if options else lambda r: cmd.result(None, r.summary()))
    if options:
        cmd.result(None, result.to_json()["report"])


@command(json=True, host=True, workload="sweep", iterable=["param", "set_"], help={
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
    from .bench import Workload

    w = workload or Workload()
    requests_given, concurrency_given = bool(w.requests), bool(w.concurrency)  # 0: from the swept values
    defaults = Workload()
    w = dataclasses.replace(w, requests=w.requests or defaults.requests,
                            concurrency=w.concurrency or defaults.concurrency)
    result = app.sweep(cmd.settings, target or None, profile or None, param or [], set_ or [], workload=w,
                       interleave=interleave, requests_given=requests_given, concurrency_given=concurrency_given)
    cmd.result(None, result.to_json())


# --------------------------------------------------------------------------- accuracy gate, forensics


@command(json=True, host=True, iterable=["set_"], help={
    "target": TARGET_HELP,
    "profile": "Profile under test (default: the target's default_profile)",
    "against": "Reference: base (the target's base image, nothing patched; default), a PROFILE or an IMAGE",
    "dtype": "float32 or bfloat16 on both sides (default: the target's equiv.dtype, else float32)",
    "top_k": "prompt_logprobs per position (default: the target's equiv.top_k)",
    "greedy_tokens": "Greedy continuation tokens, for the first divergence (default: equiv.greedy_tokens)",
    "prompts": "Use only the first N prompts of the target's equiv prompt set (default: all)",
    "set_": SET_HELP})
def equiv(c: Context, cmd: Output, target: str = "", profile: str = "", against: str = "base", dtype: str = "",
          top_k: int = 0, greedy_tokens: int = 0, prompts: int = 0, set_: list[str] | None = None) -> None:
    """Accuracy gate: serve TARGET:PROFILE and the reference at once, compare teacher-forced logprobs. Exit 4 over."""
    app.equiv(cmd.settings, target or None, profile or None, set_ or [], against=against, dtype=dtype, top_k=top_k,
              greedy_tokens=greedy_tokens, prompts=prompts, show=lambda r: cmd.result(None, r.to_json()))


@command(json=True, host=True, iterable=["check", "set_"], help={
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
               tags=tags, repeat=repeat, flaky=flaky, show=lambda r: cmd.result(None, r.to_json()))


@command(json=True, host=True, workload="ablate", iterable=["set_"], help={
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
    """For each step: the image without it, benched ABAB against the full image, and its equiv verdict; a table."""
    from .bench import Workload

    result = app.ablate(cmd.settings, target or None, profile or None, set_ or [], workload=workload or Workload(),
                        steps=steps, repeat=repeat, out=out, equiv=not no_equiv)
    cmd.result(None, result.to_json())


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


TASKS: tuple[Task[Any], ...] = (validate, plan, base, build, init, check_patches, patch_from, lock, export, clean, run,
                                 stop, smoke, demo, bench, sweep, equiv, bisect, ablate, submission, wheels)


def collection(*extra: Task[Any]) -> Collection:
    """The command's task collection (plus ``extra`` tasks: the repository's tasks.py adds `test`)."""
    c = Collection(*TASKS, *extra)
    c.configure({"run": {"echo": True}})
    return c


ns = collection()
os.environ.setdefault("PYTHONUNBUFFERED", "1")


def program(namespace: Collection | None = None) -> Program:
    """invoke's Program over the collection, named `imageforge` (what `main` runs)."""
    return Program(namespace=namespace or ns, version=__version__, name="imageforge", binary="imageforge")


def main() -> None:
    """The `imageforge` console command (a reader closing stdout ends it quietly, also in invoke's own listings)."""
    with contextlib.suppress(Exit), closed_pipe_quiet():
        program().run()
        return
    sys.exit(EXIT_CLOSED_PIPE)
