"""`check-patches`: patches that cannot rot.

* :func:`check_steps` dry-runs a target's steps against an :class:`ImageFS` -- the real base
  image through a created, never started container, or a dict in unit tests -- with each kind's
  own ``apply`` (:mod:`imageforge.steps`, the code the build runs): the Changes it returns are
  recorded on an in-memory :class:`Overlay`, so steps that touch the same file see each other's
  result, in manifest order; nothing is written, nothing is built.  Script steps run for real in a
  throwaway :class:`ScriptSandbox` (the same ``apply`` again) when one is given.
* :func:`image_session` opens the target's base image for reading (what `patch-from`,
  :mod:`imageforge.patches.from_image`, reads too).

The pure parts (everything but :func:`check_patches`, :func:`image_session`, :class:`ScriptSandbox`
and :class:`ContainerFS`) need no daemon.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import labels as lb
from ..base import base_reference, discover_package, missing_variable_error
from ..cli.progress import progress
from ..docker_engine import client, daemon_errors, ensure_daemon
from ..docker_engine import containers as dc
from ..errors import BuildError, Location
from ..manifest.model import Manifest, Step, Target
from ..manifest.resolve import resolve
from ..scripts.run import IDLE_LOOP
from ..steps import ApplyContext, Changes, ContainerFS, DictFS, Entry, FileMeta, ImageFS, StepProblem, kind
from ..steps.core import RowStatus, text_of
from .anchored import NearMatch
from .pycheck import check_python

__all__ = ["AFTER_FAILED_SCRIPT", "OK_STATUSES", "CheckReport", "CheckRow", "ContainerFS", "DictFS", "Entry",
           "FinalState", "ImageFS", "Overlay", "ScriptOutcome", "ScriptSandbox", "check_patches", "check_steps",
           "final_state", "image_session", "script_sandbox", "to_stderr"]

Log = Callable[[str], None]

OK_STATUSES: frozenset[str] = frozenset({"applies", "already applied", "not checked", "ran"})
AFTER_FAILED_SCRIPT = "not checked (a script before failed)"


# --------------------------------------------------------------------------- the image's file system
# Entry, ImageFS, DictFS and ContainerFS live in imageforge.steps.fs (the step kinds read them); imported above.


# --------------------------------------------------------------------------- checking steps


@dataclass(frozen=True)
class CheckRow:
    step: str
    kind: str
    profile: str | None
    path: str
    status: RowStatus
    detail: str
    near: tuple[NearMatch, ...] = ()
    diff: str = ""
    location: Location | None = None
    log_tail: tuple[str, ...] = ()  # a failed script's last output lines

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "profile": self.profile, "path": self.path,
                "status": self.status, "ok": self.ok, "detail": self.detail,
                "near": [{"line": m.line, "text": m.text, "ratio": m.ratio} for m in self.near],
                "diff": self.diff, "location": str(self.location) if self.location else None,
                "log_tail": list(self.log_tail)}


@dataclass(frozen=True)
class ScriptOutcome:
    """What running a script step for real gave: the image's files afterwards, or the failure."""

    exit_code: int | None
    fs: ImageFS | None  # the files after the script (None when it failed)
    detail: str
    log_tail: tuple[str, ...] = ()


#: Runs one script step on the files as the steps so far leave them (``Overlay``); see ScriptSandbox.
ScriptRunner = Callable[[Step, "Overlay"], ScriptOutcome]


