"""``overlay``: the file goes into the image with the engine's mode, owner and mtime (set by the applier, not COPY)."""

from __future__ import annotations

import os
import posixpath

from ...manifest import Step, resolve_image_path
from ..emit import EmitContext, Emitted, applier_group, header, host_file, register


@register("overlay")
def emit_overlay(step: Step, ctx: EmitContext) -> Emitted:
    dest = resolve_image_path(step.spec["dest"], ctx.base.site)
    if "mode" in step.spec:
        mode = int(step.spec["mode"])
    else:
        mode = 0o755 if os.access(step.source, os.X_OK) else 0o644
    uid, gid = (int(x) for x in str(step.spec.get("owner", "0:0")).split(":"))
    name = posixpath.basename(str(step.spec["source"]))
    spec = {"op": "overlay", "step": step.id, "path": dest, "site": ctx.base.site, "source": name,
            "mode": mode, "uid": uid, "gid": gid}
    instructions, files = applier_group(ctx, spec, {f"{ctx.step_dir}/{name}": host_file(step.source)})
    return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
