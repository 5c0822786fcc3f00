"""``apply --in-place``: a target's steps applied to the live file system under a root, through the journal.

Each step kind's own ``apply`` (the build's code) reads the root through :class:`LocalFS` and returns its
Changes; here they are written under the root instead of into a layer, each path journaled first
(:mod:`imageforge.inplace.journal`). A script step runs as a local process (:class:`LocalRunner`): the
paths it declares (``touches:``) are copied before it runs and diffed after; a stat-only scan of the site
directory, the interpreter's install paths and its bin directory that finds an undeclared change stops it
(exit 3, restored): :mod:`.safety`. Undo, recovery and drift: :mod:`.undo`.

The journal's ``applied`` list is compared with the plan's step keys: the same plan again is "nothing to
do"; another profile or step subset undoes the applied steps after the common prefix (last first: each
path back to its state before the step) and applies the rest in order. The last step, ``verify``, is the
image's verify program run with the target interpreter on what the journal says the steps changed
(:mod:`.verify`): hash-checked ``.pyc`` for every checked ``.py`` (journaled too), dead files listed, overlay
hashes, links, and the manifest's imports (``imports=False`` skips them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BuildError, ConfigError
from ..manifest.model import Step
from ..manifest.resolve import Resolved
from ..steps import ApplyContext, Changes, ScriptSpec, StepResult, kind
from . import changescan
from .changescan import ChangeScan
from .interrupts import deferred, interruptible
from .journal import ABSENT, Journal, State, journal_dir, same_content, state_of, walk, write_file
from .localfs import LocalFS
from .package import LocalPackage, discover_local, without_own
from .runner import LocalRunner
from .safety import expand, guard_path, root_lock, scan_tops, under
from .undo import recover, same_state, settle_drift, undo_step
from .verify import VERIFY_STEP, InPlaceVerify, changed_in_journal, check, spec_of_root, verify_step

Log = Callable[[str], None]

#: The caller's environment goes to the target interpreter and the scripts as it is; these are recorded in the
#: journal (what the steps were applied with).
RECORDED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH")


def _quiet(_line: str) -> None:
    return None


def _step_json(s: StepResult) -> dict[str, Any]:
    return {"id": s.id, "kind": s.kind, "status": s.status, "detail": s.detail, "paths": s.paths,
            "seconds": round(s.seconds, 3)}


@dataclass(frozen=True)
class ApplyReport:
    target: str
    profile: str
    root: str
    site: str
    version: str
    python: str
    steps: tuple[StepResult, ...]
    undone: tuple[str, ...]
    nothing_to_do: bool
    journal: str
    seconds: float
    verify: Mapping[str, Any] = field(default_factory=dict)
    drift_kept: tuple[str, ...] = ()
    python_why: str = ""  # why this interpreter was chosen

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "profile": self.profile, "root": self.root, "site": self.site,
                "version": self.version, "python": self.python, "python_why": self.python_why,
                "nothing_to_do": self.nothing_to_do,
                "undone": list(self.undone), "steps": [_step_json(s) for s in self.steps], "journal": self.journal,
                "seconds": round(self.seconds, 3), "verify": dict(self.verify), "drift_kept": list(self.drift_kept)}

    def text(self) -> str:
        head = (f"apply --in-place {self.target}:{self.profile} on {self.root} ({self.version} in {self.site}, "
                f"python {self.python}: {self.python_why or 'as given'})")
        out = [head]
        for path in self.drift_kept:
            out.append(f"  ! drifted copy kept at {path}")
        if self.nothing_to_do:
            out.append("  nothing to do: every step is applied (journal " + self.journal + ")")
        for step_id in self.undone:
            out.append(f"  undone   {step_id}")
        for s in self.steps:
            out.append(f"  {s.status:<8} {s.id} ({s.kind}): {s.detail} [{s.paths} path(s), {s.seconds:.2f}s]")
        out.append(f"done in {self.seconds:.2f}s; journal {self.journal}")
        return "\n".join(out)


# --------------------------------------------------------------------------- the plan


def step_key(step: Step, environ: Mapping[str, str]) -> str:
    """The step's definition and the sha256 of its host files: what the journal says is applied."""
    text = json.dumps({"definition": step.definition(), "inputs": kind(step.kind).inputs(step, environ),
                       "touches": list(step.touches)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def select_steps(resolved: Resolved, only: Sequence[str] = (), skip: Sequence[str] = ()) -> tuple[Step, ...]:
    steps = resolved.steps
    known = {s.id for s in steps}
    if only and skip:
        raise ConfigError("give --steps or --skip, not both")
    for name in (*only, *skip):
        if name not in known:
            raise ConfigError(f"no step {name!r} in {resolved.target.name}:{resolved.profile_name}",
                              expected="one of " + ", ".join(sorted(known)), found=repr(name))
    if only:
        return tuple(s for s in steps if s.id in only)
    return tuple(s for s in steps if s.id not in skip)


def python_files(steps: Sequence[Step], site: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The steps' own ``.py`` files (their kinds' facts): the verify step's key."""
    files: set[str] = set()
    for step in steps:
        files.update(kind(step.kind).facts(step, kind(step.kind).inputs(step, environ), site).python_files)
    return tuple(sorted(files))


# --------------------------------------------------------------------------- applying one step


class _Applier:
    def __init__(self, journal: Journal, pkg: LocalPackage, environ: Mapping[str, str], log: Log,
                 echo: Log) -> None:
        self.journal = journal
        self.pkg = pkg
        self.environ = environ
        self.log = log
        self.echo = echo

    def _parents(self, host: Path, step_id: str) -> list[Path]:
        """Missing directories on the way to ``host`` (journaled as made by the step)."""
        missing: list[Path] = []
        current = host.parent
        root = self.pkg.root
        while not os.path.lexists(current) and current != root:
            missing.append(current)
            current = current.parent
        for directory in reversed(missing):
            self.journal.push(directory, step_id, {"type": "dir", "mode": 0o755, "uid": os.geteuid(),
                                                   "gid": os.getegid(), "mtime_ns": None})
        return list(reversed(missing))

    def file_step(self, step: Step, key: str) -> StepResult:
        t0 = time.monotonic()
        journal = self.journal
        journal.begin(step.id, key)
        changes = kind(step.kind).apply(step, LocalFS(self.pkg.root), ApplyContext(  # .py checked (pycheck)
            site=self.pkg.site, environ=self.environ, python_version=self.pkg.python_version))
        todo = self._plan_changes(step, changes)
        journal.save()  # write-ahead: every path's original and new state before the first write
        for action in todo:
            action()
        journal.settle(step.id)  # what the disk holds now (mtimes, made directories)
        journal.complete(step.id, key, changes.detail)
        status = "applied" if todo else "already applied"
        return StepResult(step.id, step.kind, status, changes.summary, time.monotonic() - t0,
                          paths=len(journal.touched_by(step.id)))

    def _plan_changes(self, step: Step, changes: Changes) -> list[Callable[[], None]]:
        todo: list[Callable[[], None]] = []
        made: set[Path] = set()
        for f in changes.files:
            host = self.pkg.host(f.path)
            now = state_of(host)
            new: State = {"type": "file", "mode": f.mode, "uid": f.uid, "gid": f.gid, "size": len(f.data),
                          "sha256": hashlib.sha256(f.data).hexdigest()}
            if same_content(now, new) and now.get("mode") == f.mode:
                continue
            parents = [p for p in self._parents(host, step.id) if p not in made]
            made.update(parents)
            guard_path(self.pkg, host if not parents else parents[0], ())
            new["sha256"] = self.journal.keep_bytes(f.data)
            self.journal.push(host, step.id, new)
            mtime = None if f.mtime is None else int(f.mtime) * 1_000_000_000

            def write(host: Path = host, f: Any = f, mtime: int | None = mtime, parents: list[Path] = parents) -> None:
                for p in parents:
                    p.mkdir(exist_ok=True)
                write_file(host, f.data, f.mode, f.uid, f.gid, mtime)

            todo.append(write)
        for link in changes.links:
            host = self.pkg.host(link.path)
            now = state_of(host, hashed=False)
            if now["type"] == "link" and now.get("link") == link.target:
                continue
            parents = [p for p in self._parents(host, step.id) if p not in made]
            made.update(parents)
            guard_path(self.pkg, host if not parents else parents[0], (self.pkg.host(posixpath.dirname(link.path)),))
            self.journal.push(host, step.id, {"type": "link", "link": link.target})

            def make(host: Path = host, target: str = link.target, parents: list[Path] = parents) -> None:
                from .journal import make_link

                for p in parents:
                    p.mkdir(exist_ok=True)
                make_link(host, target)

            todo.append(make)
        return todo

    def script_step(self, step: Step, key: str) -> StepResult:
        t0 = time.monotonic()
        journal = self.journal
        declared = dataclasses.replace(step, touches=tuple(self.pkg.expand_scheme(t) for t in step.touches))
        patterns = kind(step.kind).touches(declared, self.pkg.site)
        if not patterns:
            raise BuildError(f"script step {step.id!r} declares nothing it may change, so it cannot run in place",
                             location=step.location, key_path=f"{step.key_path}.touches",
                             hint="add `touches:` (the paths it writes) to the step")
        roots = expand(self.pkg, patterns)
        if (copy_dest := ScriptSpec.of(step).dest) is not None:
            dest = self.pkg.host(copy_dest)
            if not under(dest, roots):
                roots.append(dest)
        for r in roots:
            guard_path(self.pkg, r, roots)
        snapshot = {str(p): journal.capture(p) for r in roots for p in walk(r)}
        for r in roots:  # a declared path not there yet, and the folders above it the script may make
            snapshot.setdefault(str(r), dict(ABSENT))
            above = r.parent
            while not os.path.lexists(above) and above != self.pkg.root:
                snapshot.setdefault(str(above), dict(ABSENT))
                above = above.parent
        snapshot_file = journal.directory / "snapshots" / f"{step.id}.json"
        snapshot_file.parent.mkdir(exist_ok=True)
        snapshot_file.write_text(json.dumps(snapshot))
        for key_ in [str(r) for r in roots] + [k for k, s in snapshot.items() if s["type"] == "absent"]:
            folder = Path(key_).parent  # the declared trees' directories: their mtimes come back with them
            if os.path.lexists(folder):
                journal.note_dir(str(folder))
        journal.begin(step.id, key, snapshot=str(snapshot_file), roots=[str(r) for r in roots])
        journal.save()
        scan = self._change_scan(roots)
        runner = LocalRunner(self.pkg.root, journal.directory / "scratch", self.environ)
        changes = kind(step.kind).apply(step, LocalFS(self.pkg.root), ApplyContext(
            site=self.pkg.site, environ=self.environ, runner=runner, echo=self.echo,
            python_version=self.pkg.python_version))
        changed, added, why = scan.changes()
        late = [p for p in expand(self.pkg, patterns) if not under(p, roots)]  # a glob's new match (a dist-info)
        undeclared = [k for k in changed if not under(Path(k), late)]
        added = [k for k in added if not under(Path(k), late)]
        if undeclared or added or why:
            for extra in sorted(added, key=lambda k: -k.count("/")):
                with contextlib.suppress(OSError):
                    gone = Path(extra)
                    gone.unlink() if not gone.is_dir() or gone.is_symlink() else gone.rmdir()
            named = sorted({*undeclared, *added})
            raise BuildError(
                f"script step {step.id!r} changed {len(named)} path(s) it does not declare; its declared paths "
                "were restored" + (f", {len(added)} added path(s) removed" if added else "")
                + (f" ({why})" if why else ""),
                location=step.location, key_path=f"{step.key_path}.touches", log_tail=named[:20],
                hint="add them to the step's `touches:` (changed files outside it cannot be restored: check them)"
                + ("; run apply again once the clock is steady" if why else ""))
        candidates = dict.fromkeys([*snapshot, *(str(p) for r in {*roots, *expand(self.pkg, patterns)}
                                                 for p in walk(r))])
        count = 0
        for key_ in candidates:
            path = Path(key_)
            now = state_of(path)
            old = snapshot.get(key_, dict(ABSENT))
            if now["type"] == "dir" and old["type"] == "dir" and now.get("mode") == old.get("mode"):
                if now.get("mtime_ns") != old.get("mtime_ns"):
                    journal.note_dir(key_, old)  # only its mtime moved (a file made and removed)
                continue
            if same_state(now, old):
                continue
            if now["type"] == "file":
                now["sha256"] = journal.keep(path)
            journal.note_dir(str(path.parent), snapshot.get(str(path.parent)))
            journal.push(path, step.id, now, original=old)
            count += 1
        journal.complete(step.id, key, changes.detail)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(snapshot_file)
        return StepResult(step.id, step.kind, "ran", changes.detail, time.monotonic() - t0, paths=count)

    def _change_scan(self, roots: Sequence[Path]) -> ChangeScan:
        """The undeclared-change scan's "before", taken right before the script (:mod:`.changescan`): exact
        states for what this apply already changed and for the folders on the way to a declared path."""
        tops, deep = scan_tops(self.pkg)
        journal = self.journal
        ways = {str(p) for r in roots for p in r.parents if any(t in p.parents for t in tops)}
        scan = ChangeScan(tops, [*roots, journal.directory], deep, journal.directory,
                          exact=[Path(k) for k in [*journal.journaled(), *journal.directories()] if k not in ways],
                          loose=[Path(k) for k in sorted(ways)], clock=changescan.KernelClock())
        scan.before()
        return scan


# --------------------------------------------------------------------------- the command


def apply(resolved: Resolved, *, root: Path = Path("/"), python: str = "python3",
          environ: Mapping[str, str] | None = None, steps: Sequence[str] = (), skip: Sequence[str] = (),
          imports: bool = True, force: bool = False, log: Log = print, echo: Log = _quiet) -> ApplyReport:
    """Apply ``resolved``'s steps (``steps``: only these ids; ``skip``: all but these) under ``root``."""
    t0 = time.monotonic()
    environ = dict(os.environ if environ is None else environ)
    root = root.resolve()
    pkg = discover_local(resolved.target, root, python, environ)  # says why it skipped imageforge's own venv
    environ = without_own(environ)  # the scripts' `python3` and `pip` are the target's, not imageforge's
    chosen = select_steps(resolved, steps, skip)
    files = python_files(chosen, pkg.site, environ)
    keys = [(s.id, step_key(s, environ)) for s in chosen]
    keys.append((VERIFY_STEP, hashlib.sha256(json.dumps([pkg.cache_tag, *files]).encode()).hexdigest()))
    header = {"target": resolved.target.name, "profile": resolved.profile_name, "python": pkg.python,
              "python_version": pkg.python_version, "site": pkg.site, "version": pkg.version,
              "distribution": resolved.target.package.distribution, "dist_info": pkg.dist_info,
              "environ": {k: environ.get(k) for k in RECORDED_ENV}, "plan": [k for _, k in keys],
              "steps": [i for i, _ in keys], "root": str(root)}
    results: list[StepResult] = []
    undone: list[str] = []
    kept: tuple[str, ...] = ()
    verified: InPlaceVerify | None = None
    with root_lock(root), interruptible():
        journal = Journal.load(root)
        if journal is not None:
            recover(journal, log)
            kept = settle_drift(journal, force, "apply")
        applied = journal.applied() if journal else []
        nothing = applied == keys
        if not nothing:
            if journal is None:
                journal = Journal.create(root, header)
            else:
                journal.update_header(header)
            prefix = 0
            while prefix < min(len(applied), len(keys)) and applied[prefix] == keys[prefix]:
                prefix += 1
            for step_id, _ in reversed(applied[prefix:]):
                with deferred():
                    undo_step(journal, step_id)
                undone.append(step_id)
            applier = _Applier(journal, pkg, environ, log, echo)
            by_id = {s.id: s for s in chosen}
            for step_id, key in keys[prefix:]:
                try:
                    if step_id == VERIFY_STEP and step_id not in by_id:
                        spec = spec_of_root(chosen, resolved.target, pkg, environ,
                                             changed_in_journal(journal, pkg), imports=imports)
                        verified = verify_step(journal, pkg, environ, spec, key)
                        v = verified.verdict()
                        results.append(StepResult(
                            VERIFY_STEP, "verify", "applied", f"{v['checked'].get('python', 0)} .py -> "
                            f"{len(verified.result['compiled'])} hash-checked .pyc"
                            + (f", {len(v['run'])} run by a script compiled" if v["run"] else "")
                            + (f", {len(v['dead'])} dead (listed, not compiled): " + ", ".join(v["dead"][:8])
                               + (f" and {len(v['dead']) - 8} more (--json lists them)" if len(v["dead"]) > 8
                                  else "") if v["dead"] else ""),
                            verified.seconds, paths=len(journal.touched_by(VERIFY_STEP))))
                    elif kind(by_id[step_id].kind).runs_process:
                        results.append(applier.script_step(by_id[step_id], key))
                    else:
                        results.append(applier.file_step(by_id[step_id], key))
                except BaseException:
                    with deferred():
                        if journal.in_progress():
                            undo_step(journal, step_id)
                    raise
                log(f"  {results[-1].status:<8} {step_id}: {results[-1].detail}")
    if verified is None:  # verify applied before: check the tree as it is (nothing written)
        changed = changed_in_journal(journal, pkg) if journal is not None else []
        verified = check(pkg, environ, spec_of_root(chosen, resolved.target, pkg, environ, changed, imports=imports))
    outcome = verified.to_json()
    report = ApplyReport(resolved.target.name, resolved.profile_name, str(root), pkg.site, pkg.version, pkg.python,
                         tuple(results), tuple(undone), nothing, str(journal_dir(root)), time.monotonic() - t0,
                         outcome, kept, pkg.python_why)
    if not outcome["ok"]:
        raise BuildError(f"in-place verification of {resolved.target.name} failed "
                         f"({len(outcome['problems'])} problem(s)); the steps stay applied (`revert` undoes them)",
                         log_tail=outcome["problems"])
    return report
