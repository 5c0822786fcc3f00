"""The Dockerfile instruction helpers live in :mod:`imageforge.steps.dockerfile`
(below the step kinds that use them)."""

from ..steps.dockerfile import (
    APPLIER,
    EMITTERS,
    HELPER_DIR,
    STAGE_DIR,
    VERIFIER,
    BaseFacts,
    ContextFile,
    EmitContext,
    Emitted,
    Emitter,
    applier_group,
    check_path,
    comment,
    copy,
    env_value,
    header,
    host_file,
    register,
    run,
    spec_file,
)

__all__ = ["APPLIER", "EMITTERS", "HELPER_DIR", "STAGE_DIR", "VERIFIER", "BaseFacts", "ContextFile", "EmitContext",
           "Emitted", "Emitter", "applier_group", "check_path", "comment", "copy", "env_value", "header", "host_file",
           "register", "run", "spec_file"]
