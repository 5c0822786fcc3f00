"""The front door: one function per invoke task, and nothing else calls the library for a user.

Each function takes the command's :class:`~imageforge.settings.Settings` (the tool options, resolved
once from the command line and the environment), loads the manifest once, resolves the target
and hands frozen values to the stage functions, lowest stage first::

    manifest -> resolve -> plan -> base -> build (verify inside) -> serve -> smoke/bench -> equiv/forensics
        -> export/submission

Nothing here reads ``os.environ`` directly: it comes in through ``Settings.environ``.  The
modules below are imported inside the functions so that ``invoke --help`` stays fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import Settings

if TYPE_CHECKING:
    from .bench import SweepResult, Workload
    from .build import BuildResult
    from .clean import CleanResult
    from .equiv.runner import EquivRun
    from .export import ExportResult
    from .forensics.ablate_runner import AblationRun
    from .forensics.bisect_runner import BisectRun
    from .manifest.model import Manifest
    from .manifest.resolve import Resolved, ValidationSummary
    from .patches.check import CheckReport
    from .patches.from_image import PatchFromResult
    from .plan import PlanReport
    from .preflight import PreflightReport
    from .serve.runtime import Runtime
    from .smoke import SmokeReport
    from .submission import SubmissionResult
    from .vendor_api.probe import ProbeResult
    from .wheelhouse.make import Wheelhouse

Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


def settings(*, manifest: str = "", traceback: bool = False, host_address: str = "",
             reuse_servers: bool = False) -> Settings:
    """The command's Settings from its options ("" = not given)."""
    return Settings.from_cli(manifest=manifest or None, traceback=traceback, host_address=host_address or None,
                             reuse_servers=reuse_servers)


def load(s: Settings) -> Manifest:
    from .manifest.load import load_manifest

    return load_manifest(s.manifest)


def _validated(s: Settings, manifest: Manifest) -> None:
    """What `validate` refuses, every command that resolves a target refuses (exit 2, validate's message),
    whichever profile it selects: every profile of every target resolves, and the serving args of every
    target and profile pass the cached flag tables. Pure and cheap (no YAML parse: the loaded document;
    ~3 ms)."""
    from .flags.images import check_validate
    from .manifest.resolve import validate_all

    validate_all(manifest)
    check_validate(manifest, s.environ)


def _resolve(s: Settings, manifest: Manifest, target: str | None, profile: str | None,
             sets: Sequence[str] = ()) -> Resolved:
    from .manifest.resolve import resolve

    _validated(s, manifest)
    return resolve(manifest, target, profile, environ=s.environ, sets=sets)


# --------------------------------------------------------------------------- manifest, plan, base, build


def validate(s: Settings, *, strict: bool = False) -> ValidationSummary:
    """`validate`: YAML, schema, files, paths and every profile of every target; the serving values of each
    against the evaluator's checks (warnings; ``strict``: exit 2 on one)."""
    from .flags.evaluator import report_risks
    from .flags.images import check_validate
    from .manifest.resolve import validate_all

    summary = validate_all(load(s))
    notes = tuple(check_validate(summary.manifest, s.environ))
    risks = report_risks(summary.resolved, s.environ, strict=strict)
    return replace(summary, notes=(*notes, *risks.notes), warnings=risks.warnings)


def plan(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *,
         use_daemon: bool, strict: bool = False) -> PlanReport:
    """`plan`: resolve, check the serving values against the evaluator (warnings; ``strict``: exit 2 on one,
    before anything else), then ask the daemon (when one answers) what is cached."""
    from .base import daemon_probe
    from .flags.evaluator import report_risks
    from .flags.images import check_resolved
    from .plan import PlanReport, make_plan

    resolved = _resolve(s, load(s), target, profile, sets)
    risks = report_risks([resolved], s.environ, strict=strict)
    probe = daemon_probe() if use_daemon else None
    note = check_resolved(resolved, s.environ, use_daemon=probe is not None)
    return PlanReport(make_plan(resolved, environ=s.environ, probe=probe),
                      notes=((note,) if note else ()) + risks.notes, warnings=risks.warnings)


def base(s: Settings, target: str | None, log: Log = print) -> str:
    """`base`: the Docker engine, the target's base image (made from its recipe) and its model."""
    from .build import prepare_base

    return prepare_base(_resolve(s, load(s), target, None), s.environ, log, start=True).ref


