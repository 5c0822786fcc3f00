"""The target applied to the machine itself, without Docker: ``apply --in-place``, ``revert``, ``status``.

For the card's machine (no Docker daemon there): each step kind's ``apply`` writes its Changes under a root
(default ``/``) through a write-ahead journal (``ROOT/var/lib/imageforge/``), script steps run as local
processes, and :func:`revert` puts every journaled path back byte for byte. The API the in-place server,
smoke, bench, equiv and ablate build on::

    report = inplace.apply(resolved, root=Path("/"), python="python3", environ=env, steps=(), skip=())
    inplace.revert(Path("/"))
    with inplace.applied(resolved, root=...) as report:   # reverted on exit (also on an exception)
        ...

* :mod:`.journal`: the journal, the object store, the only writers of the root;
* :mod:`.apply`: the plan against the journal, one step at a time, verification;
* :mod:`.safety`: the root lock, the path guards, where the undeclared-change scan looks; :mod:`.changescan`:
  that scan (one lstat pass after a script, by ctime); :mod:`.undo`: undoing a step, recovery after SIGKILL,
  drift;
* :mod:`.revert`: revert and status (with the package's dist-info RECORD);
* :mod:`.runner`: how a script step runs (a local process here, exec in a container for the build);
* :mod:`.localfs`: the root as the ImageFS the step kinds read; :mod:`.package`: the target interpreter's
  package; :mod:`.interrupts`: SIGINT/SIGTERM/SIGHUP -> the step in progress rolls back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest.resolve import Resolved
from .apply import ApplyReport, apply, select_steps
from .journal import JOURNAL_DIR, Journal
from .localfs import LocalFS
from .package import LocalPackage, discover_local
from .revert import RevertReport, StatusReport, listing, revert, status

if TYPE_CHECKING:  # check-patches (and the Docker engine's modules it holds) only for --dry-run: see dry_run
    from ..patches.check import CheckReport

__all__ = [
    "JOURNAL_DIR",
    "ApplyReport",
    "Journal",
    "LocalFS",
    "LocalPackage",
    "RevertReport",
    "StatusReport",
    "applied",
    "apply",
    "discover_local",
    "dry_run",
    "listing",
    "revert",
    "status",
]

Log = Callable[[str], None]


def dry_run(resolved: Resolved, *, root: Path = Path("/"), python: str = "python3",
            environ: Mapping[str, str] | None = None, steps: Sequence[str] = (),
            skip: Sequence[str] = ()) -> CheckReport:
    """What apply would do, as check-patches' table; nothing is written (script steps: "not checked"). The ``.py``
    files the file steps would write are compiled by the target interpreter, in one call (the final state)."""
    from ..patches.check import CheckReport, FinalState, check_steps  # not at the top: apply's start-up does without it
    from .verify import compile_sources

    environ = dict(os.environ if environ is None else environ)
    root = root.resolve()
    pkg = discover_local(resolved.target, root, python, environ, check_version=False)
    want = resolved.target.package.version
    problem = None if want in ("*", pkg.version) else \
        f"{resolved.target.package.distribution} {pkg.version} is installed; the manifest says {want}"
    rows, state = check_steps(select_steps(resolved, steps, skip), {}, LocalFS(root), pkg.site,
                              python_version=pkg.python_version)
    sources = [(path, data.decode("utf-8", "replace")) for path, data in sorted(state.files.items())
               if path.endswith(".py")]
    compiled = compile_sources(pkg, environ, sources) if sources else None
    if not sources:
        final = FinalState()
    elif compiled is None:
        final = FinalState(len(sources), skipped=f"the target interpreter {pkg.python} did not run the compile: "
                                                 "each step's own grammar check (the table) stands")
    else:
        final = FinalState(len(sources), compiled_by=f"the target's Python {compiled.python}, {compiled.executable}",
                           problems=tuple(f"{sources[i][0]}:{line}: {message}" for i, message, line, _, _
                                          in compiled.errors))
    return CheckReport(resolved.target.name, f"in place: {root} (python {pkg.python})", "", pkg.site, pkg.version,
                       problem, tuple(rows), False, final)


@contextlib.contextmanager
def applied(resolved: Resolved, *, root: Path = Path("/"), python: str = "python3",
            environ: Mapping[str, str] | None = None, steps: Sequence[str] = (), skip: Sequence[str] = (),
            imports: bool = True, log: Log = print) -> Iterator[ApplyReport]:
    """``resolved`` applied under ``root`` for the block, reverted after it (also when it raises)."""
    try:
        yield apply(resolved, root=root, python=python, environ=environ, steps=steps, skip=skip, imports=imports,
                    log=log)
    finally:
        revert(root, log=log)
