"""Coverage in a Python subprocess of the tests, started when the process first imports ``imageforge``.

``invoke test --coverage`` copies this file into the test venv's site-packages with a ``.pth`` line that imports it,
and sets ``IMAGEFORGE_COVERAGE_ON_IMPORT`` to the coverage configuration file for the run. A process that never
imports imageforge (an in-image program run with the target interpreter, a fake server, pip) then starts no
coverage at all: coverage.py's own subprocess start (``patch = ["subprocess"]``) imports and starts coverage in
every process, ~0.12 s of CPU each, in ~300 processes a run, most of which run no line of src/. A process that
does import imageforge is measured from that import on, before any line of imageforge runs, so the measured lines
are the same (the same TOTAL). Standard library only; inert without the variable.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: The variable that turns it on: the coverage configuration file of the run.
VARIABLE = "IMAGEFORGE_COVERAGE_ON_IMPORT"
PACKAGE = "imageforge"


class StartOnImport:
    """A meta path finder that finds nothing: at the first import of the package it leaves ``sys.meta_path`` and
    starts coverage (unless one runs already: the ``coverage run`` process itself)."""

    def __init__(self, config_file: str) -> None:
        self.config_file = config_file

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        # every such finder leaves first (a second copy of this module may have installed one too): starting
        # coverage looks the package up again, which must not start a second one
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != type(self).__name__]
        import coverage

        if coverage.Coverage.current() is None:
            # process_startup reads its configuration from the environment; not left there for this process's
            # own children (each starts its own, on its own import)
            previous = os.environ.get("COVERAGE_PROCESS_START")
            os.environ["COVERAGE_PROCESS_START"] = self.config_file
            try:
                coverage.process_startup()
            finally:
                if previous is None:
                    del os.environ["COVERAGE_PROCESS_START"]
                else:
                    os.environ["COVERAGE_PROCESS_START"] = previous
        return None


def install() -> None:
    config_file = os.environ.get(VARIABLE)
    if config_file and not any(type(f).__name__ == StartOnImport.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, StartOnImport(config_file))


install()
