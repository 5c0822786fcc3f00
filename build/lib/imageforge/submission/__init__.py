"""The submission tree the competition platform builds (root ``Dockerfile`` + ``computility-run.yaml``).

* :func:`write_submission` -- write (or rewrite) the tree for a resolved target/profile;
* :func:`check_submission` -- preflight an existing tree against the manifest (ConfigError, exit 2);
* :func:`docker_build` -- plain ``docker build`` of a tree through the SDK (what the platform does);
* :func:`emitter` -- the Dockerfile emitter of a step kind (its class's ``emit``, :mod:`imageforge.steps`)
  or of the verify stage (:data:`EMITTERS`).
"""

from __future__ import annotations

from ..steps.dockerfile import EMITTERS, BaseFacts, ContextFile, EmitContext, Emitted
from .kinds import emitter
from .runyaml import RUN_YAML, run_yaml_doc
from .tree import (
    RECORD,
    SubmissionResult,
    check_submission,
    discover_base,
    docker_build,
    render_tree,
    write_submission,
)

__all__ = [
    "EMITTERS", "RECORD", "RUN_YAML", "BaseFacts", "ContextFile", "EmitContext", "Emitted", "SubmissionResult",
    "check_submission", "discover_base", "docker_build", "emitter", "render_tree", "run_yaml_doc",
    "write_submission",
]
