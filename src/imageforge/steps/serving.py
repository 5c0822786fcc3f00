"""The serving config: the last layer's file (the rendered config), the serving ENV and the CMD.

Not a manifest step (it comes from ``serving:`` and the profile), but a kind with the same faces:
``apply`` returns the file it writes, ``image_config`` the CMD/ENV the commit sets, ``emit`` the
Dockerfile instructions that do the same.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from ..plan import Plan
from ..serve.command import image_command
from .core import Changes, FileChange
from .dockerfile import ContextFile, EmitContext, Emitted, comment, copy, env_value, run


class ServingConfig:
    name = "config"

    def apply(self, plan: Plan) -> Changes:
        path = plan.resolved.target.serving.config_path
        data = plan.serving_config
        return Changes("applies", path, f"{len(data)} bytes", f"{path} ({len(data)} bytes)",
                       files=(FileChange(path, data, 0o644),))

    def image_config(self, plan: Plan, parent_config: Mapping[str, Any]) -> dict[str, Any]:
        """``Cmd`` and ``Env`` of the final layer: the serving ENV replaces the parent's values of the same names."""
        cmd = image_command(plan.resolved, tuple(parent_config.get("Entrypoint") or ()))
        serving_env = plan.resolved.serving_env()
        env = [e for e in (parent_config.get("Env") or []) if e.split("=", 1)[0] not in serving_env]
        env += [f"{k}={v}" for k, v in serving_env.items()]
        return {"Cmd": cmd, "Env": env}

    def emit(self, plan: Plan, ctx: EmitContext) -> Emitted:
        serving = plan.resolved.target.serving
        path = posixpath.normpath(serving.config_path)
        name = f"{ctx.step_dir}/{posixpath.basename(path)}"
        instructions = [
            comment(f"step {ctx.index}/{ctx.total} serving-config (config): {path} + serving ENV + CMD "
                    f"(profile {plan.resolved.profile_name})"),
            copy([name], path),
            run(["chmod", "0644", path]),
        ]
        env = plan.resolved.serving_env()
        if env:
            instructions.append("ENV " + " ".join(f"{k}={env_value(str(v))}" for k, v in env.items()))
        instructions.append("CMD " + json.dumps(image_command(plan.resolved, ctx.base.entrypoint)))
        return Emitted(tuple(instructions), {name: ContextFile(plan.serving_config)})


SERVING_CONFIG = ServingConfig()