def build(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, verbose: bool,
          quiet: bool, locked: bool = False, verify_imports: bool = False) -> BuildResult:
    """`build`: every layer of TARGET:PROFILE built or reused, verified, tagged (``verify_imports``: verify also
    imports ``verify.imports``; by default the first server start proves them)."""
    from .build import build_target
    from .flags.images import check_resolved

    resolved = _resolve(s, load(s), target, profile, sets)
    note = check_resolved(resolved, s.environ)  # exit 2 before any build work
    if note and not quiet:
        print(note)
    return build_target(resolved, environ=s.environ, echo=_quiet if quiet else print, verbose=verbose,
                        locked=locked, verify_imports=verify_imports)


# --------------------------------------------------------------------------- tools around the engine


def check_patches(s: Settings, target: str | None, profile: str | None, *, diff: bool,
                  show: Callable[[CheckReport], None]) -> CheckReport:
    """`check-patches`: ``show`` the report, then fail (exit 3) when a step would not apply."""
    from .flags.images import check_target
    from .patches.check import check_patches as check
    from .patches.check import fail_if_broken

    manifest = load(s)
    _validated(s, manifest)
    report = check(manifest, target, profile, environ=s.environ, diff=diff)
    show(report)
    fail_if_broken(report)
    check_target(manifest, target, s.environ)  # the serving flags against the parser after the steps
    return report


def preflight(s: Settings, target: str | None, profile: str | None, *, strict: bool = False,
              allow_dirty: bool = False, root: Path | None = None, python: str = "python3",
              show: Callable[[PreflightReport], None], log: Log = _quiet) -> PreflightReport:
    """`preflight`: ``show`` every finding of one run, then fail (exit 3) when an error (``strict``: a warning)
    is among them. With ``root``: the phases that need no Docker, over the files under ``root`` with the target
    interpreter ``python`` (nothing written, script steps not run)."""
    from .errors import BuildError
    from .manifest.resolve import validate_all

    if root is not None:
        from .preflight.local import run_local_preflight

        report = run_local_preflight(lambda: load(s), validate_all, target, profile, root=root, python=python,
                                     environ=s.environ, strict=strict, allow_dirty=allow_dirty, log=log)
    else:
        from .preflight import run_preflight

        report = run_preflight(lambda: load(s), validate_all, target, profile, environ=s.environ, strict=strict,
                               allow_dirty=allow_dirty, log=log)
    show(report)
    if not report.ok:
        first = report.failing[0]
        raise BuildError(f"preflight of target {report.target!r}: {len(report.failing)} finding(s) fail the run",
                         found=f"{first.where()}: {first.check}: {first.message}",
                         hint="every finding is listed above; --json for tools")
    return report


def init_from(s: Settings, source: Path, out: Path, *, base: str | None, force: bool,
              scan: bool = True) -> tuple[Path, list[str]]:
    """`init --from DIR`: OUT/build.yaml reproducing DIR's build; the lines it could not translate. With ``scan``,
    each step runs in a throwaway container of the base (network off) and what it changed is its ``touches:``."""
    from .manifest.adopt import write_adopted
    from .patches.check import to_stderr
    from .preflight.touches import scan_touches

    return write_adopted(source, out, base=base, force=force,
                         scan=(lambda path: scan_touches(path, environ=s.environ, log=to_stderr)) if scan else None)


def probe(*, out: str, python: str, modules: Sequence[str], walk: Sequence[str], ops: Sequence[str],
          libraries: Sequence[str]) -> ProbeResult:
    """`probe --in-place`: the vendor API record taken with the target interpreter, written to OUT."""
    from .vendor_api.probe import probe as take

    return take(Path(out), python=python, modules=modules, walk=walk, ops=ops, libraries=libraries)


def patch_from(s: Settings, target: str | None, file: str, edited: str, *, against_base: bool,
               id_prefix: str) -> PatchFromResult:
    """`patch-from`: the anchored patch steps that turn an image file into EDITED."""
    from .patches.from_image import patch_from as derive

    manifest = load(s)
    _validated(s, manifest)
    return derive(manifest, target, file, edited, environ=s.environ, against_base=against_base, id_prefix=id_prefix)


def lock(s: Settings, target: str | None) -> tuple[Path, dict[str, Any]]:
    """`lock`: write the target's entry of build.lock."""
    from .lock import write_lock

    return write_lock(_resolve(s, load(s), target, None), s.environ)


