"""``imageforge preflight --in-place``: the phases of preflight that need no Docker, over this machine's files.

For the card's machine (no daemon, the vendor image as a plain machine): one run, the same findings and report as
the Docker run (:mod:`.run`), nothing written. Phases: validate -> the steps as ``apply --in-place --dry-run``
sees them (:func:`imageforge.inplace.dry_run`: the file steps against the files under the root, the ``.py`` files
they would write compiled by the target interpreter in one call) -> the vendor API record's versions against the
target interpreter's -> the script steps' shipped folders read statically (bash -n, shellcheck, cp sources, device
imports, pins, shipped shared objects, CRLF, Dockerfile RUN exit codes) -> the serving env -> git. Script steps are
never run (one ``info`` finding names each and the commands that run it for real); each Docker phase left out is
one note saying why (:data:`SKIPPED`).
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ImageforgeError
from ..inplace.package import LocalPackage
from ..manifest.model import Manifest, Step, resolve_image_path
from ..manifest.resolve import Resolved, resolve
from ..patches.check import CheckReport
from ..steps import one_file
from ..vendor_api import VendorApi, load_record
from .binaries import shipped_so_findings
from .findings import Finding, PhaseClock, PreflightReport
from .gitstate import git_findings
from .run import file_step_producers, host_inputs, problem_findings, shipped_folders, version_findings
from .runfile import RUN_FILE, manifest_env_findings, run_file_findings
from .shell import (
    Script,
    bash_n,
    build_device_imports,
    cp_sources,
    crlf,
    pins,
    python_heredocs,
    run_exit_codes,
    shell_scripts,
    shellcheck,
)
from .tree import ShippedFolder

Log = Callable[[str], None]

#: The Docker run's phases an in-place run leaves out, each with why (one note line each in the report).
SKIPPED: dict[str, str] = {
    "python": "imports, vendor names and call arities over the final tree: not checked in place (the final tree "
              "holds what the script steps write, and they are not run); the .py files the file steps write and "
              "the script steps run are compiled by the target interpreter",
    "flags": "serving flags against the patched parser: not checked in place (the parser is learnt from the tree "
             "after every step, script steps included)",
    "submission": "the submission tree: not rendered in place (it needs the base image's facts from Docker)",
    "script-names": "shellcheck's unset variables: names set only by a sourced file are not dismissed in place "
                    "(that takes running the script's assignments; nothing is run)",
}

_PROBLEM = re.compile(r"^(?P<path>.*?):(?P<line>\d+): (?P<message>.*)$", re.DOTALL)


def _step_findings(report: CheckReport, producers: Mapping[str, str], hint: str) -> list[Finding]:
    """The dry run's table and final state (check-patches' CheckReport) as findings."""
    out: list[Finding] = []
    for row in report.rows:
        if row.ok:
            continue
        loc = row.location
        near = "; ".join(f"line {m.line}: {m.text.strip()}" for m in row.near[:3]) or None
        out.append(Finding("step", f"step {row.step}" + (f" ({row.path})" if row.path else "")
                           + f": {row.status}: {row.detail}", loc.file if loc else "",
                           loc.line if loc else None, step=row.step, found=near, hint=hint))
    if report.version_problem:
        out.append(Finding("package-version", report.version_problem, "", expected=None, found=None,
                           hint="run it with the target's interpreter (--python), or fix package.version"))
    for problem in report.final.problems:
        m = _PROBLEM.match(problem)
        path, line, message = (m["path"], int(m["line"]), m["message"]) if m else ("", None, problem)
        out.append(Finding("py-syntax", message.splitlines()[0] if message else problem, path, line,
                           step=producers.get(path), found=report.final.compiled_by or None,
                           expected="compiles with the target's interpreter"))
    return out


def _script_steps(steps: Sequence[Step]) -> list[Step]:
    from ..steps.script import ScriptSpec

    return [st for st in steps if isinstance(st.spec, ScriptSpec)]


def _not_run(resolved: Resolved, scripts: Sequence[Step], root: Path, python: str) -> Finding | None:
    """The one info finding: the script steps this run does not execute, and the journaled commands that do."""
    if not scripts:
        return None
    profile = resolved.profile_name if resolved.profile_name in resolved.target.profiles else None
    where = f" --target {resolved.target.name}" + (f" --profile {profile}" if profile else "")
    where += f" --root {shlex.quote(str(root))} --python {shlex.quote(python)}"
    ids = ",".join(st.id for st in scripts)
    first = scripts[0].location
    return Finding("script-not-run", f"script step(s) not run by an in-place preflight (it never changes the "
                   f"machine): {', '.join(st.id for st in scripts)}", first.file if first else "",
                   first.line if first else None,
                   found="their shipped files are read statically only (bash -n, shellcheck, cp sources, pins, "
                         "CRLF, device imports, shared objects)",
                   hint=f"run and check them for real, journaled: imageforge apply --in-place{where} --steps {ids}"
                        f" && imageforge revert --root {shlex.quote(str(root))}")


def _names_set(steps: Mapping[str, Step], environ: Mapping[str, str]) -> Callable[[Script], frozenset[str]]:
    """What a script step would run with here (inplace.runner): the caller's environment, the step's env and
    IMAGEFORGE_ROOT; nothing is run to learn more."""
    from ..steps.script import ScriptSpec

    def names(script: Script) -> frozenset[str]:
        step = steps.get(script.folder.step)
        env = dict(step.spec.env) if step is not None and isinstance(step.spec, ScriptSpec) else {}
        return frozenset({*environ, *env, "IMAGEFORGE_ROOT"})
    return names


def _shipped_python(folders: Sequence[ShippedFolder], pkg: LocalPackage,
                    environ: Mapping[str, str]) -> tuple[list[Finding], str | None, int]:
    """Every ``.py`` a script step's folder runs or imports (the dead-file rule: ``scripts.deadfiles``) and every
    ``python - <<EOF`` body of its shell scripts, compiled by the target interpreter in one call: the findings,
    a note when that interpreter did not run the compile, and how many were compiled."""
    from ..inplace.verify import compile_sources
    from ..scripts.deadfiles import live_files

    sources: list[tuple[str, str, str]] = []
    for folder in folders:
        dest = folder.dest.rstrip("/")
        for rel in live_files(folder.host, folder.command):
            if rel.endswith(".py") and (folder.host / rel).is_file():
                sources.append((f"{dest}/{rel}", (folder.host / rel).read_text(encoding="utf-8", errors="replace"),
                                folder.step))
    for sc in shell_scripts(folders):
        sources += [(sc.image_path, text, sc.folder.step) for _, text in python_heredocs(sc)]
    if not sources:
        return [], None, 0
    compiled = compile_sources(pkg, environ, [(path, text) for path, text, _ in sources])
    if compiled is None:
        return [], (f"the script steps' .py files: not compiled (the target interpreter {pkg.python} did not run "
                    "the compile)"), 0
    out = [Finding("py-syntax", message, sources[i][0], line, column, step=sources[i][2],
                   expected=f"compiles with the target's Python {compiled.python}", found=text.strip() or None,
                   hint="a script step runs this file on the card: it aborts there (or, under try/except, a "
                        "feature is silently off)")
           for i, message, line, column, text in compiled.errors]
    return out, None, len(sources)


def _shipped_findings(manifest: Manifest, resolved: Resolved, folders: Sequence[ShippedFolder], root: Path,
                      pkg: LocalPackage | None, api: VendorApi | None, environ: Mapping[str, str]) -> list[Finding]:
    """The shipped folders' scripts and files, read on this machine (the Docker run's "scripts" phase); the shared
    objects only with the target's package (``pkg``: its site directory, its interpreter)."""
    from ..inplace import LocalFS
    from ..inplace.package import image_path

    out: list[Finding] = []
    names = _names_set({st.id: st for st in resolved.steps}, environ)
    for sc in shell_scripts(folders):
        out += bash_n(sc) + shellcheck(sc, names) + cp_sources(sc) + build_device_imports(sc)
    for folder in folders:
        out += pins(folder)
    if pkg is not None:
        interpreter = image_path(root, pkg.python) if Path(pkg.python).is_relative_to(root) else None
        library_path = [d for d in resolved.serving_env().get("LD_LIBRARY_PATH", "").split(":")
                        if d.startswith("/")]
        out += shipped_so_findings(folders, LocalFS(root), site=pkg.site, interpreter=interpreter,
                                   library_path=library_path, api=api)
    site = pkg.site if pkg is not None else "<site>"
    overlays = [(st.source_path, resolve_image_path(one_file(st) or "", site), st.id) for st in resolved.steps
                if st.source_path is not None and one_file(st)]
    out += crlf(folders, [(p, shown, sid) for p, shown, sid in overlays if p is not None])
    dockerfiles = {manifest.root / "Dockerfile", *(f.host.parent / "Dockerfile" for f in folders)}
    for dockerfile in sorted(d for d in dockerfiles if d.is_file()):
        out += run_exit_codes(dockerfile)
    return out


