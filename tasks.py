"""The repository's invoke tasks: the `imageforge` command's collection, plus `test` (repository-only).

The tasks live in the package (`src/imageforge/commands.py`), so `pip install` gives the same
`imageforge` command; this file re-exports them so that `invoke TASK` here works the same. Run
`invoke --list`, or `invoke TASK --help`.
Exit codes: 0 ok, 1 usage (invoke's own), 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from invoke.context import Context

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from imageforge import app, commands  # noqa: E402
from imageforge.cli import user_errors  # noqa: E402
from imageforge.commands import task  # noqa: E402


@task(help={"unit": "Only the fast tests (no Docker daemon)", "k": "pytest -k expression",
            "lint": "Run ruff and mypy first (default true)"})
def test(c: Context, unit: bool = False, k: str = "", lint: bool = True) -> None:
    """Lint, type-check and run the tests (sets up the Docker engine and base images first)."""
    py = sys.executable
    if lint:
        lint_paths = [p for p in ("src", "tests", "tasks.py", "bench", "benchmarks", "overlays", "images")
                      if (ROOT / p).exists()]  # ruff fails on a path that is not there
        c.run(f"{py} -m ruff check {' '.join(lint_paths)}", pty=False)
        c.run(f"{py} -m mypy", pty=False)
    paths = "tests/unit tests/overlays" if unit else "tests"
    if not unit:
        with user_errors():
            app.base(app.settings(manifest=str(ROOT / "build.yaml")), "cpu")
    selector = f" -k {shlex.quote(k)}" if k else ""
    c.run(f"{py} -m pytest {paths}{selector}", pty=False)


ns = commands.collection(test)