def export(s: Settings, target: str | None, profile: str | None, *, out: str | None, push: str | None,
           gzip_: bool, save: bool, quiet: bool) -> ExportResult:
    """`export`: the tarball, its sha256 and description of TARGET:PROFILE; ``push`` to a registry."""
    from .export import export as do_export

    return do_export(_resolve(s, load(s), target, profile), environ=s.environ, out=out, push=push, gzip_=gzip_,
                     save=save, log=_quiet if quiet else print)


def clean(s: Settings, *, keep: int, dry_run: bool, target: str | None, min_age: float) -> CleanResult:
    """`clean`: remove the labelled images and containers no retention rule keeps."""
    from .clean import clean as do_clean

    return do_clean(load(s), keep=keep, dry_run=dry_run, target=target, min_age=min_age)


# --------------------------------------------------------------------------- serving


def runtime(s: Settings, *, process: bool = False, root: str = "", python: str = "",
            serves: bool = True) -> Runtime:
    """The command's one serving Runtime, from its options: a container per server (Docker), or with ``process``
    (`--in-place [--root DIR] [--python PATH]`) the serving command as a process on this machine, the target's
    files under ``root`` and ``python`` its interpreter. ``serves``: the command starts servers (not `stop`)."""
    from .errors import ConfigError

    if not process:
        if root or python:
            raise ConfigError("--root and --python go with --in-place", hint="add --in-place")
        from .serve.container import ContainerRuntime

        return ContainerRuntime()
    if serves and s.reuse_servers:  # in place one server at a time owns the card: a running one is `run`'s
        raise ConfigError("--reuse-servers is for servers in Docker containers, not --in-place",
                          found=f"reuse_servers from {s.sources['reuse_servers']}",
                          hint="drop --reuse-servers (or unset IMAGEFORGE_REUSE_SERVERS); in place, smoke or bench "
                               "a running server with --url")
    from .serve.process import ProcessRuntime

    return ProcessRuntime(root=Path(root or "/"), python=python or "python3")


def run(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, base: bool,
        port: int | None, timeout: float | None, runtime: Runtime | None = None) -> Any:
    """`run`: start TARGET:PROFILE (prepared first: built, or in place the root as applied) on the host address,
    wait until ready, leave it; the server."""
    resolved = _resolve(s, load(s), target, profile, sets)
    where = runtime or _default_runtime(s)
    return where.start_detached(resolved, base=base, port=port, timeout=timeout, host_address=s.host_address,
                                environ=s.environ)


def _default_runtime(s: Settings) -> Runtime:
    return runtime(s)


@contextlib.contextmanager
def _restoring(s: Settings, resolved: Resolved, where: Runtime, echo: Log, *, starts: int) -> Iterator[None]:
    """One server at a time: say how many starts come; put back what preparing changes afterwards."""
    if where.one_at_a_time:
        echo(f"{where.where}: {starts} server start(s), one at a time")
    with where.restoring(resolved.manifest, environ=s.environ, log=echo):
        yield


def stop(target: str | None, *, every: bool, s: Settings | None = None, runtime: Runtime | None = None) -> list[str]:
    """`stop`: remove the servers `run` started (``every``: smoke runs' and tests' too); in place, end the server
    processes `run --in-place` recorded under the manifest's directory (never the Docker engine)."""
    s = s or settings()
    where = runtime or _default_runtime(s)
    return where.stop(target, every=every, root=s.manifest.resolve().parent)