@dataclass
class Overlay:
    """The in-memory result of the steps checked so far, on top of an ImageFS."""

    fs: ImageFS
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    meta: dict[str, FileMeta] = field(default_factory=dict)

    def copy(self) -> Overlay:
        return Overlay(self.fs, dict(self.files), dict(self.links), dict(self.meta))

    def record(self, changes: Changes) -> None:
        """What a step's apply returned becomes what the later steps read."""
        for f in changes.files:
            self.files[f.path] = f.data
            self.meta[f.path] = FileMeta(f.mode, f.uid, f.gid, f.mtime)
            self.links.pop(f.path, None)
        for link in changes.links:
            self.links[link.path] = link.target
            self.files.pop(link.path, None)
            self.meta.pop(link.path, None)

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]:
        """The image's listing (the in-memory changes of earlier steps are not listed)."""
        return self.fs.list_dir(directory)

    def read_file(self, path: str) -> tuple[bytes, FileMeta] | None:
        if path in self.files:
            return self.files[path], self.meta.get(path, FileMeta())
        return self.fs.read_file(path)

    def stat(self, path: str) -> Entry | None:
        if path in self.links:
            return Entry("link", self.links[path])
        if path in self.files:
            return Entry("file")
        entry = self.fs.stat(path)
        if entry is None and any(p.startswith(path.rstrip("/") + "/") for p in [*self.files, *self.links]):
            return Entry("dir")
        return entry

    def read(self, path: str) -> bytes | None:
        if path in self.files:
            return self.files[path]
        return self.fs.read(path)

    def identity(self, path: str) -> tuple[str | int, ...] | None:
        """The image's identity of ``path`` (see ContainerFS.identity); None for what an earlier step changed."""
        if path in self.files or path in self.links:
            return None
        method = getattr(self.fs, "identity", None)
        return None if method is None else method(path)


def _row(step: Step, path: str, status: RowStatus, detail: str, *, blame: str | None = None,
         near: tuple[NearMatch, ...] = (), diff: str = "") -> CheckRow:
    location = step.where(blame) if blame else step.location
    return CheckRow(step.id, step.kind, step.profile, path, status, detail, near, diff, location)


_text = text_of


def _short(path: str, site: str) -> str:
    site = site.rstrip("/")
    return path[len(site) + 1:] if path.startswith(site + "/") else path


def _step_path(step: Step, site: str) -> str:
    return kind(step.kind).row_path(step, site)


def check_file_step(step: Step, state: Overlay, site: str, *, with_diff: bool, python_version: str = "") -> CheckRow:
    """A file kind's ``apply`` (the build's code) on the overlay; its Changes recorded there, its result the row."""
    try:
        changes = kind(step.kind).apply(step, state, ApplyContext(site=site, checking=True, with_diff=with_diff,
                                                                  python_version=python_version))
    except StepProblem as problem:
        return _row(step, problem.path, problem.status, problem.detail, blame=problem.blame, near=problem.near)
    state.record(changes)
    return _row(step, changes.path, changes.status, changes.detail, diff=changes.diff)


def check_script(step: Step, state: Overlay, run_script: ScriptRunner | None) -> CheckRow:
    """A process kind: the runner (ScriptSandbox: the kind's ``apply`` in a throwaway container) or "not checked"."""
    path = _step_path(step, "")
    if run_script is None:
        return CheckRow(step.id, step.kind, step.profile, path, "not checked",
                        "script: runs only at build time (later checks do not see its changes)",
                        location=step.location)
    with progress(f"check-patches: script step {step.id}"):  # no total: a bar that shows it is running
        outcome = run_script(step, state)
    if outcome.fs is None or outcome.exit_code != 0:
        return CheckRow(step.id, step.kind, step.profile, path, "script failed", outcome.detail,
                        location=step.location, log_tail=outcome.log_tail)
    # the later steps see the image as the script left it
    state.fs = outcome.fs
    state.files.clear()
    state.links.clear()
    return CheckRow(step.id, step.kind, step.profile, path, "ran", outcome.detail, location=step.location)


def check_step(step: Step, state: Overlay, site: str, *, with_diff: bool,
               run_script: ScriptRunner | None = None, python_version: str = "") -> CheckRow:
    if kind(step.kind).runs_process:
        return check_script(step, state, run_script)
    return check_file_step(step, state, site, with_diff=with_diff, python_version=python_version)


