"""``symlink``: one link, or one link per glob match (matched at build time, in the image, as the engine does)."""

from __future__ import annotations

import posixpath
from typing import Any

from ...errors import ConfigError
from ...manifest import Step
from ..emit import EmitContext, Emitted, applier_group, header, register


@register("symlink")
def emit_symlink(step: Step, ctx: EmitContext) -> Emitted:
    s = step.spec
    spec: dict[str, Any] = {"op": "symlink", "step": step.id, "replace": bool(s.get("replace", False)),
                            "replace_directory": bool(s.get("replace_directory", False))}
    if "glob" in s:
        pattern = posixpath.normpath(s["glob"])
        if any(ch in posixpath.dirname(pattern) for ch in "*?["):
            raise ConfigError("only the last component of a symlink glob may hold wildcards",
                              location=step.location, key_path=f"{step.key_path}.glob", found=pattern)
        spec.update(glob=pattern, into=posixpath.normpath(s["into"]))
    else:
        spec.update(link=posixpath.normpath(s["link"]), target=s["target"])
    instructions, files = applier_group(ctx, spec)
    return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
