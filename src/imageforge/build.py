"""The build engine: one cached layer per step, through the docker SDK.

Stack for ``<target>:<profile>``::

    base image -> shared steps -> profile steps -> verify -> serving config + CMD

* Each step is its kind's ``apply`` (:mod:`imageforge.steps`, the code check-patches runs too): a
  file kind (overlay, patch, symlink) never starts a process: a container is *created* from the
  parent image, its files are read with ``get_archive``, the returned Changes are written back
  with ``put_archive`` and the container is committed. A process kind (script) starts the
  container and ``exec``s the script, so its environment never enters the container config,
  the image config or the history.
* Every layer is labelled with its chained cache key (see :mod:`imageforge.plan`); an image
  with the key is reused without doing anything.
* Each commit passes the parent's ENTRYPOINT/CMD/ENV/WORKDIR/USER back explicitly, so the
  base image's config survives; only the final layer changes CMD (and adds serving ENV).
* Tags move only after verification passed, under a per-image file lock. The verify layer's import check of
  ``verify.imports`` runs with ``verify_imports`` (``build --verify-imports``) only: by default the first
  server start proves the imports (:mod:`imageforge.verify`), and the build table says so.

:func:`build` takes a plan and its base and only builds and tags; :func:`build_target` is the
build stage for a resolved target: the run directory, the lock check, the base, the plan (under
the image lock), then :func:`build`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .base import (
    BaseIdentity,
    DaemonProbe,
    FixedBase,
    PackageInfo,
    base_reference,
    discover_package,
    missing_variable_error,
)
from .base.identity import committed_ids_file
from .docker_engine import client, daemon_errors, ensure_daemon
from .docker_engine.containers import (
    Containers,
    containers,
    file_entry,
    process_overrides,
    symlink_entry,
    tar_of,
)
from .errors import BuildError, ImageforgeError, InfraError
from .labels import (
    L_BASE,
    L_CREATED,
    L_FINAL,
    L_KEY,
    L_KIND,
    L_MANIFEST,
    L_PROFILE,
    L_REVISION,
    L_RUN,
    L_STEP,
    L_TARGET,
    L_TOOL,
    L_VERIFIED,
    LABEL,
    TOOL,
)
from .lock import check_lock
from .manifest.model import Step, Target
from .manifest.resolve import Resolved
from .plan import Plan, PlannedStep, canonical, make_plan
from .rundirs import RunLog, image_lock, new_run_id
from .scripts.run import IDLE_LOOP
from .steps import SERVING_CONFIG, ApplyContext, Changes, ContainerFS, Entry, StepProblem, StepResult, kind
from .steps.fs import kept_listing
from .verify import (
    VerifySpec,
    changed_label,
    changed_of_labels,
    changed_py,
    encode_changed,
    verified_contents,
    verified_label_content,
    verify_context,
    verify_image,
    verify_spec,
)

Log = Callable[[str], None]


def git_revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------- steps


@dataclass(kw_only=True)
class Builder:
    """Builds one plan's layers on one base, in ``scope`` (the containers it starts are removed with it)."""

    plan: Plan
    log: Log
    verbose: bool
    run_id: str
    scope: Containers
    base_ref: str
    base_id: str
    environ: Mapping[str, str]
    verify_imports: bool = False  # run verify's import check (else: left to the first server start)
    info: PackageInfo | None = field(init=False, default=None)

    @functools.cached_property
    def revision(self) -> str:
        """The manifest checkout's git revision, for the labels: asked only when a layer is committed
        (two git processes; a no-op build commits nothing)."""
        return git_revision(self.resolved.manifest.root)

    @property
    def resolved(self) -> Resolved:
        return self.plan.resolved

    @property
    def target(self) -> Target:
        return self.plan.resolved.target

    @property
    def plan_steps(self) -> list[Step]:
        """The manifest steps of the plan, in order (verify blames a failed import on one)."""
        return [p.step for p in self.plan.steps if p.step is not None]

    # -- common -------------------------------------------------------------

    def labels(self, planned: PlannedStep, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        r = self.resolved
        labels = {
            L_TOOL: TOOL,
            L_KIND: planned.stage,
            L_KEY: planned.key or "",
            L_TARGET: self.target.name,
            L_MANIFEST: r.manifest.digest,
            L_RUN: self.run_id,
            L_BASE: self.base_id,
            L_REVISION: self.revision,
            L_CREATED: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            f"{L_STEP}.{planned.id}.key": planned.key or "",
        }
        for name, digest in planned.inputs.items():
            labels[f"{L_STEP}.{planned.id}.sha256.{name}"] = digest
        if extra:
            labels.update(extra)
        return labels

    def commit(self, container: Any, planned: PlannedStep, parent_config: Mapping[str, Any],
               conf: Mapping[str, Any] | None = None, extra_labels: Mapping[str, str] | None = None) -> str:
        config = {
            "Entrypoint": parent_config.get("Entrypoint"),
            "Cmd": parent_config.get("Cmd"),
            "Env": parent_config.get("Env"),
            "WorkingDir": parent_config.get("WorkingDir") or "",
            "User": parent_config.get("User") or "",
            "Labels": self.labels(planned, extra_labels),
        }
        config.update(conf or {})
        with daemon_errors(f"committing step {planned.id}"):
            image = container.commit(message=f"{TOOL} {planned.kind} {planned.id}", author=TOOL, conf=config)
            got = client().images.get(image.id).attrs["Config"] or {}
        for key in ("Entrypoint", "Cmd", "WorkingDir", "User"):
            if (got.get(key) or None) != (config.get(key) or None):
                raise BuildError(
                    f"committing step {planned.id} changed the image's {key}",
                    expected=json.dumps(config.get(key)), found=json.dumps(got.get(key)),
                    hint="a base image with neither ENTRYPOINT nor CMD cannot keep them empty through "
                    "`docker commit`; give the base a CMD",
                )
        _remember_committed(str(image.id))
        return str(image.id)

    # -- steps: each kind's apply (imageforge.steps), written into a step container and committed ----------

    def run_step(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        """One manifest step: its kind's ``apply`` on the parent's files, the Changes written, the container committed.

        A file kind never starts a process (the container is only created; its files are read with
        get_archive and the Changes put back with put_archive); a process kind (script) runs in the
        started container, so its environment never enters the container config, the image config or
        the history.
        """
        import docker.errors

        step = planned.step
        assert step is not None and self.info is not None
        definition = kind(step.kind)
        parent_config = client().images.get(parent).attrs["Config"] or {}
        what = f"script step {step.id}" if definition.runs_process else f"step {step.id}"
        with daemon_errors(what):
            overrides = process_overrides(parent_config, IDLE_LOOP) if definition.runs_process else {}
            container = self.scope.create(parent, labels={L_KIND: f"step-{step.kind}"}, **overrides)
            try:
                if definition.runs_process:
                    container.start()
                ctx = ApplyContext(site=self.info.site, environ=self.environ, container=container, image=parent,
                                   python_version=self.info.python_version,
                                   echo=(lambda line: self.log(f"    | {line}")) if self.verbose else None)
                try:
                    # a file kind's container is only read until apply returns: its files are the parent's
                    fs = BuildFS(self, container, step, pristine=not definition.runs_process)
                    changes = definition.apply(step, fs, ctx)
                except StepProblem as problem:
                    raise problem.error from None
                if not changes.empty and not container.put_archive("/", changes_tar(changes)):
                    raise InfraError(f"Docker refused to write the files of step {step.id}")
                extra: dict[str, str] = {}
                if definition.runs_process:
                    # kill, not stop: the idle loop only sees TERM after its `sleep 1` (stop took ~1 s)
                    with contextlib.suppress(docker.errors.APIError):
                        container.kill()
                    # what the script added or changed, for verify (the layer's diff; a HIT layer keeps it)
                    extra[changed_label(step.id)] = encode_changed(changed_py(container.diff() or []))
                return self.commit(container, planned, parent_config, extra_labels=extra), changes.summary
            finally:
                self.scope.remove(container)

    def listing_is_the_base(self, directory: str, step: Step) -> bool:
        """Whether ``directory`` reads in ``step``'s container as in the base image: no script step before this
        one, and no file step writing into, over or above the directory (its listing is then kept by the base's
        ID: :func:`imageforge.steps.fs.kept_listing`)."""
        assert self.info is not None
        prefix = directory.rstrip("/") + "/"
        for planned in self.plan.steps:
            earlier = planned.step
            if earlier is None or earlier is step:
                break
            definition = kind(earlier.kind)
            if definition.runs_process:
                return False
            paths = definition.touches(earlier, self.info.site)
            if any(p == directory.rstrip("/") or p.startswith(prefix) or prefix.startswith(p + "/") for p in paths):
                return False
        return True

    # -- verify / config ----------------------------------------------------

    def verify_spec(self, image: str) -> VerifySpec:
        """What verify checks on this plan, with the content's context (the imports only if ``verify_imports``);
        ``image``: the last step's layer (or the verify layer), whose labels name what script steps changed."""
        assert self.info is not None
        changed = changed_of_labels(client().images.get(image).labels)
        spec = verify_spec(self.plan, self.info.site, changed, self.environ)
        return replace(spec, context=verify_context(self.plan, self.base_id, self.info.python, spec, self.environ),
                       verified=verified_contents(), check_imports=self.verify_imports)

    def run_verify(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        assert self.info is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        spec = self.verify_spec(parent)
        with daemon_errors("verifying"):
            report = verify_image(self.scope, parent, parent_config, self.target, self.info, spec, log=self.log,
                                  verbose=self.verbose, steps=self.plan_steps)
        image_id = self.commit(report.container, planned, parent_config,
                               extra_labels={L_VERIFIED: canonical(report.summary())})
        self.scope.remove(report.container)
        return image_id, ("REUSED " if report.reused else "") + report.text()

    def imports_on_cached(self, image_id: str) -> str:
        """``--verify-imports`` on a verify layer built before (a HIT): its content's imports, unless they passed
        before (REUSED: no container), checked now in a container from the layer (nothing committed)."""
        labels = client().images.get(image_id).labels or {}
        content = verified_label_content(labels)
        if content is not None and content in verified_contents():
            return f"imports REUSED (content {content[:12]} verified before)"
        if self.info is None:
            with daemon_errors("discovering the package"):
                self.info = discover_package(self.base_id, self.target, self.scope, self.log)
        parent_config = client().images.get(image_id).attrs["Config"] or {}
        with daemon_errors("verifying"):
            report = verify_image(self.scope, image_id, parent_config, self.target, self.info,
                                  self.verify_spec(image_id), log=self.log, verbose=self.verbose, steps=self.plan_steps)
        self.scope.remove(report.container)
        return report.text() + " (on the cached layer)"

    def run_config(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        parent_config = client().images.get(parent).attrs["Config"] or {}
        serving = self.target.serving
        changes = SERVING_CONFIG.apply(self.plan)
        conf = SERVING_CONFIG.image_config(self.plan, parent_config)
        with daemon_errors("writing the serving config"):
            container = self.scope.create(parent, labels={L_KIND: "config"})
            try:
                container.put_archive("/", changes_tar(changes))
                image_id = self.commit(
                    container, planned, parent_config, conf=conf,
                    extra_labels={L_PROFILE: self.resolved.profile_name, L_FINAL: "true",
                                  f"{LABEL}.serving-config": serving.config_path},
                )
            finally:
                self.scope.remove(container)
        return image_id, f"{changes.summary}; CMD {json.dumps(conf['Cmd'])}"


def _remember_committed(image_id: str) -> None:
    """Note a layer this build committed (author and message imageforge's) where the cache probe looks first, so
    the next no-op build does not inspect each layer once to learn it (see DaemonProbe._committed_by_imageforge)."""
    with contextlib.suppress(OSError):
        path = committed_ids_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:  # one short line per ID: concurrent builds append whole lines
            f.write(image_id + "\n")


class BuildFS(ContainerFS):
    """The step container's files as a step kind reads them; a directory no earlier step changed is listed as the
    base image's (kept by its ID, shared by every chain on that base)."""

    def __init__(self, builder: Builder, container: Any, step: Step, *, pristine: bool = False) -> None:
        super().__init__(container, pristine=pristine)
        self.builder = builder
        self.step = step

    def list_dir(self, directory: str) -> list[tuple[str, Entry]]:
        if self.builder.listing_is_the_base(directory, self.step):
            return kept_listing(self.builder.base_id, directory, lambda: self.read_dir(directory))
        return super().list_dir(directory)


def changes_tar(changes: Changes) -> bytes:
    """The tar stream that writes a step's Changes (files with their mode/owner/mtime, then links)."""
    entries: list[tarfile.TarInfo] = []
    payloads: dict[str, bytes] = {}
    for f in changes.files:
        extra = {} if f.mtime is None else {"mtime": f.mtime}
        entries.append(file_entry(f.path, f.data, mode=f.mode, uid=f.uid, gid=f.gid, **extra))
        payloads[entries[-1].name] = f.data
    entries += [symlink_entry(link.path, link.target) for link in changes.links]
    return tar_of(entries, payloads)


# --------------------------------------------------------------------------- building a plan


@dataclass(frozen=True)
class BuildResult:
    run_id: str
    target: str
    profile: str
    image_id: str
    tags: tuple[str, ...]
    steps: tuple[StepResult, ...]
    seconds: float
    run_dir: Path

    @property
    def built(self) -> int:
        return sum(1 for s in self.steps if s.status != "HIT")

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "target": self.target, "profile": self.profile, "image_id": self.image_id,
            "tags": list(self.tags), "seconds": round(self.seconds, 3), "run_dir": str(self.run_dir),
            "steps": [{"id": s.id, "kind": s.kind, "stage": s.stage, "cache": s.status, "key": s.key,
                       "image_id": s.image_id, "seconds": round(s.seconds, 3), "detail": s.detail}
                      for s in self.steps],
        }


def build(plan: Plan, base: BaseIdentity, *, runlog: RunLog, verbose: bool = False,
          started: float | None = None, environ: Mapping[str, str] | None = None,
          verify_imports: bool = False) -> BuildResult:
    """Build (or reuse) every layer of ``plan`` on ``base`` and move its tags; nothing else.

    The caller holds the image lock and owns the run directory (``runlog``); ``started`` is when the
    whole build began (default: now), for the seconds reported. ``verify_imports``: verify imports
    ``verify.imports`` (also on a cached verify layer whose content has not passed them yet); by default the
    first server start proves them.
    """
    t_start = time.monotonic() if started is None else started
    resolved = plan.resolved
    run_id = runlog.run_id
    labels = {L_TOOL: TOOL, L_RUN: run_id, L_MANIFEST: resolved.manifest.digest, L_TARGET: resolved.target.name}
    n = len(plan.steps)
    runlog(f"build {resolved.target.name}:{resolved.profile_name}  run {run_id}  base {base.ref} "
           f"({base.image_id.split(':')[-1][:12]})")
    results: list[StepResult] = []
    with containers(labels) as scope:
        builder = Builder(plan=plan, log=runlog, verbose=verbose, run_id=run_id, scope=scope,
                          base_ref=base.ref, base_id=base.image_id,
                          environ=os.environ if environ is None else environ, verify_imports=verify_imports)
        parent = base.image_id
        if any(s.cache != "HIT" for s in plan.steps):
            with daemon_errors("discovering the package"):
                builder.info = discover_package(base.image_id, resolved.target, scope, runlog)
        for i, planned in enumerate(plan.steps, 1):
            t0 = time.monotonic()
            assert planned.key is not None
            if planned.image_id is not None:
                image_id, cache, detail = planned.image_id, "HIT", ""
                if planned.stage == "verify" and verify_imports:
                    detail = builder.imports_on_cached(image_id)
            else:
                runner = {"verify": builder.run_verify, "config": builder.run_config}.get(planned.stage,
                                                                                         builder.run_step)
                image_id, detail = runner(planned, parent)
                cache = ("SKIPPED" if detail.startswith("already applied")
                         else "REUSED" if detail.startswith("REUSED ") else "BUILT")
                detail = detail.removeprefix("REUSED ")
            dt = time.monotonic() - t0
            results.append(StepResult(planned.id, planned.kind, cache, detail, dt, stage=planned.stage,
                                      key=planned.key, image_id=image_id))
            runlog(f"  [{i}/{n}] {cache:<7} {planned.kind:<8} {planned.id:<28} {dt:6.2f}s"
                   + (f"  {detail}" if detail else ""))
            parent = image_id
    with daemon_errors("tagging"):
        image = client().images.get(parent)
        for tag in plan.tags:
            if tag in image.tags:  # already there (a no-op rebuild): ~30 ms per tag saved
                continue
            repo, _, tag_name = tag.rpartition(":")
            image.tag(repo, tag_name)
    result = BuildResult(run_id, resolved.target.name, resolved.profile_name, parent, plan.tags,
                         tuple(results), time.monotonic() - t_start, runlog.dir)
    runlog(f"tagged {', '.join(plan.tags)} -> {parent.split(':')[-1][:12]}  "
           f"({result.built} of {n} steps built, {result.seconds:.1f}s)")
    return result


# --------------------------------------------------------------------------- the build stage of a target


def build_target(resolved: Resolved, *, environ: Mapping[str, str], echo: Log = print, verbose: bool = False,
                 make_base: bool = True, locked: bool = False, verify_imports: bool = False) -> BuildResult:
    """Build (or reuse) every layer of the resolved target/profile and move its tags.

    Writes ``plan.json``, ``build.log`` and ``summary.json`` in a new run directory.
    ``locked``: first compare the inputs with build.lock (ConfigError, exit 2, on any drift).
    ``verify_imports``: verify imports the target's ``verify.imports`` (``build --verify-imports``); by default
    they are left to the first server start.
    """
    t_start = time.monotonic()
    target = resolved.target
    if target.base.recipe is None and target.base.reference(environ) is None:
        raise missing_variable_error(target)  # before touching Docker: the vendor image reference is missing
    for step in resolved.steps:
        kind(step.kind).preflight(step, environ)  # e.g. a script's unset ${VAR} or missing folder: exit 5 before Docker
    root = resolved.manifest.root
    runlog = RunLog(root, new_run_id(), echo)
    run_id = runlog.run_id
    try:
        with daemon_errors("building"):  # any SDK call outside a narrower scope: still no traceback
            ensure_daemon(log=runlog)
            if locked:
                check_lock(resolved, environ, runlog)
            with daemon_errors("preparing the build"):
                base = base_reference(resolved, environ, runlog, make=make_base)
            with image_lock(root, target.image):
                plan = make_plan(resolved, environ=environ, probe=FixedBase(DaemonProbe(), base.image_id))
                runlog.write_json("plan.json", plan.to_json())
                result = build(plan, base, runlog=runlog, verbose=verbose, started=t_start, environ=environ,
                               verify_imports=verify_imports)
        runlog.write_json("summary.json", result.to_json())
        return result
    except ImageforgeError as exc:
        runlog.write_json("summary.json", {"run_id": run_id, "target": target.name,
                                           "profile": resolved.profile_name, "ok": False, "exit_code": exc.exit_code,
                                           "error": exc.render()})
        raise
    except KeyboardInterrupt:
        runlog.write_json("summary.json", {"run_id": run_id, "ok": False, "exit_code": 130, "error": "interrupted"})
        raise
    finally:
        runlog.close()


def prepare_base(resolved: Resolved, environ: Mapping[str, str], log: Log = print, *,
                 start: bool | None = None) -> BaseIdentity:
    """Make sure the Docker engine answers and the target's base image (and model) exist.

    ``start``: install and start a local dockerd when none answers (`base`, `test`); see ensure_daemon.
    """
    ensure_daemon(start=start, log=log)
    with daemon_errors("making the base image"):
        return base_reference(resolved, environ, log, make=True)
