"""The serving config stage: the rendered config file, the serving ENV and the CMD the engine's last layer sets."""

from __future__ import annotations

import json
import posixpath

from ...plan import Plan, fit_argv, fit_command, serving_argv
from ..emit import ContextFile, EmitContext, Emitted, comment, copy, env_value, register, run


def image_cmd(plan: Plan, entrypoint: tuple[str, ...]) -> list[str]:
    """The CMD imageforge's config layer sets (fitted to the base's ENTRYPOINT)."""
    serving = plan.resolved.target.serving
    if serving.style == "argv":
        return fit_argv(list(entrypoint) or None, serving_argv(plan.resolved))
    return fit_command(list(entrypoint) or None, serving.command, serving.config_path)


@register("config")
def emit_config(plan: Plan, ctx: EmitContext) -> Emitted:
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
    instructions.append("CMD " + json.dumps(image_cmd(plan, ctx.base.entrypoint)))
    return Emitted(tuple(instructions), {name: ContextFile(plan.serving_config)})
