"""``imageforge preflight``: everything that breaks a submission without needing the card, in one run.

* :mod:`.findings` -- the checks (data: id, default severity) and the findings, rendered like ruff/mypy or JSON;
* :mod:`.tree` -- the final tree: the files steps and scripts changed, a listing of the import roots, the host
  folders the submission ships;
* :mod:`.python` -- ``.py`` files parse and compile for the target's Python, imports resolve in the final tree,
  names and call arities on vendor extension modules (against :mod:`imageforge.vendor_api`), dead files;
* :mod:`.shell` -- ``bash -n``, shellcheck (unset names the sandbox shows set dismissed), CRLF, ``cp`` sources,
  pins, build-time device imports, Dockerfile RUNs that discard their exit code;
* :mod:`.binaries` -- every shared object a script step ships, checked as the loader would (vendor_api.elfcheck);
* :mod:`.runfile` -- diagnostic-only variables in the serving env (the target's, a run file's);
* :mod:`.gitstate` -- what git would ship;
* :mod:`.run` -- the run against the daemon (check-patches' sandbox, flags, the submission tree);
* :mod:`.local` -- ``preflight --in-place``: the phases that need no Docker, over a root's files (the card's machine).
"""

from __future__ import annotations

from .findings import CHECKS, Check, Finding, PreflightReport
from .run import run_preflight

__all__ = ["CHECKS", "Check", "Finding", "PreflightReport", "run_preflight"]