def check_steps(shared: Sequence[Step], profiles: Mapping[str, Sequence[Step]], fs: ImageFS, site: str, *,
                with_diff: bool = False, run_script: ScriptRunner | None = None,
                python_version: str = "", finals: dict[str, Overlay] | None = None,
                ) -> tuple[list[CheckRow], Overlay]:
    """Rows for the shared steps, then for each profile's steps (on a copy of the shared result).

    A profile step inherited by several profiles is reported once.  Returns the rows and the
    state after the shared steps.  With ``run_script``, script steps run for real (the later
    steps are checked against what they leave); without it they are "not checked".  After a
    script that failed, the later steps are "not checked (a script before failed)".
    """
    state = Overlay(fs)
    failed = False

    def one(step: Step, on: Overlay) -> CheckRow:
        nonlocal failed
        if failed:
            return CheckRow(step.id, step.kind, step.profile, _step_path(step, site), "not checked",
                            AFTER_FAILED_SCRIPT, location=step.location)
        row = check_step(step, on, site, with_diff=with_diff, run_script=run_script, python_version=python_version)
        failed = row.status == "script failed"
        return row

    rows = [one(step, state) for step in shared]
    shared_failed = failed
    seen: set[str] = {r.step for r in rows}
    for name, steps in profiles.items():
        pstate = state.copy()
        if finals is not None:
            finals[name] = pstate
        failed = shared_failed
        for step in steps:
            row = one(step, pstate)
            if step.id not in seen:
                rows.append(row)
                seen.add(step.id)
    return rows, state


@dataclass(frozen=True)
class FinalState:
    """What verify checks without importing, on the files as every step leaves them (one line per problem)."""

    python: int = 0
    overlays: int = 0
    links: int = 0
    problems: tuple[str, ...] = ()
    skipped: str = ""  # why the final state was not checked
    compiled_by: str = ""  # the target interpreter that compiled the .py files ("": this machine's Python)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        if self.skipped:
            return f"final state: not checked ({self.skipped})"
        head = (f"final state: {self.python} changed .py file(s) compile"
                + (f" (compiled by {self.compiled_by})" if self.compiled_by else "")
                + f", {self.overlays} overlay hash(es), {self.links} link(s)")
        return head + (": ok" if self.ok else ": " + str(len(self.problems)) + " problem(s)") + "".join(
            f"\n  ! {p}" for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "overlays": self.overlays, "links": self.links,
                "problems": list(self.problems), "skipped": self.skipped, "compiled_by": self.compiled_by,
                "ok": self.ok}


def final_state(steps: Sequence[Step], state: Overlay, site: str, *, environ: Mapping[str, str],
                python_version: str, script_changed: Sequence[str] = ()) -> FinalState:
    """Every changed ``.py`` (the steps' and what a script step changed) compiles as the base's Python, every
    overlay's file still has its source's sha256, every link a step made is there (verify's checks, no import)."""
    python: dict[str, None] = {}
    overlays: dict[str, str] = {}
    links: list[str] = []
    for step in steps:
        definition = kind(step.kind)
        facts = definition.facts(step, definition.inputs(step, environ), site)
        python.update(dict.fromkeys(facts.python_files))
        overlays.update(facts.overlays)
        links.extend(facts.links)
    python.update(dict.fromkeys(p for p in script_changed if p.endswith(".py")))
    problems: list[str] = []
    for path in python:
        try:
            data = state.read(path)
        except BuildError as exc:
            problems.append(f"{path}: cannot read it ({exc.message})")
            continue
        if data is None:
            continue  # removed by a later step: nothing to compile (verify lists it as missing only for its own)
        text = _text(data)
        if text is None:
            problems.append(f"{path}: not UTF-8 text")
            continue
        problem = check_python(text, path, python_version=python_version, lines=())
        if problem is not None:
            problems.append(problem.text().replace("\n", "\n    "))
    for path, digest in overlays.items():
        data = state.read(path)
        if data is None:
            problems.append(f"{path}: the overlaid file is gone")
        elif hashlib.sha256(data).hexdigest() != digest:
            problems.append(f"{path}: sha256 differs from the overlay's source (a later step changed it)")
    for link in links:
        entry = state.stat(link)
        if entry is None or entry.kind != "link":
            problems.append(f"{link}: the link a step made is not there")
    return FinalState(len(python), len(overlays), len(links), tuple(problems))


