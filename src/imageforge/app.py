"""The front door: one function per invoke task, and nothing else calls the library for a user.

Each function takes the command's :class:`~imageforge.settings.Settings` (the tool options, resolved
once from the command line and the environment), loads the manifest once, resolves the target
and hands frozen values to the stage functions, lowest stage first::

    manifest -> resolve -> plan -> base -> build (verify inside) -> run -> smoke/bench -> export

Nothing here reads ``os.environ`` directly: it comes in through ``Settings.environ``.  The
modules below are imported inside the functions so that ``invoke --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import Settings

if TYPE_CHECKING:
    from .build import BuildResult
    from .checkpatches import CheckReport, PatchFromResult
    from .export import ExportResult
    from .housekeeping import CleanResult
    from .manifest import Manifest
    from .plan import PlanReport
    from .resolve import Resolved, ValidationSummary
    from .run import Server

Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


def settings(*, manifest: str = "", traceback: bool = False, host_address: str = "") -> Settings:
    """The command's Settings from its options ("" = not given)."""
    return Settings.from_cli(manifest=manifest or None, traceback=traceback, host_address=host_address or None)


def load(s: Settings) -> Manifest:
    from .manifest import load_manifest

    return load_manifest(s.manifest)


def _resolve(s: Settings, manifest: Manifest, target: str | None, profile: str | None,
             sets: Sequence[str] = ()) -> Resolved:
    from .resolve import resolve

    return resolve(manifest, target, profile, environ=s.environ, sets=sets)


# --------------------------------------------------------------------------- manifest, plan, base, build


def validate(s: Settings) -> ValidationSummary:
    """`validate`: YAML, schema, files, paths and every profile of every target."""
    from .flagcheck import check_validate
    from .resolve import validate_all

    summary = validate_all(load(s))
    return replace(summary, notes=tuple(check_validate(summary.manifest, s.environ)))


def plan(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *,
         use_daemon: bool) -> PlanReport:
    """`plan`: resolve, then ask the daemon (when one answers) what is cached."""
    from .base import daemon_probe
    from .flagcheck import check_resolved
    from .plan import PlanReport, make_plan

    resolved = _resolve(s, load(s), target, profile, sets)
    probe = daemon_probe() if use_daemon else None
    note = check_resolved(resolved, s.environ, use_daemon=probe is not None)
    return PlanReport(make_plan(resolved, environ=s.environ, probe=probe), notes=(note,) if note else ())


def base(s: Settings, target: str | None, log: Log = print) -> str:
    """`base`: the Docker engine, the target's base image (made from its recipe) and its model."""
    from .build import prepare_base

    return prepare_base(_resolve(s, load(s), target, None), s.environ, log).ref


def build(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, verbose: bool,
          quiet: bool, locked: bool = False) -> BuildResult:
    """`build`: every layer of TARGET:PROFILE built or reused, verified, tagged."""
    from .build import build_target
    from .flagcheck import check_resolved

    resolved = _resolve(s, load(s), target, profile, sets)
    note = check_resolved(resolved, s.environ)  # exit 2 before any build work
    if note and not quiet:
        print(note)
    return build_target(resolved, environ=s.environ, echo=_quiet if quiet else print, verbose=verbose,
                        locked=locked)


# --------------------------------------------------------------------------- tools around the engine


def check_patches(s: Settings, target: str | None, profile: str | None, *, diff: bool,
                  show: Callable[[CheckReport], None]) -> CheckReport:
    """`check-patches`: ``show`` the report, then fail (exit 3) when a step would not apply."""
    from .checkpatches import check_patches as check
    from .checkpatches import fail_if_broken
    from .flagcheck import check_target

    manifest = load(s)
    report = check(manifest, target, profile, environ=s.environ, diff=diff)
    show(report)
    fail_if_broken(report)
    check_target(manifest, target, s.environ)  # the serving flags against the parser after the steps
    return report


def patch_from(s: Settings, target: str | None, file: str, edited: str, *, against_base: bool,
               id_prefix: str) -> PatchFromResult:
    """`patch-from`: the anchored patch steps that turn an image file into EDITED."""
    from .checkpatches import patch_from as derive

    return derive(load(s), target, file, edited, environ=s.environ, against_base=against_base, id_prefix=id_prefix)


def lock(s: Settings, target: str | None) -> tuple[Path, dict[str, Any]]:
    """`lock`: write the target's entry of build.lock."""
    from .housekeeping import write_lock

    return write_lock(_resolve(s, load(s), target, None), s.environ)


def export(s: Settings, target: str | None, profile: str | None, *, out: str | None, push: str | None,
           gzip_: bool, save: bool, quiet: bool) -> ExportResult:
    """`export`: the tarball, its sha256 and description of TARGET:PROFILE; ``push`` to a registry."""
    from .export import export as do_export

    return do_export(_resolve(s, load(s), target, profile), environ=s.environ, out=out, push=push, gzip_=gzip_,
                     save=save, log=_quiet if quiet else print)


def clean(s: Settings, *, keep: int, dry_run: bool, target: str | None, min_age: float) -> CleanResult:
    """`clean`: remove the labelled images and containers no retention rule keeps."""
    from .housekeeping import clean as do_clean

    return do_clean(load(s), keep=keep, dry_run=dry_run, target=target, min_age=min_age)


# --------------------------------------------------------------------------- serving


def run(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, base: bool,
        port: int | None, timeout: float | None) -> Server:
    """`run`: start TARGET:PROFILE (built first if needed) on the host address, wait until ready, leave it."""
    from .run import start_detached

    resolved = _resolve(s, load(s), target, profile, sets)
    return start_detached(resolved, base=base, port=port, timeout=timeout, host_address=s.host_address)


def stop(target: str | None, *, every: bool) -> list[str]:
    """`stop`: remove the servers `run` started (``every``: smoke runs' and tests' too)."""
    from .run import stop_servers

    return stop_servers(target, every=every)


# The smoke and bench tasks still load their manifest and read the host address from the
# environment themselves (tasks.py sets it from --host-address); they move onto Settings next.


def smoke(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, url: str | None,
          suite: str | None, tags: str | None, base: bool, port: int | None, wait: float) -> Any:
    """`smoke`: the suite against --url, or build + start + check + remove TARGET:PROFILE."""
    from .smoke import smoke_for_cli

    return smoke_for_cli(str(s.manifest), target, profile, sets, url=url, suite=suite, tags=tags, base=base,
                         port=port, wait=wait)


def demo(s: Settings) -> Any:
    """`demo`: Docker engine, cpu base, build and smoke of the cpu target, from nothing."""
    from .smoke import demo_for_cli

    return demo_for_cli(str(s.manifest))


def bench(s: Settings, target: str | None, profile: str | None, sets: Sequence[str], *, url: str | None,
          port: int | None, workload: Sequence[Any]) -> Any:
    """`bench`: load-test --url, or build + serve + bench + remove TARGET:PROFILE."""
    from .bench import bench_for_cli, workload_from_cli

    return bench_for_cli(str(s.manifest), target, profile, sets, url=url, workload=workload_from_cli(*workload),
                         port=port)


def sweep(s: Settings, target: str | None, profile: str | None, params: Sequence[str], sets: Sequence[str], *,
          workload: Sequence[Any], requests_given: bool, concurrency_given: bool) -> Any:
    """`sweep`: one build + serve + bench per combination of --param values."""
    from .bench import sweep_for_cli, workload_from_cli

    return sweep_for_cli(str(s.manifest), target, profile, params, sets, workload=workload_from_cli(*workload),
                         requests_given=requests_given, concurrency_given=concurrency_given)
