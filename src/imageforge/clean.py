"""`clean`: the build containers and images no retention rule keeps.

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

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .docker_engine import client, daemon_errors, ensure_daemon, explanation, human_bytes
from .errors import ConfigError
from .labels import L_FINAL, L_KIND, L_PROFILE, L_RUN, L_TARGET, L_TOOL, TOOL
from .manifest.model import Manifest
from .rundirs import free_image_locks, runs_dir

Log = Callable[[str], None]
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