@dataclass(frozen=True)
class CheckReport:
    target: str
    base_ref: str
    base_id: str
    site: str
    package_version: str
    version_problem: str | None
    rows: tuple[CheckRow, ...]
    with_diff: bool
    final: FinalState = field(default_factory=FinalState)

    @property
    def failed(self) -> tuple[CheckRow, ...]:
        return tuple(r for r in self.rows if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failed and self.version_problem is None and self.final.ok

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "base": {"reference": self.base_ref, "image_id": self.base_id},
                "site": self.site, "package_version": self.package_version,
                "version_problem": self.version_problem, "ok": self.ok, "rows": [r.to_json() for r in self.rows],
                "final": self.final.to_json()}

    def text(self) -> str:
        out = [f"check-patches {self.target}: base {self.base_ref} ({self.base_id.split(':')[-1][:12]}), "
               f"package {self.package_version} in {self.site}"]
        if self.version_problem:
            out.append(f"  ! {self.version_problem}")
        headers = ("#", "step", "kind", "file", "status", "detail")
        body = [(str(i), r.step + (f" ({r.profile})" if r.profile else ""), r.kind, _short(r.path, self.site),
                 r.status, r.detail) for i, r in enumerate(self.rows, 1)]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
        widths[3] = min(widths[3], 60)
        fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
        out.append(fmt.format(*headers))
        out.append(fmt.format(*("-" * w for w in widths[:-1]), "-" * 6))
        for row, cells in zip(self.rows, body, strict=True):
            out.append(fmt.format(*cells).rstrip())
            for m in row.near:
                out.append(f"{'':>{widths[0]}}  near line {m.line} ({m.ratio:.0%}): {m.text.strip()}")
            if row.location is not None and not row.ok:
                out.append(f"{'':>{widths[0]}}  at {row.location}")
            for line in row.log_tail:
                out.append(f"{'':>{widths[0]}}  | {line}")
        if self.with_diff:
            for row in self.rows:
                if row.diff:
                    out.append("")
                    out.append(f"# {row.step}")
                    out.append(row.diff.rstrip("\n"))
        failed = len(self.failed)
        out.append("")
        out.append(self.final.text())
        if failed:
            out.append(f"{len(self.rows) - failed} of {len(self.rows)} step(s) ok, {failed} would fail")
        elif not self.final.ok:
            out.append(f"{len(self.rows)} of {len(self.rows)} step(s) apply, but the final state has "
                       f"{len(self.final.problems)} problem(s) (above)")
        else:
            out.append(f"{len(self.rows)} of {len(self.rows)} step(s) ok")
        return "\n".join(out)


# --------------------------------------------------------------------------- against the daemon