def smoke(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, url: str | None,
          suite: str | None, tags: str | None, base: bool, port: int | None, wait: float,
          echo: Log = print, show: Callable[[SmokeReport], None] | None = None,
          runtime: Runtime | None = None, params: Sequence[str] = ()) -> SmokeReport:
    """`smoke`: the suite against --url, or build + start + check + remove TARGET:PROFILE (exit 4 on a failure)."""
    from .errors import ConfigError
    from .smoke import DEFAULT_TAGS, parse_tags, smoke_target, smoke_url, suite_for, target_vars, verdict

    tag_list = parse_tags(tags)
    if url and runtime is not None and runtime.one_at_a_time:
        raise ConfigError("--url tests a running server: --in-place does not apply")
    if url:
        if base or profile:
            raise ConfigError("--url tests a running server: --profile and --base do not apply",
                              hint="drop --url to build, start and stop the target's server")
        resolved = _resolve(s, load(s), target, None, sets) if target or not suite else None
        suite_path = suite_for(resolved, suite) if resolved is not None else Path(suite or "")
        root = resolved.manifest.root if resolved is not None else Path.cwd()
        chosen = tag_list or (tuple(resolved.target.smoke.tags) if resolved is not None else ()) or DEFAULT_TAGS
        report = smoke_url(url, suite_path=suite_path, tags=chosen, run_root=root, echo=echo,
                           vars=target_vars(resolved) if resolved is not None and target else None, wait=wait,
                           target=resolved.target.name if resolved is not None and target else None,
                           params=params)
    else:
        resolved = _resolve(s, load(s), target, profile, sets)
        where = runtime or _default_runtime(s)
        with _restoring(s, resolved, where, echo, starts=1):
            report = smoke_target(resolved, where, environ=s.environ, suite_path=Path(suite) if suite else None,
                                  tags=tag_list, echo=echo, base=base, port=port, host_address=s.host_address,
                                  params=params)
    if show is not None:  # the result, shown before the verdict (exit 4) too
        show(report)
    verdict(report)
    return report


def demo(s: Settings, *, target: str = "cpu", echo: Log = print) -> SmokeReport:
    """`demo`: Docker engine, cpu base, build and smoke of the cpu target, from nothing."""
    import time

    from .docker_engine import ensure_daemon
    from .smoke import smoke_target, verdict

    t0 = time.monotonic()
    resolved = _resolve(s, load(s), target, None)
    echo(f"demo: {target}:{resolved.profile_name} -- Docker engine, base image, build, serve, smoke")
    ensure_daemon(start=True, log=echo)
    # the build makes the base image (and model) first
    report = smoke_target(resolved, _default_runtime(s), environ=s.environ, echo=echo, host_address=s.host_address)
    echo(f"demo: {report.summary_line()} in {time.monotonic() - t0:.0f}s")
    verdict(report)
    return report


def _workload(workload: Workload) -> Workload:
    """The workload, checked (exit 2 naming every bad value)."""
    return workload.validate()


def bench(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, url: str | None,
          port: int | None, workload: Workload, echo: Log = print, replay: Any = None,
          show: Callable[[Any], None] | None = None, runtime: Runtime | None = None) -> Any:
    """`bench`: load-test --url, or build + serve + bench + remove TARGET:PROFILE (exit 4 on a failure).

    ``replay`` (a :class:`imageforge.bench.replay.ReplayOptions`): the evaluator's one-at-a-time replay instead of
    the concurrent workload; prints its metrics and target lines, writes bench.json + bench.png.
    """
    from .bench import bench_target, print_bench, replay_report, replay_target, run_bench, verdict, write_bench
    from .bench.replay import replay_bench
    from .bench.runner import with_target
    from .errors import ConfigError
    from .rundirs import new_run_id, run_dir
    from .serve.openai_wire import check_url

    if replay is None:
        w = _workload(workload)
    else:
        replay.validate()
    if url and runtime is not None and runtime.one_at_a_time:
        raise ConfigError("--url benches a running server: --in-place does not apply")
    if url:
        if (target and replay is None) or profile or sets:
            raise ConfigError("--url benches a running server: --target (except with --replay), --profile and "
                              "--set do not apply", hint="drop --url to build, start and stop the target's server")
        check_url(url)
        root = s.manifest.resolve().parent if s.manifest.exists() else Path.cwd()
        if replay is not None:
            if target:  # the target's replay: settings (time cap, gate) for a server already up: nothing is built
                replay = with_target(replay, load(s).target(target).replay)
            return replay_report(replay_bench(url, replay, run_dir(root, new_run_id()), echo=echo), replay, echo,
                                 show)
        result = run_bench(url, w, echo=echo, run_dir=None, write=False)
        result.run_dir = run_dir(root, result.run_id)
        write_bench(result)
    else:
        resolved = _resolve(s, load(s), target, profile, sets)
        where = runtime or _default_runtime(s)
        with _restoring(s, resolved, where, echo, starts=1):
            if replay is not None:
                return replay_report(replay_target(resolved, replay, where, environ=s.environ, echo=echo, port=port,
                                                   host_address=s.host_address), replay, echo, show)
            result = bench_target(resolved, w, where, environ=s.environ, echo=echo, port=port,
                                  host_address=s.host_address)
    print_bench(result, echo)
    if show is not None:
        show(result)
    verdict(result)
    return result


