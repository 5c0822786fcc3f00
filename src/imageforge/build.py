"""The build engine: one cached layer per step, through the docker SDK.

Stack for ``<target>:<profile>``::

    base image -> shared steps -> profile steps -> verify -> serving config + CMD

* File steps (overlay, patch, symlink) never start a process: a container is *created*
  from the parent image, files are read with ``get_archive``, changed on the host, written
  back with ``put_archive`` and the container is committed.
* Script steps start one container and ``exec`` the script, so their environment never
  enters the container config, the image config or the history.
* Every layer is labelled with its chained cache key (see :mod:`imageforge.plan`); an image
  with the key is reused without doing anything.
* Each commit passes the parent's ENTRYPOINT/CMD/ENV/WORKDIR/USER back explicitly, so the
  base image's config survives; only the final layer changes CMD (and adds serving ENV).
* Tags move only after verification passed, under a per-image file lock.

:func:`build` takes a plan and its base and only builds and tags; :func:`build_target` is the
build stage for a resolved target: the run directory, the lock check, the base, the plan (under
the image lock), then :func:`build`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import json
import os
import posixpath
import subprocess
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
from .base.identity import discovery_cache_dir
from .docker_engine import client, daemon_errors, ensure_daemon
from .docker_engine.containers import (
    Containers,
    containers,
    file_entry,
    is_dir,
    is_symlink,
    list_dir,
    path_stat,
    process_overrides,
    read_file,
    symlink_entry,
    tar_of,
)
from .errors import BuildError, ConfigError, ImageforgeError, InfraError
from .housekeeping import check_lock
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
from .manifest import Step, resolve_image_path
from .patching import apply_patch, describe
from .plan import Plan, PlannedStep, canonical, fit_argv, fit_command, make_plan, serving_argv
from .resolve import Resolved
from .runs import RunLog, image_lock
from .runs import new_run_id as new_run_id  # smoke and bench still import it from here
from .scripts import IDLE_LOOP, SCRIPT_SCRATCH, exec_script, script_directory
from .verify import verify_image, verify_spec

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


@dataclass(frozen=True)
class StepResult:
    id: str
    kind: str
    stage: str
    cache: str  # HIT, BUILT, SKIPPED (already applied)
    key: str
    image_id: str
    seconds: float
    detail: str = ""


class Builder:
    def __init__(self, plan: Plan, *, log: Log, verbose: bool, run_id: str, scope: Containers,
                 base_ref: str, base_id: str, environ: Mapping[str, str] | None = None) -> None:
        self.plan = plan
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.resolved = plan.resolved
        self.target = plan.resolved.target
        self.log = log
        self.verbose = verbose
        self.run_id = run_id
        self.scope = scope
        self.base_ref = base_ref
        self.base_id = base_id
        self.base_config: dict[str, Any] = client().images.get(base_id).attrs["Config"] or {}
        self.revision = git_revision(self.resolved.manifest.root)
        self.info: PackageInfo | None = None

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
            L_CREATED: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
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
            image = container.commit(message=f"imageforge {planned.kind} {planned.id}", author=TOOL, conf=config)
            got = client().images.get(image.id).attrs["Config"] or {}
        for key in ("Entrypoint", "Cmd", "WorkingDir", "User"):
            if (got.get(key) or None) != (config.get(key) or None):
                raise BuildError(
                    f"committing step {planned.id} changed the image's {key}",
                    expected=json.dumps(config.get(key)), found=json.dumps(got.get(key)),
                    hint="a base image with neither ENTRYPOINT nor CMD cannot keep them empty through "
                    "`docker commit`; give the base a CMD",
                )
        return str(image.id)

    def site_path(self, path: str) -> str:
        assert self.info is not None
        return resolve_image_path(path, self.info.site)

    def guard_symlinks(self, container: Any, path: str, step: Step) -> None:
        """Refuse destinations that go through a symlink inside the package's site directory."""
        assert self.info is not None
        site = self.info.site.rstrip("/")
        if not path.startswith(site + "/"):
            return
        current = site
        for part in path[len(site) + 1:].split("/")[:-1]:
            current = f"{current}/{part}"
            stat = path_stat(container, current)
            if stat is None:
                return
            if is_symlink(stat):
                raise BuildError(
                    f"destination {path} goes through a symbolic link in the image ({current} -> "
                    f"{stat.get('linkTarget')})",
                    location=step.location, key_path=step.key_path,
                    hint="write to the real path instead",
                )

    # -- file steps ---------------------------------------------------------

    def run_file_step(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        step = planned.step
        assert step is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        with daemon_errors(f"step {step.id}"):
            container = self.scope.create(parent, labels={L_KIND: f"step-{step.kind}"})
            try:
                payloads: dict[str, bytes] = {}
                entries: list[tarfile.TarInfo] = []
                detail = ""
                if step.kind == "overlay":
                    detail = self.overlay(container, step, entries, payloads)
                elif step.kind == "patch":
                    detail = self.patch(container, step, entries, payloads)
                elif step.kind == "symlink":
                    detail = self.symlink(container, step, entries)
                if entries and not container.put_archive("/", tar_of(entries, payloads)):
                    raise InfraError(f"Docker refused to write the files of step {step.id}")
                return self.commit(container, planned, parent_config), detail
            finally:
                self.scope.remove(container)

    def overlay(self, container: Any, step: Step, entries: list[tarfile.TarInfo],
                payloads: dict[str, bytes]) -> str:
        dest = self.site_path(step.spec["dest"])
        self.guard_symlinks(container, dest, step)
        data = step.source.read_bytes()
        if "mode" in step.spec:
            mode = int(step.spec["mode"])
        else:
            mode = 0o755 if os.access(step.source, os.X_OK) else 0o644
        uid, gid = (int(x) for x in str(step.spec.get("owner", "0:0")).split(":"))
        existing = path_stat(container, dest)
        if existing is not None and is_dir(existing):
            raise BuildError(f"overlay destination {dest} is a directory in the image",
                             location=step.where("dest"), key_path=f"{step.key_path}.dest")
        entries.append(file_entry(dest, data, mode=mode, uid=uid, gid=gid))
        payloads[entries[-1].name] = data
        return f"{'replaced' if existing else 'added'} {dest} ({len(data)} bytes, mode {mode:o})"

    def patch(self, container: Any, step: Step, entries: list[tarfile.TarInfo], payloads: dict[str, bytes]) -> str:
        path = self.site_path(step.spec["file"])
        self.guard_symlinks(container, path, step)
        found = read_file(container, path)
        if found is None:
            raise BuildError(
                f"patch target {path} does not exist in the image",
                location=step.where("file"), key_path=f"{step.key_path}.file",
                hint="check the path with `invoke check-patches`",
            )
        data, member = found
        text = data.decode("utf-8")
        outcome = apply_patch(text, step.spec["old"], step.spec["new"], int(step.spec.get("count", 1)))
        if outcome.status == "already-applied":
            return "already applied: skipped"
        if outcome.result is None:
            raise BuildError(
                f"patch {step.id!r} does not apply to {path}: {describe(outcome)}",
                location=step.where("old"), key_path=f"{step.key_path}.old",
                expected=f"the anchor exactly {outcome.expected} time(s)",
                found=f"{outcome.found} time(s)",
                hint="`invoke check-patches --diff` shows every patch; `invoke patch-from` writes new anchors",
            )
        new_data = outcome.result.encode("utf-8")
        # Keep the file's mode, owner and mtime: a same-size edit then looks unchanged to
        # timestamp-based .pyc files, which is exactly what verification must defeat.
        entries.append(file_entry(path, new_data, mode=member.mode, uid=member.uid, gid=member.gid,
                                  mtime=int(member.mtime)))
        payloads[entries[-1].name] = new_data
        return f"patched {path} at line {', '.join(map(str, outcome.lines))}"

    def glob_listing(self, container: Any, directory: str, step: Step) -> list[tuple[str, bool]]:
        """(name, is directory) of ``directory``'s entries.

        get_archive streams the whole directory (torch/lib: ~1 s), so the listing is cached per
        base image when no earlier step can have changed it: no script step before this one, and
        no file step writing into, over or above the directory.
        """
        import hashlib

        prefix = directory.rstrip("/") + "/"
        cacheable = True
        for planned in self.plan.steps:
            earlier = planned.step
            if earlier is None or earlier is step:
                break
            if earlier.kind == "script":
                cacheable = False
                break
            spec = earlier.spec
            paths = [self.site_path(spec[k]) for k in ("dest", "file") if k in spec]
            paths += [posixpath.normpath(spec[k]) for k in ("link", "into") if k in spec]
            if any(p == directory.rstrip("/") or p.startswith(prefix) or prefix.startswith(p + "/") for p in paths):
                cacheable = False
                break
        digest = hashlib.sha256(directory.encode()).hexdigest()[:16]
        cache_file = discovery_cache_dir() / f"listing-{self.base_id.split(':')[-1]}-{digest}.json"
        if cacheable and cache_file.exists():
            with contextlib.suppress(ValueError, OSError):
                return [(str(n), bool(d)) for n, d in json.loads(cache_file.read_text())]
        listing = [(name, info.isdir()) for name, info in list_dir(container, directory)]
        if cacheable and listing:
            with contextlib.suppress(OSError):
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                cache_file.write_text(json.dumps(listing))
        return listing

    def symlink(self, container: Any, step: Step, entries: list[tarfile.TarInfo]) -> str:
        spec = step.spec
        pairs: list[tuple[str, str]] = []
        if "glob" in spec:
            pattern = posixpath.normpath(spec["glob"])
            directory, name_glob = posixpath.split(pattern)
            if any(ch in directory for ch in "*?["):
                raise ConfigError("only the last component of a symlink glob may hold wildcards",
                                  location=step.location, key_path=f"{step.key_path}.glob", found=pattern)
            matches = sorted(name for name, is_directory in self.glob_listing(container, directory, step)
                             if fnmatch.fnmatchcase(name, name_glob) and not is_directory)
            if not matches:
                raise BuildError(f"symlink glob {pattern} matches nothing in the image",
                                 location=step.location, key_path=f"{step.key_path}.glob",
                                 hint="check the directory with `docker run --rm IMAGE ls DIR`")
            into = posixpath.normpath(spec["into"])
            pairs = [(f"{into}/{name}", f"{directory}/{name}") for name in matches]
        else:
            pairs = [(posixpath.normpath(spec["link"]), spec["target"])]
        made = skipped = 0
        for link, target in pairs:
            stat = path_stat(container, link)
            if stat is not None:
                if is_symlink(stat) and stat.get("linkTarget") == target:
                    skipped += 1
                    continue
                if is_dir(stat) and not is_symlink(stat):
                    if list_dir(container, link) and not spec.get("replace_directory"):
                        raise BuildError(
                            f"{link} is a non-empty directory in the image; refusing to replace it with a link",
                            location=step.location, key_path=step.key_path,
                            hint="link the files inside it (glob + into) instead; replace_directory: true forces it",
                        )
                elif not spec.get("replace"):
                    raise BuildError(
                        f"{link} already exists in the image",
                        location=step.location, key_path=step.key_path,
                        hint="set replace: true to replace existing files with links",
                    )
            entries.append(symlink_entry(link, target))
            made += 1
        return f"{made} link(s) made, {skipped} already in place"

    # -- script steps -------------------------------------------------------

    def run_script_step(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        import docker.errors

        step = planned.step
        assert step is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        with daemon_errors(f"script step {step.id}"):
            container = self.scope.create(
                parent, labels={L_KIND: "step-script"},
                **process_overrides(parent_config, IDLE_LOOP),
            )
            try:
                container.start()
                code, lines = exec_script(container, step, self.environ,
                                          echo=(lambda line: self.log(f"    | {line}")) if self.verbose else None)
                if code != 0:
                    # ENOSPC inside the step is the host's disk, not the script: infrastructure (exit 5)
                    full = any("no space left on device" in line.lower() for line in lines[-30:])
                    raise (InfraError if full else BuildError)(
                        f"script step {step.id!r} exited with code {code}"
                        + (": out of disk space (free some: invoke clean)" if full else ""),
                        location=step.location, key_path=step.key_path,
                        hint=f"run it by hand: docker run --rm -it {parent[:19]} sh",
                        log_tail=lines[-30:],
                    )
                if "source" in step.spec:  # a directory step's copy stays, like a Dockerfile COPY
                    api = client().api
                    cleanup = api.exec_create(container.id, ["rm", "-rf", SCRIPT_SCRATCH], user="root")["Id"]
                    api.exec_start(cleanup)
                # kill, not stop: the idle loop only sees TERM after its `sleep 1` (stop took ~1 s)
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
                image_id = self.commit(container, planned, parent_config)
            finally:
                self.scope.remove(container)
        return image_id, (lines[-1].strip() if lines else "no output")[:120]

    # -- verify / config ----------------------------------------------------

    def run_verify(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        assert self.info is not None
        parent_config = client().images.get(parent).attrs["Config"] or {}
        spec = verify_spec(self.plan, self.info.site)
        with daemon_errors("verifying"):
            report = verify_image(self.scope, parent, parent_config, self.target, self.info, spec, log=self.log,
                                  verbose=self.verbose)
        image_id = self.commit(report.container, planned, parent_config,
                               extra_labels={L_VERIFIED: canonical(report.summary())})
        self.scope.remove(report.container)
        return image_id, report.text()

    def run_config(self, planned: PlannedStep, parent: str) -> tuple[str, str]:
        parent_config = client().images.get(parent).attrs["Config"] or {}
        serving = self.target.serving
        if serving.style == "argv":
            cmd = fit_argv(parent_config.get("Entrypoint"), serving_argv(self.resolved))
        else:
            cmd = fit_command(parent_config.get("Entrypoint"), serving.command, serving.config_path)
        env = list(parent_config.get("Env") or [])
        serving_env = self.resolved.serving_env()
        env = [e for e in env if e.split("=", 1)[0] not in serving_env]
        env += [f"{k}={v}" for k, v in serving_env.items()]
        data = self.plan.serving_config
        with daemon_errors("writing the serving config"):
            container = self.scope.create(parent, labels={L_KIND: "config"})
            try:
                entry = file_entry(serving.config_path, data, mode=0o644)
                container.put_archive("/", tar_of([entry], {entry.name: data}))
                image_id = self.commit(
                    container, planned, parent_config,
                    conf={"Cmd": cmd, "Env": env},
                    extra_labels={L_PROFILE: self.resolved.profile_name, L_FINAL: "true",
                                  f"{LABEL}.serving-config": serving.config_path},
                )
            finally:
                self.scope.remove(container)
        return image_id, f"{serving.config_path} ({len(data)} bytes); CMD {json.dumps(cmd)}"


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
        return sum(1 for s in self.steps if s.cache != "HIT")

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "target": self.target, "profile": self.profile, "image_id": self.image_id,
            "tags": list(self.tags), "seconds": round(self.seconds, 3), "run_dir": str(self.run_dir),
            "steps": [{"id": s.id, "kind": s.kind, "stage": s.stage, "cache": s.cache, "key": s.key,
                       "image_id": s.image_id, "seconds": round(s.seconds, 3), "detail": s.detail}
                      for s in self.steps],
        }


def build(plan: Plan, base: BaseIdentity, *, runlog: RunLog, verbose: bool = False,
          started: float | None = None, environ: Mapping[str, str] | None = None) -> BuildResult:
    """Build (or reuse) every layer of ``plan`` on ``base`` and move its tags; nothing else.

    The caller holds the image lock and owns the run directory (``runlog``); ``started`` is when the
    whole build began (default: now), for the seconds reported.
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
        builder = Builder(plan, log=runlog, verbose=verbose, run_id=run_id, scope=scope,
                          base_ref=base.ref, base_id=base.image_id, environ=environ)
        parent = base.image_id
        if any(s.cache != "HIT" for s in plan.steps):
            with daemon_errors("discovering the package"):
                builder.info = discover_package(base.image_id, resolved.target, scope, runlog)
        for i, planned in enumerate(plan.steps, 1):
            t0 = time.monotonic()
            assert planned.key is not None
            if planned.image_id is not None:
                image_id, cache, detail = planned.image_id, "HIT", ""
            else:
                runner = {"verify": builder.run_verify, "config": builder.run_config}.get(planned.stage)
                if runner is None:
                    assert planned.step is not None
                    runner = builder.run_script_step if planned.kind == "script" else builder.run_file_step
                image_id, detail = runner(planned, parent)
                cache = "SKIPPED" if detail.startswith("already applied") else "BUILT"
            dt = time.monotonic() - t0
            results.append(StepResult(planned.id, planned.kind, planned.stage, cache, planned.key,
                                      image_id, dt, detail))
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
                 make_base: bool = True, locked: bool = False) -> BuildResult:
    """Build (or reuse) every layer of the resolved target/profile and move its tags.

    Writes ``plan.json``, ``build.log`` and ``summary.json`` in a new run directory.
    ``locked``: first compare the inputs with build.lock (ConfigError, exit 2, on any drift).
    """
    t_start = time.monotonic()
    target = resolved.target
    if target.base.recipe is None and target.base.reference(environ) is None:
        raise missing_variable_error(target)  # before touching Docker: the vendor image reference is missing
    for step in resolved.steps:
        if step.kind == "script" and "directory" in step.spec:
            script_directory(step, environ)  # an unset ${VAR} or a missing folder: exit 5 before Docker
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
                result = build(plan, base, runlog=runlog, verbose=verbose, started=t_start, environ=environ)
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


def prepare_base(resolved: Resolved, environ: Mapping[str, str], log: Log = print) -> BaseIdentity:
    """Make sure the Docker engine answers and the target's base image (and model) exist."""
    ensure_daemon(log=log)
    with daemon_errors("making the base image"):
        return base_reference(resolved, environ, log, make=True)
