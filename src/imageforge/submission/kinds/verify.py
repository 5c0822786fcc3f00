"""The engine's verify stage: recompile the changed ``.py`` files into hash-checked ``.pyc`` exactly as verify does.

The same script (:data:`imageforge.verify.IN_IMAGE`) runs with the image's python, so the ``.pyc``
files it leaves are made the same way; overlay hashes and symlinks are checked and fail the build.
Not replicated: the imports of ``verify.imports`` (importing vLLM imports torch, and the platform's
builder may have no device): `imageforge build --verify-imports` imports them, and so does the first server
start of the image that was tested.
"""

from __future__ import annotations

from ...plan import Plan
from ...steps.dockerfile import (
    STAGE_DIR,
    VERIFIER,
    ContextFile,
    EmitContext,
    Emitted,
    comment,
    copy,
    register,
    run,
    spec_file,
)
from ...verify import verify_spec
from ..applier import verifier_source


@register("verify")
def emit_verify(plan: Plan, ctx: EmitContext) -> Emitted:
    spec = verify_spec(plan, ctx.base.site).to_json()
    skipped = list(spec["imports"])
    spec["imports"] = []
    name, file = spec_file(ctx, spec)
    files = {name: file, VERIFIER: ContextFile(verifier_source(STAGE_DIR).encode())}
    note = (f"the imports of verify.imports ({', '.join(skipped)}): importing vLLM imports torch and the "
            "platform's builder may have no device; `imageforge build --verify-imports` imports them, and the first "
            "server start does") if skipped else None
    instructions = [
        comment(f"step {ctx.index}/{ctx.total} verify (verify): recompile the changed .py files into hash-checked "
                ".pyc as imageforge's verify does; check overlay hashes and symlinks"),
        *( [comment("not replicated: " + note)] if note else []),
        copy([VERIFIER, ctx.step_dir + "/"], STAGE_DIR + "/"),
        run([ctx.base.python, f"{STAGE_DIR}/verify.py", f"{STAGE_DIR}/step.json"]),
    ]
    return Emitted(tuple(instructions), files, (note,) if note else ())
