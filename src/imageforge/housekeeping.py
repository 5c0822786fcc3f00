"""`lock` / `build --locked` and `clean`.

build.lock
----------
``invoke lock --target T`` records, per target, what a build of it rests on: the manifest's
digest, the base image (reference and ID), the package version found in it, and the sha256
of every overlay and script source (shared and profile steps).  ``invoke build --locked``
compares the same facts before any layer is built and fails on any drift, naming each one.

Drift exits with code 2 (config error): nothing was built, and what disagrees is the declared
input (the manifest, a source file, the base the manifest names) against the lock, which is
itself configuration.  Build failures proper keep exit 3; a base image that is not on the
daemon at all keeps exit 5.

clean
-----
``invoke clean [--keep N] [--dry-run]`` removes, for the manifest's targets:

* labelled build containers (steps, verify, config, discovery) of this checkout whose build is
  not running (any state: a script step container left behind by a lost daemon is removed
  too), and any other labelled container that is stopped and older than ``min_age`` (a
  running server is never touched);
* labelled build images (``org.imageforge.target`` set) that no retention rule keeps.

Kept: the newest ``keep`` final images per target/profile, every image with a tag (any
repository) and every image a container uses -- each with its whole parent chain -- and
everything younger than ``min_age`` (a build in another checkout may be using it right now).
Base images (no target label) are never removed.  Images go children first, without
pruning, so what is printed is exactly what was removed.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import base_reference, discover_package, missing_variable_error
from .docker_engine import client, daemon_errors, ensure_daemon, explanation, human_bytes
from .docker_engine.containers import containers
from .errors import ConfigError, Problem
from .labels import L_FINAL, L_KIND, L_PROFILE, L_RUN, L_TARGET, L_TOOL, TOOL
from .manifest.model import Manifest, Target
from .manifest.resolve import Resolved
from .plan import step_inputs
from .rundirs import free_image_locks, runs_dir

Log = Callable[[str], None]
LOCK_FILE = "build.lock"
LOCK_VERSION = 1


# --------------------------------------------------------------------------- lock


def lock_path(manifest: Manifest) -> Path:
    return manifest.root / LOCK_FILE


def target_inputs(target: Target) -> dict[str, dict[str, str]]:
    """step id -> {source, sha256} for every overlay/script step (shared and all profiles)."""
    steps = list(target.steps) + [s for p in target.profiles.values() for s in p.steps]
    out: dict[str, dict[str, str]] = {}
    for step in steps:
        for source, digest in step_inputs(step).items():
            out[step.id] = {"source": source, "sha256": digest}
    return dict(sorted(out.items()))


def lock_entry(manifest: Manifest, target: Target, base_ref: str, base_id: str, version: str) -> dict[str, Any]:
    """What ``build.lock`` records for one target (pure)."""
    return {
        "manifest": manifest.path.name,
        "manifest_digest": manifest.digest,
        "base": {"reference": base_ref, "image_id": base_id},
        "package": {"distribution": target.package.distribution, "import": target.package.import_name,
                    "version": version},
        "inputs": target_inputs(target),
    }


def lock_drift(locked: Mapping[str, Any], current: Mapping[str, Any]) -> list[Problem]:
    """Every difference between a lock entry and the current facts, one Problem each (pure)."""
    out: list[Problem] = []
    if locked.get("manifest_digest") != current.get("manifest_digest"):
        out.append(Problem(f"manifest {current.get('manifest')} changed since the lock",
                           key_path="manifest_digest", expected=str(locked.get("manifest_digest")),
                           found=str(current.get("manifest_digest"))))
    lb, cb = locked.get("base", {}), current.get("base", {})
    if lb.get("image_id") != cb.get("image_id"):
        out.append(Problem(f"base image {cb.get('reference')} is a different image", key_path="base.image_id",
                           expected=str(lb.get("image_id")), found=str(cb.get("image_id"))))
    if lb.get("reference") != cb.get("reference"):
        out.append(Problem("base image reference changed", key_path="base.reference",
                           expected=str(lb.get("reference")), found=str(cb.get("reference"))))
    lp, cp = locked.get("package", {}), current.get("package", {})
    for key in ("distribution", "import", "version"):
        if lp.get(key) != cp.get(key) and cp.get(key) is not None:
            out.append(Problem(f"package {key} changed", key_path=f"package.{key}", expected=str(lp.get(key)),
                               found=str(cp.get(key))))
    li, ci = locked.get("inputs", {}), current.get("inputs", {})
    for step_id in sorted(set(li) | set(ci)):
        a, b = li.get(step_id), ci.get(step_id)
        if a == b:
            continue
        if a is None:
            out.append(Problem(f"step {step_id}: {b['source']} is not in the lock (new step)",
                               key_path=f"inputs.{step_id}"))
        elif b is None:
            out.append(Problem(f"step {step_id}: locked input {a['source']} no longer in the manifest",
                               key_path=f"inputs.{step_id}"))
        elif a.get("source") != b.get("source"):
            out.append(Problem(f"step {step_id}: source changed", key_path=f"inputs.{step_id}.source",
                               expected=a.get("source"), found=b.get("source")))
        else:
            out.append(Problem(f"step {step_id}: {b['source']} changed", key_path=f"inputs.{step_id}.sha256",
                               expected=a.get("sha256"), found=b.get("sha256")))
    return out


def read_lock(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": LOCK_VERSION, "targets": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable lock file", found=str(exc)[:200],
                          hint="delete it and run `invoke lock` again") from None
    if not isinstance(data, dict) or not isinstance(data.get("targets"), dict):
        raise ConfigError(f"{path} is not a lock file written by imageforge",
                          hint="delete it and run `invoke lock` again")
    return data


def _current(resolved: Resolved, environ: Mapping[str, str], log: Log, *, version_of_locked: Mapping[str, Any] | None,
             ) -> dict[str, Any]:
    """The lock entry the daemon and the files describe now (base must exist; never made)."""
    target = resolved.target
    with daemon_errors("reading the base image"):
        base_ref, base_id = base_reference(resolved, environ, log, make=False)
        if version_of_locked is not None and version_of_locked.get("base", {}).get("image_id") == base_id:
            version = str(version_of_locked.get("package", {}).get("version"))  # same image, same package
        else:
            labels = {L_TOOL: TOOL, L_TARGET: target.name, L_KIND: "lock"}
            with containers(labels) as scope:
                version = discover_package(base_id, target, scope, log, check_version=False).version
    return lock_entry(resolved.manifest, target, base_ref, base_id, version)


def write_lock(resolved: Resolved, environ: Mapping[str, str], *, log: Log = print) -> tuple[Path, dict[str, Any]]:
    """`invoke lock`: record the target's facts in build.lock (other targets' entries are kept)."""
    if resolved.target.base.recipe is None and resolved.target.base.reference(environ) is None:
        raise missing_variable_error(resolved.target)
    ensure_daemon(log=log)
    entry = _current(resolved, environ, log, version_of_locked=None)
    entry["locked_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    m = resolved.manifest
    path = lock_path(m)
    data = read_lock(path)
    data["version"] = LOCK_VERSION
    data["targets"][resolved.target.name] = entry
    data["targets"] = dict(sorted(data["targets"].items()))
    tmp = path.with_suffix(".lock.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path, entry


def check_lock(resolved: Resolved, environ: Mapping[str, str], log: Log) -> None:
    """Raise ConfigError (exit 2) naming every drift from build.lock; never builds or makes anything."""
    path = lock_path(resolved.manifest)
    name = resolved.target.name
    locked = read_lock(path)["targets"].get(name)
    if locked is None:
        raise ConfigError(f"--locked, but {path} has no entry for target {name!r}",
                          hint=f"run `invoke lock --target {name}` and commit {LOCK_FILE}")
    current = _current(resolved, environ, log, version_of_locked=locked)
    drift = lock_drift(locked, current)
    if drift:
        raise ConfigError(f"target {name!r} drifted from {path.name} ({len(drift)} difference(s)); nothing built",
                          problems=drift,
                          hint=f"build without --locked, or run `invoke lock --target {name}` to accept the change")
    log(f"lock ok: {name} matches {path.name} (base {current['base']['image_id'].split(':')[-1][:12]}, "
        f"{len(current['inputs'])} input(s))")


# --------------------------------------------------------------------------- clean


@dataclass(frozen=True)
class ImageInfo:
    id: str
    parent: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    created: float
    size: int

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> ImageInfo:
        tags = tuple(t for t in (raw.get("RepoTags") or ()) if t != "<none>:<none>")
        return cls(str(raw["Id"]), str(raw.get("ParentId") or ""), tags, dict(raw.get("Labels") or {}),
                   float(raw.get("Created") or 0), int(raw.get("Size") or 0))


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    image_id: str
    labels: Mapping[str, str]
    state: str
    created: float
    name: str

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> ContainerInfo:
        names = raw.get("Names") or [""]
        return cls(str(raw["Id"]), str(raw.get("ImageID") or ""), dict(raw.get("Labels") or {}),
                   str(raw.get("State") or ""), float(raw.get("Created") or 0), str(names[0]).lstrip("/"))


@dataclass(frozen=True)
class Removal:
    id: str
    what: str  # one line: kind, target/profile, tags
    bytes: int = 0


@dataclass
class CleanPlan:
    containers: list[Removal] = field(default_factory=list)
    images: list[Removal] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # image id -> reason (build images only)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.images)


def _ancestors(image_id: str, by_id: Mapping[str, ImageInfo]) -> Iterator[str]:
    seen: set[str] = set()
    current: str | None = image_id
    while current and current not in seen and current in by_id:
        seen.add(current)
        yield current
        current = by_id[current].parent or None


#: Container kinds the build engine makes (servers, smoke runs etc. are never treated as leftovers).
BUILD_KINDS = frozenset({"verify", "config", "discover", "check-patches", "lock"})


def is_build_container(labels: Mapping[str, str]) -> bool:
    kind = labels.get(L_KIND, "")
    return kind.startswith("step-") or kind in BUILD_KINDS


def plan_clean(images: Sequence[ImageInfo], containers: Sequence[ContainerInfo], *, keep: int, now: float,
               min_age: float, targets: Iterable[str] | None, removable_runs: Callable[[ContainerInfo], bool],
               ) -> CleanPlan:
    """Decide what ``clean`` removes (pure).

    ``removable_runs(container)`` says whether a labelled container belongs to a build of this
    checkout that is not running now; a *build* container (a step, verify, config or discovery
    container) of such a run goes whatever its state.  Any other labelled container (a server
    `invoke run` started, a smoke run) goes only when stopped and older than ``min_age``.
    """
    scope = set(targets) if targets is not None else None
    by_id = {i.id: i for i in images}
    plan = CleanPlan()

    def in_scope(labels: Mapping[str, str]) -> bool:
        return labels.get(L_TOOL) == TOOL and (scope is None or labels.get(L_TARGET) in scope)

    going: set[str] = set()
    for c in containers:
        if not in_scope(c.labels):
            continue
        stopped = c.state in ("created", "exited", "dead")
        old = now - c.created >= min_age
        if (is_build_container(c.labels) and removable_runs(c)) or (stopped and old):
            going.add(c.id)
            kind = c.labels.get(L_KIND, "?")
            plan.containers.append(Removal(c.id, f"container {c.name or c.id[:12]} ({kind}, {c.state}, "
                                                 f"run {c.labels.get(L_RUN, '-')})"))

    keep_reason: dict[str, str] = {}

    def protect(image_id: str, reason: str) -> None:
        for anc in _ancestors(image_id, by_id):
            keep_reason.setdefault(anc, reason)

    for img in images:
        if img.tags:
            protect(img.id, f"tagged {img.tags[0]}")
    for c in containers:
        if c.id not in going and c.image_id in by_id:
            protect(c.image_id, f"used by container {c.name or c.id[:12]}")
    groups: dict[tuple[str, str], list[ImageInfo]] = {}
    for img in images:
        if in_scope(img.labels) and img.labels.get(L_FINAL) == "true":
            groups.setdefault((img.labels.get(L_TARGET, ""), img.labels.get(L_PROFILE, "")), []).append(img)
    for (tname, pname), finals in groups.items():
        finals.sort(key=lambda i: (-i.created, i.id))
        for rank, img in enumerate(finals[:max(keep, 0)], 1):
            protect(img.id, f"newest build {rank} of {tname}:{pname}")
    for img in images:
        if now - img.created < min_age:
            protect(img.id, "younger than the minimum age (a build may be using it)")

    candidates = [i for i in images if in_scope(i.labels) and L_TARGET in i.labels]
    for img in candidates:
        if img.id in keep_reason:
            plan.kept[img.id] = keep_reason[img.id]
    doomed = [i for i in candidates if i.id not in keep_reason]

    def depth(img: ImageInfo) -> int:
        return sum(1 for _ in _ancestors(img.id, by_id))

    for img in sorted(doomed, key=lambda i: (-depth(i), i.id)):
        parent = by_id.get(img.parent)
        own = img.size - parent.size if parent is not None else img.size
        kind = img.labels.get(L_KIND, "?")
        prof = img.labels.get(L_PROFILE)
        what = f"image {img.id.split(':')[-1][:12]} ({kind} of {img.labels.get(L_TARGET)}" + (
            f":{prof}" if prof and kind == "config" else "") + ")"
        plan.images.append(Removal(img.id, what, max(own, 0)))
    return plan


@dataclass
class CleanResult:
    plan: CleanPlan
    dry_run: bool
    removed_containers: list[Removal] = field(default_factory=list)
    removed_images: list[Removal] = field(default_factory=list)
    failed: list[tuple[Removal, str]] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.removed_images)

    def text(self) -> str:
        out: list[str] = []
        verb = "would remove" if self.dry_run else "removed"
        items = (self.plan.containers + self.plan.images) if self.dry_run else (
            self.removed_containers + self.removed_images)
        for r in items:
            out.append(f"  {verb} {r.what}" + (f"  {human_bytes(r.bytes)}" if r.bytes else ""))
        for r, why in self.failed:
            out.append(f"  kept {r.what}: {why}")
        n_c = len(self.plan.containers) if self.dry_run else len(self.removed_containers)
        n_i = len(self.plan.images) if self.dry_run else len(self.removed_images)
        size = self.plan.bytes if self.dry_run else self.freed
        out.append(f"clean: {verb} {n_c} container(s) and {n_i} image(s), "
                   f"{'would free' if self.dry_run else 'freed'} {human_bytes(size)}; "
                   f"{len(self.plan.kept)} build image(s) kept")
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        def rows(items: Iterable[Removal]) -> list[dict[str, Any]]:
            return [{"id": r.id, "what": r.what, "bytes": r.bytes} for r in items]

        return {"dry_run": self.dry_run, "containers": rows(self.plan.containers if self.dry_run
                                                              else self.removed_containers),
                "images": rows(self.plan.images if self.dry_run else self.removed_images),
                "failed": [{"id": r.id, "what": r.what, "error": e} for r, e in self.failed],
                "bytes": self.plan.bytes if self.dry_run else self.freed, "kept": dict(self.plan.kept)}


def clean(m: Manifest, *, keep: int = 3, dry_run: bool = False, target: str | None = None,
          min_age: float = 600.0, log: Log = print) -> CleanResult:
    """`invoke clean`: remove what no retention rule keeps (see the module docstring)."""
    if keep < 0:
        raise ConfigError("--keep must be 0 or more", found=str(keep))
    targets = [m.target(target)] if target else list(m.targets.values())
    images_of = {t.name: t.image for t in targets}
    ensure_daemon(log=log)
    api = client().api
    runs = runs_dir(m.root)
    with free_image_locks(m.root, images_of.values()) as free_images, daemon_errors("cleaning up"):

        def removable(c: ContainerInfo) -> bool:
            run = c.labels.get(L_RUN)
            if not run or not (runs / run).is_dir():
                return False  # not a build of this checkout
            return images_of.get(c.labels.get(L_TARGET, "")) in free_images

        images = [ImageInfo.from_api(raw) for raw in api.images(all=True)]
        conts = [ContainerInfo.from_api(raw) for raw in api.containers(all=True)]
        plan = plan_clean(images, conts, keep=keep, now=time.time(), min_age=min_age, targets=images_of,
                          removable_runs=removable)
        result = CleanResult(plan, dry_run)
        if dry_run:
            return result
        for r in plan.containers:
            _remove(r, lambda ident: api.remove_container(ident, force=True, v=True), result.removed_containers,
                    result.failed)
        for r in plan.images:
            _remove(r, lambda ident: api.remove_image(ident, force=False, noprune=True), result.removed_images,
                    result.failed)
        return result


def _remove(removal: Removal, remove: Callable[[str], Any], done: list[Removal],
            failed: list[tuple[Removal, str]]) -> None:
    """Remove one container or image; one already gone is skipped, one the daemon refuses is kept (and said)."""
    import docker.errors

    try:
        remove(removal.id)
        done.append(removal)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:  # in use by a container or a child made meanwhile
        failed.append((removal, explanation(exc)[:200]))
