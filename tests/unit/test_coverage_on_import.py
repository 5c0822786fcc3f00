"""tests/coverage_on_import.py: a Python subprocess of the tests is measured from its first import of imageforge, and
a process that never imports it starts no coverage (no data file, none of coverage's start-up cost)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import coverage

from tests.coverage_on_import import VARIABLE

TESTS = Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path: Path) -> list[Path]:
    config = tmp_path / "coverage.toml"
    config.write_text('[tool.coverage.run]\nsource_pkgs = ["imageforge"]\nparallel = true\n')
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    env.update({VARIABLE: str(config), "COVERAGE_FILE": str(data / "d")})
    hook = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import coverage_on_import; "
    subprocess.run([sys.executable, "-c", hook + code], env=env, check=True, cwd=tmp_path)
    return sorted(data.iterdir())


def test_a_process_that_never_imports_imageforge_writes_no_data(tmp_path: Path) -> None:
    assert _run("import json, email.parser; print(json.dumps(1))", tmp_path) == []


def test_a_process_is_measured_from_its_first_import_of_imageforge(tmp_path: Path) -> None:
    [written] = _run("import json; from imageforge.errors import ConfigError; ConfigError('x').render()", tmp_path)
    data = coverage.CoverageData(str(written))
    data.read()
    measured = {Path(f).relative_to(TESTS.parent).as_posix() for f in data.measured_files()}
    assert "src/imageforge/errors.py" in measured, measured
    errors = next(f for f in data.measured_files() if f.endswith("imageforge/errors.py"))
    source = Path(errors).read_text().splitlines()
    body = next(n for n, line in enumerate(source, 1) if "main = Problem(" in line)  # the first line of render()
    lines = set(data.lines(errors) or [])
    assert 1 in lines, "the module's first line: measured from the import on"
    assert body in lines, "what the process ran after the import"


def test_two_copies_of_the_hook_start_one_coverage(tmp_path: Path) -> None:
    """The venv's copy (the run's .pth) and another (this test's import of tests/coverage_on_import.py): starting
    coverage looks the package up again, which must not start a second one (a second data file)."""
    second = ("import importlib.util; spec = importlib.util.spec_from_file_location('second_copy', "
              f"{str(TESTS / 'coverage_on_import.py')!r}); copy = importlib.util.module_from_spec(spec); "
              "spec.loader.exec_module(copy); ")
    assert len(_run(second + "import imageforge.errors", tmp_path)) == 1
