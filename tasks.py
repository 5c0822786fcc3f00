"""The repository's invoke tasks: the `imageforge` command's collection, plus `test` and `schema` (repository-only).

The tasks live in the package (`src/imageforge/cli/commands.py`), so `pip install` gives the same
`imageforge` command; this file re-exports them so that `invoke TASK` here works the same. Run
`invoke --list`, or `invoke TASK --help`.
Exit codes: 0 ok, 1 usage (invoke's own), 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from invoke.context import Context

ROOT = Path(__file__).resolve().parent
WORKERS = 2  # the two server groups run side by side; on 2 cores a third worker only adds contention
sys.path.insert(0, str(ROOT / "src"))

from imageforge import app  # noqa: E402
from imageforge.cli import commands  # noqa: E402
from imageforge.cli.options import task  # noqa: E402
from imageforge.cli.output import user_errors  # noqa: E402


@task(help={"unit": "Only the fast tests (no Docker daemon)", "k": "pytest -k expression",
            "lint": "Run ruff and mypy first (default true)",
            "coverage": "Measure src/ line coverage (subprocesses too); TOTAL line at the end, report in "
                        ".imageforge/coverage/"})
def test(c: Context, unit: bool = False, k: str = "", lint: bool = True, coverage: bool = False) -> None:
    """Lint, type-check and run the tests (sets up the Docker engine and base images first)."""
    py = sys.executable
    if lint:
        lint_paths = [p for p in ("src", "tests", "tasks.py", "bench", "benchmarks", "overlays", "images", "scripts")
                      if (ROOT / p).exists()]  # ruff fails on a path that is not there
        c.run(f"{py} -m ruff check {' '.join(lint_paths)}", pty=False)
        # mypy's cache outside the checkout: a fresh clone reuses what an earlier run on this machine checked (mypy
        # validates each entry by the source's hash: a changed file, or one its imports changed, is checked again)
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imageforge" / "mypy"
        c.run(f"{py} -m mypy --cache-dir {shlex.quote(str(cache))}", pty=False)
    paths = "tests/unit tests/overlays" if unit else "tests"
    if not unit:
        with user_errors():
            app.base(app.settings(manifest=str(ROOT / "build.yaml")), "cpu")
    # a fresh clone has no bytecode: compiled here, on every core, in ~1 s, not by both workers as they collect under
    # coverage's tracer (a fresh collection under coverage: 24 s -> 17 s). The vendor-layout fixtures are files to
    # copy, one of them broken on purpose; an error elsewhere is pytest's to report.
    c.run(f"{py} -m compileall -qq -j 0 -x {shlex.quote('tests/fixtures/')} src {paths}", pty=False, env=BYTECODE,
          warn=True, hide=True)
    selector = f" -k {shlex.quote(k)}" if k else ""
    # two workers (pytest-xdist), tests sent in groups by tests/conftest.py's scheduler: the Docker-mode vLLM files
    # one group, the in-place ones another, every other file its own (it says why, and counts the vLLM starts)
    args = f"-m pytest {paths}{selector} -n {WORKERS} --dist loadscope --no-loadscope-reorder --durations=20"
    if not coverage:
        c.run(f"{py} {args}", pty=False, env=BYTECODE)
        return
    _test_with_coverage(c, args)


# Bytecode written while the tests run, whatever the caller's PYTHONDONTWRITEBYTECODE (empty = unset): a fresh
# clone's venv and sources have none, and each of the ~300 Python processes a run starts (CLIs, the programs the
# tests run, the workers themselves) would compile what it imports from source again (torch alone: +3 s of CPU
# per process). __pycache__ is ignored by git.
BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}


def _test_with_coverage(c: Context, args: str) -> None:
    """``coverage run`` over pytest; every Python subprocess of the tests that imports imageforge (invoke
    subprocesses, a server process) is measured from that import on and writes its own data file
    (tests/coverage_on_import.py); combined, then TOTAL printed."""
    import shutil
    import sysconfig

    from invoke.exceptions import Exit

    py = sys.executable
    out = ROOT / ".imageforge" / "coverage"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rcfile = str(ROOT / "pyproject.toml")
    env = {"COVERAGE_FILE": str(out / "data"), "COVERAGE_RCFILE": rcfile, "IMAGEFORGE_COVERAGE_ON_IMPORT": rcfile,
           **BYTECODE}
    site = Path(sysconfig.get_path("purelib"))  # this venv's: the tests' subprocesses run its python
    hook = site / "imageforge_coverage_on_import.py"
    pth = site / "imageforge_coverage_on_import.pth"
    shutil.copyfile(ROOT / "tests" / "coverage_on_import.py", hook)
    pth.write_text("import imageforge_coverage_on_import\n")
    try:
        result = c.run(f"{py} -m coverage run {args}", pty=False, warn=True, env=env)
    finally:
        pth.unlink(missing_ok=True)
        hook.unlink(missing_ok=True)
    c.run(f"{py} -m coverage combine --quiet", pty=False, env=env, warn=True)
    report = c.run(f"{py} -m coverage report", pty=False, env=env, hide=True, warn=True)
    (out / "report.txt").write_text(report.stdout if report else "")
    total = [line for line in (report.stdout if report else "").splitlines() if line.startswith("TOTAL")]
    print(f"coverage of src/ (report: {out / 'report.txt'}):")
    print(total[-1] if total else "TOTAL: no coverage data")
    if result is None or result.return_code:
        raise Exit(code=result.return_code if result else 1)


@task()
def schema(c: Context) -> None:
    """Rewrite schema/build.schema.json's step kinds from the registry (one module per kind in steps/)."""
    from imageforge.steps.schema import write_schema  # the registry: not imported for every task

    path = ROOT / "schema" / "build.schema.json"
    print(f"{path}: {'rewritten' if write_schema(path) else 'already the registry'}'s step kinds")


ns = commands.collection(test, schema)