class ScriptSandbox:
    """ScriptRunner against the daemon: each script step runs for real, in a throwaway container.

    The container comes from the step's parent (the base image, or the previous script's throwaway
    image) with the in-memory changes of the file steps checked since written into it; the network is
    off and no resource limit is set (the daemon's defaults). A script that exits 0 is committed to a
    throwaway image that the later steps are read from; :meth:`close` removes every container and
    image it made (a failed script leaves none).
    """

    def __init__(self, base_id: str, environ: Mapping[str, str], labels: Mapping[str, str], *,
                 keep_failed: bool = False) -> None:
        self.image = base_id
        self.environ = environ
        self.labels = {**labels, lb.L_KIND: "check-patches-script"}
        self.images: list[str] = []
        self.scope = dc.Containers(self.labels)
        self.changed: dict[str, None] = {}  # files a script added or changed (docker diff), in order
        self.added: set[str] = set()  # those of them that are new (docker diff kind 1)
        self.last_diff: list[tuple[str, int]] = []  # the last script's docker diff: (path, kind 0/1/2)
        # preflight: a failed script's container is committed too, and its outcome carries the files as the
        # script left them (what a Dockerfile RUN that discards the exit code builds); the row still fails
        self.keep_failed = keep_failed

    def __call__(self, step: Step, state: Overlay) -> ScriptOutcome:
        import docker.errors

        self.last_diff = []
        parent_config = client().images.get(self.image).attrs["Config"] or {}
        container = self.scope.create(self.image, network_disabled=True,
                                      **dc.process_overrides(parent_config, IDLE_LOOP))
        try:
            container.start()
            self._materialise(container, state)
            try:
                changes = kind(step.kind).apply(step, ContainerFS(container), ApplyContext(
                    site="", environ=self.environ, checking=True, container=container, image=self.image))
            except StepProblem as problem:
                if not self.keep_failed:
                    return ScriptOutcome(problem.script_exit_code, None, problem.detail, tuple(problem.log_tail))
                failed: StepProblem | None = problem
            else:
                failed = None
            with contextlib.suppress(docker.errors.APIError):
                container.kill()
            self.last_diff = [(str(c["Path"]), int(c.get("Kind", -1))) for c in container.diff() or ()]
            for path, change_kind in self.last_diff:
                if change_kind in (0, 1):  # modified, added (2: deleted)
                    self.changed[path] = None
                    if change_kind == 1:
                        self.added.add(path)
            image = container.commit(message=f"imageforge check-patches {step.id}", conf={"Labels": self.labels})
            self.images.append(str(image.id))
            self.image = str(image.id)
        finally:
            self.scope.remove(container)
        reader = self.scope.create(self.image, entrypoint=["/bin/true"], command=[])
        if failed is not None:
            return ScriptOutcome(failed.script_exit_code, ContainerFS(reader, pristine=True), failed.detail,
                                 tuple(failed.log_tail))
        return ScriptOutcome(0, ContainerFS(reader, pristine=True),
                             changes.detail.replace("exit 0:", "exit 0 (network off):", 1))

    @staticmethod
    def _materialise(container: Any, state: Overlay) -> None:
        """Write the file steps' in-memory results into the container, as the build writes their Changes.

        Each file keeps the mode/owner/mtime its step's Changes gave it (a patched file: the image's; an overlay:
        the step's); a file recorded without them keeps the mode of the file it replaces.
        """
        if not state.files and not state.links:
            return
        entries = []
        payloads: dict[str, bytes] = {}
        for path, data in sorted(state.files.items()):
            meta = state.meta.get(path)
            if meta is None:
                mode = 0o644
                with contextlib.suppress(BuildError):
                    found = dc.read_file(container, path)
                    if found is not None:
                        mode = found[1].mode
                meta = FileMeta(mode)
            extra = {} if meta.mtime is None else {"mtime": meta.mtime}
            entries.append(dc.file_entry(path, data, mode=meta.mode, uid=meta.uid, gid=meta.gid, **extra))
            payloads[entries[-1].name] = data
        entries += [dc.symlink_entry(link, target) for link, target in sorted(state.links.items())]
        if not container.put_archive("/", dc.tar_of(entries, payloads)):
            raise BuildError("the daemon refused to write the checked files into the script's container")

    def close(self) -> None:
        self.scope.close()
        api = client().api
        for image in reversed(self.images):
            with contextlib.suppress(Exception):
                api.remove_image(image, force=True, noprune=False)
        self.images.clear()


@contextlib.contextmanager
def script_sandbox(base_id: str, target: Target, environ: Mapping[str, str], *,
                   keep_failed: bool = False) -> Iterator[ScriptSandbox]:
    sandbox = ScriptSandbox(base_id, environ, {lb.L_TOOL: lb.TOOL, lb.L_TARGET: target.name},
                            keep_failed=keep_failed)
    try:
        yield sandbox
    finally:
        sandbox.close()


@dataclass(frozen=True)
class _Session:
    target: Target
    base_ref: str
    base_id: str
    site: str
    version: str
    version_problem: str | None
    python_version: str
    fs: ImageFS
    shared: tuple[Step, ...]
    profiles: Mapping[str, tuple[Step, ...]]
    python: str = "python3"  # the base's interpreter (discovered)


