"""``patch``: the anchored replacement, applied at build time by the generated applier (imageforge.patching's code)."""

from __future__ import annotations

from ...manifest import Step, resolve_image_path
from ..emit import EmitContext, Emitted, applier_group, header, register


@register("patch")
def emit_patch(step: Step, ctx: EmitContext) -> Emitted:
    path = resolve_image_path(step.spec["file"], ctx.base.site)
    spec = {"op": "patch", "step": step.id, "path": path, "site": ctx.base.site, "old": step.spec["old"],
            "new": step.spec["new"], "count": int(step.spec.get("count", 1))}
    instructions, files = applier_group(ctx, spec)
    return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