def run_local_preflight(load: Callable[[], Manifest], validate: Callable[[Manifest], Any], target_name: str | None,
                        profile_name: str | None, *, root: Path, python: str, environ: Mapping[str, str],
                        strict: bool = False, allow_dirty: bool = False, log: Log) -> PreflightReport:
    """The report of the in-place phases (the caller prints it and fails with exit 3 when it is not ok)."""
    from .. import inplace

    clock = PhaseClock()
    mark = clock.mark
    findings: list[Finding] = []
    notes: list[str] = []
    stats: dict[str, int] = {}

    def report(target: str, profile: str | None) -> PreflightReport:
        return PreflightReport(target, profile, tuple(findings), strict, tuple(clock.ran), tuple(notes),
                               clock.elapsed(), stats, clock.phases)
    try:
        manifest = load()
    except ConfigError as exc:
        findings += problem_findings(exc, "validate")
        mark("validate")
        return report(target_name or "?", profile_name)
    try:
        validate(manifest)
    except ConfigError as exc:
        findings += problem_findings(exc, "validate")
    mark("validate")
    try:
        resolved = resolve(manifest, target_name, profile_name, environ=environ)
    except ConfigError:  # validate's finding already: nothing below can be told without the resolved steps
        notes.append("the target does not resolve: the in-place phases did not run")
        return report(target_name or "?", profile_name)
    target, profile = resolved.target, resolved.profile_name
    root = root.resolve()
    log(f"preflight in place: {target.name}" + (f":{profile}" if profile else "") + f" under {root}")
    pkg: LocalPackage | None = None
    dry: CheckReport | None = None
    try:
        pkg = inplace.discover_local(target, root, python, environ, check_version=False)
        dry = inplace.dry_run(resolved, root=root, python=python, environ=environ)
    except ImageforgeError as exc:
        findings += problem_findings(exc, "step")
        notes.append("the target interpreter's package could not be read: the steps, the vendor API versions, the "
                     "shipped shared objects and the compile of the scripts' .py files were not checked")
        pkg = dry = None  # nothing below the package can be told
    steps = list(resolved.steps)
    scripts = _script_steps(steps)
    if dry is not None and pkg is not None:
        notes.append(f"in place: {root} (python {pkg.python}, {pkg.python_version}; "
                     f"{target.package.distribution} {pkg.version})")
        producers = file_step_producers(steps, pkg.site)
        findings += _step_findings(dry, producers, f"imageforge apply --in-place --dry-run --target {target.name}"
                                   f" --root {shlex.quote(str(root))} --python {shlex.quote(python)}")
        if dry.final.skipped:
            notes.append(f"final state: not compiled: {dry.final.skipped}")
        stats["compiled .py"] = dry.final.python
    not_run = _not_run(resolved, scripts, root, python)
    if not_run is not None:
        findings.append(not_run)
    mark("steps")
    api: VendorApi | None = None
    if target.vendor_api is not None and target.vendor_api.is_file():
        with contextlib.suppress(ConfigError):  # its format problems are validate's findings already
            api = load_record(target.vendor_api)
    if api is not None and pkg is not None:
        findings += version_findings(api, pkg.version, pkg.python_version, target.package.distribution,
                                     where="the target interpreter's")
        mark("vendor-api")
    folders = shipped_folders(steps, environ)
    findings += _shipped_findings(manifest, resolved, folders, root, pkg, api, environ)
    if pkg is not None:
        shipped_py, why, stats["scripts' .py compiled"] = _shipped_python(folders, pkg, environ)
        findings += shipped_py
        notes += [why] if why else []
    stats["scripts"] = len(shell_scripts(folders))
    mark("scripts")
    findings += manifest_env_findings(manifest, target, resolved)
    findings += run_file_findings([manifest.root / RUN_FILE, *(f.host.parent / RUN_FILE for f in folders)])
    mark("run-env")
    findings += git_findings(host_inputs(manifest, steps, environ, target.vendor_api), allow_dirty=allow_dirty)
    mark("git")
    notes += [f"{phase}: {why}" for phase, why in SKIPPED.items()]
    return report(target.name, profile)

