"""``overlay``: a host file (``source``) put at ``dest`` in the image, with ``mode`` and ``owner``.

Its source's sha256 is an input of the cache key and a fact for verification (the image file's hash
must equal it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import BuildError
from ..manifest.model import Step, StepSpec
from ..patches.anchored import unified_diff
from .core import (
    ApplyContext,
    Changes,
    Facts,
    FileChange,
    LoadedSpec,
    OneFileKind,
    SpecChecks,
    StepProblem,
    guard_links,
    python_problem,
    register,
    text_of,
)
from .dockerfile import EmitContext, Emitted, applier_group, header, host_file
from .fs import ImageFS


@dataclass(frozen=True)
class OverlaySpec(StepSpec):
    """An overlay step's fields: the host file ``source`` (normalised) at ``dest``; ``mode`` as a number."""

    source: str
    dest: str
    mode: int | None = None  # None: 0755 for an executable source, else 0644 (:func:`overlay_mode`)
    owner: str | None = None  # "UID:GID"; None: 0:0

    @property
    def host_file(self) -> str:
        return self.source


def overlay_mode(step: Step) -> int:
    """The mode the file gets: the step's ``mode``, else 0755 for an executable source, else 0644."""
    mode = OverlaySpec.of(step).mode
    if mode is not None:
        return mode
    return 0o755 if os.access(step.source, os.X_OK) else 0o644


def overlay_owner(step: Step) -> tuple[int, int]:
    uid, gid = (int(x) for x in (OverlaySpec.of(step).owner or "0:0").split(":"))
    return uid, gid


@register
class Overlay(OneFileKind):
    name = "overlay"
    spec_type = OverlaySpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": ["source", "dest"],
        "properties": {
            "source": {"type": "string", "minLength": 1,
                       "description": "File under overlays/ (relative to the manifest)."},
            "dest": {"type": "string", "minLength": 1,
                     "description": "File path (not a directory: no trailing '/') relative to the package's site "
                                    "directory (e.g. vllm/x.py), or absolute."},
            "mode": {"$ref": "#/$defs/mode"},
            "owner": {"$ref": "#/$defs/owner"},
        },
    }

    def path(self, step: Step) -> str:
        return OverlaySpec.of(step).dest

    def describe(self, step: Step) -> list[str]:
        spec = OverlaySpec.of(step)
        return [f"{spec.dest} (overlaid from {spec.source})"]

    def provides(self, step: Step) -> tuple[str, ...]:
        dest = OverlaySpec.of(step).dest
        return () if dest.startswith("/") else (dest.lstrip("./"),)

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        spec["dest"] = checks.dest("dest", raw["dest"], raw.get("source"))
        if "mode" in spec:
            spec["mode"] = int(str(spec["mode"]), 8)  # written in octal (0644); the spec holds the number
        return super().load(raw, spec, checks)

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        dest = self.row_path(step, ctx.site)
        try:
            data = step.source.read_bytes()
        except OSError as exc:
            raise StepProblem("conflict", dest, f"cannot read the source: {exc}", BuildError(
                f"cannot read the source of overlay step {step.id!r}", found=str(exc),
                location=step.where("source"), key_path=f"{step.key_path}.source"), blame="dest") from None
        guard_links(step, fs, dest, ctx.site, "destination", blame="dest")
        parent = posixpath.dirname(dest)
        if ctx.checking and fs.stat(parent) is None:  # the build would make it; the package moved, most likely
            raise StepProblem("destination missing", dest,
                              f"directory {parent} is not in the image (moved in this package version?)",
                              BuildError(f"overlay destination directory {parent} is not in the image"),
                              blame="dest")
        existing = fs.stat(dest)
        if existing is not None and existing.kind == "dir":
            raise StepProblem("conflict", dest, "destination is a directory in the image", BuildError(
                f"overlay destination {dest} is a directory in the image",
                location=step.where("dest"), key_path=f"{step.key_path}.dest"), blame="dest")
        if dest.endswith(".py"):
            source_text = text_of(data)
            if source_text is None:
                raise StepProblem("breaks the file", dest, "the source is not UTF-8 text", BuildError(
                    f"overlay step {step.id!r}: {step.source} is not UTF-8 text, but {dest} is a .py file",
                    location=step.where("source"), key_path=f"{step.key_path}.source"), blame="source")
            python_problem(step, dest, source_text, ctx.python_version, None, "source")
        mode = overlay_mode(step)
        uid, gid = overlay_owner(step)
        change = FileChange(dest, data, mode, uid, gid)
        summary = f"{'replaced' if existing else 'added'} {dest} ({len(data)} bytes, mode {mode:o})"
        old: bytes | None = None
        if ctx.checking and existing is not None and existing.kind == "file":  # only the report needs the old bytes
            with contextlib.suppress(BuildError):
                old = fs.read(dest)
        digest = hashlib.sha256(data).hexdigest()[:12]
        if old is not None and old == data:
            return Changes("already applied", dest, f"image file has the same sha256 ({digest})", summary,
                           files=(change,))
        diff = ""
        if ctx.with_diff:
            before, after = text_of(old or b""), text_of(data)
            if before is not None and after is not None:
                diff = unified_diff(dest, before, after)
        what = f"replaces a {len(old)}-byte file" if old is not None else "adds a new file"
        if existing is not None and existing.kind == "link":
            what = f"replaces a link to {existing.link_target}"
        return Changes("applies", dest, f"{what} ({len(data)} bytes, sha256 {digest})", summary, files=(change,),
                       diff=diff)

    def facts(self, step: Step, inputs: Mapping[str, str], site: str) -> Facts:
        dest = self.row_path(step, site)
        return Facts(python_files=(dest,) if dest.endswith(".py") else (),
                     overlays={dest: next(iter(inputs.values()))})

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        """The file goes into the image with the engine's mode, owner and mtime (set by the applier, not COPY)."""
        dest = self.row_path(step, ctx.base.site)
        mode = overlay_mode(step)
        uid, gid = overlay_owner(step)
        name = posixpath.basename(OverlaySpec.of(step).source)
        spec = {"op": "place", "step": step.id, "path": dest, "site": ctx.base.site, "source": name,
                "mode": mode, "uid": uid, "gid": gid, "python_version": ctx.base.python_version}
        instructions, files = applier_group(ctx, spec, {f"{ctx.step_dir}/{name}": host_file(step.source)})
        return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