@contextlib.contextmanager
def image_session(manifest: Manifest, target_name: str | None, profile: str | None, *, environ: Mapping[str, str],
                  log: Log) -> Iterator[_Session]:
    """Open the target's base image for reading: resolve, discover the package, create one container."""
    target = manifest.target(target_name)
    names: list[str | None] = [profile] if profile else [*sorted(target.profiles)] or [None]
    resolved_all = [resolve(manifest, target.name, name, environ=environ) for name in names]
    resolved = resolved_all[0]
    with daemon_errors("reading the base image"):
        if target.base.recipe is None and target.base.reference(environ) is None:
            raise missing_variable_error(target)
        ensure_daemon(log=log)
        base_ref, base_id = base_reference(resolved, environ, log, make=False)
        labels = {lb.L_TOOL: lb.TOOL, lb.L_TARGET: target.name, lb.L_KIND: "check-patches"}
        with dc.containers(labels) as scope:
            info = discover_package(base_id, target, scope, log, check_version=False)
            problem = None
            if target.package.version != "*" and info.version != target.package.version:
                problem = (f"{target.package.distribution} in the base image is {info.version}, the manifest says "
                           f"{target.package.version} (targets.{target.name}.package.version)")
            container = scope.create(base_id, entrypoint=["/bin/true"], command=[])
            profiles = {r.profile_name: r.profile_steps for r in resolved_all if r.profile_steps}
            yield _Session(target, base_ref, base_id, info.site, info.version, problem, info.python_version,
                           ContainerFS(container, pristine=True),
                           resolved.shared_steps, profiles, info.python)


def to_stderr(line: str) -> None:
    """The commands' default log: each line on stderr (stdout is for results)."""
    print(line, file=sys.stderr)


def check_patches(manifest: Manifest, target: str | None, profile: str | None, *, environ: Mapping[str, str],
                  diff: bool, log: Log = to_stderr) -> CheckReport:
    """`invoke check-patches`: the report (the caller prints it, then fails when it is not ok)."""
    with image_session(manifest, target, profile, environ=environ, log=log) as s, \
            daemon_errors("reading files of the base image"), script_sandbox(s.base_id, s.target, environ) as sandbox:
        finals: dict[str, Overlay] = {}
        rows, state = check_steps(s.shared, s.profiles, s.fs, s.site, with_diff=diff, run_script=sandbox,
                                  python_version=s.python_version, finals=finals)
        if any(not r.ok for r in rows):
            final = FinalState(skipped="a step does not apply")
        else:
            site_prefix = s.site.rstrip("/") + "/"
            changed = [p for p in sandbox.changed if p.startswith(site_prefix)]  # the package's own files
            final = final_state(s.shared, state, s.site, environ=environ, python_version=s.python_version,
                                script_changed=changed)
            for name, pstate in finals.items():
                more = final_state([*s.shared, *s.profiles[name]], pstate, s.site, environ=environ,
                                   python_version=s.python_version, script_changed=changed)
                final = FinalState(max(final.python, more.python), max(final.overlays, more.overlays),
                                   max(final.links, more.links),
                                   final.problems + tuple(f"({name}) {p}" for p in more.problems
                                                          if p not in final.problems))
        return CheckReport(s.target.name, s.base_ref, s.base_id, s.site, s.version, s.version_problem,
                           tuple(rows), diff, final)


def fail_if_broken(report: CheckReport) -> None:
    if report.ok:
        return
    bad = report.failed
    parts = [f"{r.step}: {r.status}" for r in bad]
    if report.version_problem:
        parts.append(report.version_problem)
    parts.extend(p.split("\n", 1)[0] for p in report.final.problems)
    if bad:
        message = f"{len(bad)} step(s) would fail on the base image of target {report.target!r}"
    elif not report.final.ok:
        message = f"the final state of target {report.target!r} fails what verify checks"
    else:
        message = "the package version differs from the manifest"
    raise BuildError(message,
                     found="; ".join(parts),
                     hint="`invoke check-patches --diff` shows each change; `invoke patch-from` writes new anchors")