def sweep(s: Settings, target: str | None, profile: str | None, params: Sequence[str], sets: Sequence[str], *,
          workload: Workload, requests_given: bool, concurrency_given: bool,
          echo: Log = print, interleave: bool = True, runtime: Runtime | None = None) -> SweepResult:
    """`sweep`: one build + serve + bench per combination of --param values; exit 4 when no point gave a result."""
    from .bench import parse_params, report_sweep, sweep_workload
    from .bench import sweep as run_sweep

    parsed = parse_params(params)
    w = sweep_workload(parsed, _workload(workload), requests_given=requests_given,
                       concurrency_given=concurrency_given)
    manifest = load(s)
    _validated(s, manifest)
    result = run_sweep(manifest, target, profile, parsed, w, runtime or _default_runtime(s), sets=sets,
                       environ=s.environ, echo=echo, host_address=s.host_address, interleave=interleave)
    return report_sweep(result, echo)


# --------------------------------------------------------------------------- accuracy gate and step forensics


def equiv(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, against: str = "base",
          dtype: str = "", top_k: int = 0, greedy_tokens: int = 0, prompts: int = 0,
          echo: Log = print, show: Callable[[EquivRun], None] | None = None, record: str = "",
          url: str = "", runtime: Runtime | None = None) -> EquivRun | None:
    """`equiv`: TARGET:PROFILE against --against (base, a profile, an image or a record FILE), teacher-forced;
    exit 4 when exceeded; None when it only recorded (``record``, with ``url``: the running server). What is served
    for which options: :func:`imageforge.equiv.runner.equiv_command`."""
    from .equiv import raise_if_failed
    from .equiv.runner import equiv_command, refuse_url_options
    from .serve.openai_wire import check_url

    if url:
        refuse_url_options(record, against, profile, sets, runtime)
        check_url(url)
    resolved = _resolve(s, load(s), target, profile, sets)
    result = equiv_command(resolved, None if url else runtime or _default_runtime(s), against=against, dtype=dtype,
                           top_k=top_k, greedy_tokens=greedy_tokens, prompts=prompts, record=record, url=url,
                           sets=sets, environ=s.environ, echo=echo, host_address=s.host_address)
    if result is None:
        return None
    if show is not None:
        show(result)
    raise_if_failed(result.verdict)
    return result


def bisect(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *,
           check: Sequence[str] = (), suite: str = "", tags: str = "", repeat: int = 1, flaky: str = "fail",
           echo: Log = print, show: Callable[[BisectRun], None] | None = None,
           runtime: Runtime | None = None) -> BisectRun:
    """`bisect`: the first step whose image fails the selected checks; exit 4 when one did (or the base fails)."""
    from .errors import ConfigError
    from .forensics import raise_for
    from .forensics.bisect_runner import bisect_target
    from .smoke import parse_tags

    if not check and not suite:
        raise ConfigError("bisect needs --check NAME (repeatable; 'equiv' for the accuracy gate) or --suite FILE")
    if flaky not in ("fail", "unknown"):
        raise ConfigError("bisect --flaky must be 'fail' or 'unknown'", found=repr(flaky))
    resolved = _resolve(s, load(s), target, profile, sets)
    run = bisect_target(resolved, runtime or _default_runtime(s), checks=list(check), suite_path=suite or None,
                        tags=parse_tags(tags),
                        repeat=repeat, flaky="unknown" if flaky == "unknown" else "fail", environ=s.environ,
                        echo=echo, host_address=s.host_address)
    if show is not None:
        show(run)
    step = run.culprit
    raise_for(run.result, None if step is None else f"{step.id} ({step.location})")
    return run


def ablate(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *,
           workload: Workload, steps: str = "", repeat: int = 3, out: str = "", equiv: bool = True,
           echo: Log = print, runtime: Runtime | None = None) -> AblationRun:
    """`ablate`: each chosen step's variant without it, benched ABAB against the full image, equiv each.

    A ``runtime`` that serves one server at a time (in place): full, each variant, full, the root as before at the
    end.
    """
    from .forensics.ablate_runner import ablate_on

    resolved = _resolve(s, load(s), target, profile, sets)
    chosen = [name.strip() for name in steps.split(",") if name.strip()] or None
    return ablate_on(resolved, _workload(workload), runtime or _default_runtime(s), steps=chosen, repeats=repeat,
                     out=Path(out) if out else None, equiv=equiv, environ=s.environ, echo=echo,
                     host_address=s.host_address)


# --------------------------------------------------------------------------- what the platform builds


def submission(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, out: str,
               git: bool = False, log: Log = print) -> SubmissionResult:
    """`submission`: write (or rewrite) the tree the platform builds: root Dockerfile, computility-run.yaml, context."""
    from .flags.images import check_resolved
    from .submission import write_submission

    resolved = _resolve(s, load(s), target, profile, sets)
    note = check_resolved(resolved, s.environ)  # serving flags vs the image's own vLLM (exit 2)
    if note:
        log(note)
    return write_submission(resolved, Path(out), environ=s.environ, git=git, log=log)


def check_submission(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, out: str,
                     log: Log = print) -> int:
    """`submission --check`: compare the tree at OUT with the manifest (exit 2 listing every difference).

    Returns the number of files checked; no daemon needed (the base facts come from the tree's record).
    """
    from .submission import check_submission as check

    resolved = _resolve(s, load(s), target, profile, sets)
    return check(resolved, Path(out), environ=s.environ, log=log)


def engine(log: Log = print) -> dict[str, Any]:
    """`engine`: the Docker daemon the docker CLI would use answers; on this machine's socket, install
    Debian's docker.io and start dockerd when needed. Returns what answered."""
    from .docker_engine import client, daemon_errors, endpoint, ensure_daemon

    ensure_daemon(start=True, log=log)
    ep = endpoint()
    with daemon_errors("asking the daemon for its version"):
        version = client().version()
    return {"endpoint": ep.host, "source": ep.source, "local": ep.local, "ssh": ep.is_ssh,
            "server_version": version.get("Version"), "api_version": version.get("ApiVersion"),
            "os": version.get("Os"), "arch": version.get("Arch")}


# --------------------------------------------------------------------------- the card's box (in place)


def wheels(python: str, out: str, *, log: Log | None = None) -> Wheelhouse:
    """`wheels`: an offline wheelhouse (imageforge + runtime dependencies) for CPython ``python`` on x86_64.

    No manifest and no daemon: the wheel is built from the checkout this package was imported from.
    """
    from .wheelhouse.make import make_wheelhouse

    return make_wheelhouse(Path(out), python=python, log=log)


# --------------------------------------------------------------------------- in place (no Docker)


def apply(s: Settings, target: str | None, profile: str | None, *, root: str = "/", python: str = "python3",
          steps: Sequence[str] = (), skip: Sequence[str] = (), dry_run: bool = False, imports: bool = True,
          force: bool = False, show: Callable[[str], None] = print, log: Log = print) -> Any:
    """`apply --in-place`: TARGET:PROFILE's steps on the machine under ``root`` (journaled); ``dry_run``: the table.

    Never touches the Docker engine. The caller's environment (``s.environ``) goes to the target interpreter
    and the script steps. Returns the ApplyReport (or the dry run's CheckReport).
    """
    from . import inplace

    resolved = _resolve(s, load(s), target, profile)
    if dry_run:
        report = inplace.dry_run(resolved, root=Path(root), python=python, environ=s.environ, steps=steps, skip=skip)
        show(report.text())
        return report
    return inplace.apply(resolved, root=Path(root), python=python, environ=s.environ, steps=steps, skip=skip,
                         imports=imports, force=force, log=log)


def native_build(s: Settings, target: str | None, step: str, *, root: str = "/", python: str = "python3",
                 check: bool = False, log: Log = print) -> Any:
    """`native build --in-place`: the native step's `build:` run here, its output checked and imported, the pins
    rewritten in the manifest (``check``: compared only). Returns the NativeBuildReport."""
    from .inplace.native_build import native_build as build_native

    resolved = _resolve(s, load(s), target, None)
    return build_native(resolved, step, root=Path(root), python=python, environ=s.environ, check=check, log=log)


def revert(s: Settings, *, root: str = "/", force: bool = False, log: Log = print) -> Any:
    """`revert`: every path an in-place apply changed under ``root`` put back; the journal removed."""
    from . import inplace

    return inplace.revert(Path(root), force=force, log=log)


def status(s: Settings, *, root: str = "/") -> Any:
    """`status`: what is applied in place under ``root``, drift, and the package against its RECORD."""
    from . import inplace

    return inplace.status(Path(root))
