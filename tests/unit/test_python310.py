"""imageforge runs on the card machine's Python 3.10, which no machine here has: checked statically.

vermin reads every module of the package (annotations evaluated) and names the lowest Python each needs;
pyproject's ruff target and mypy's python_version say 3.10 too, so what vermin cannot see (a typing name
that is 3.11-only) mypy reports.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the unit tier also runs on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_and_checks_python_310() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["requires-python"] == ">=3.10"
    assert project["tool"]["ruff"]["target-version"] == "py310"
    assert project["tool"]["mypy"]["python_version"] == "3.10"


def _vermin(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("vermin")  # the console script beside this interpreter (no __main__)
    return subprocess.run([str(exe), "--target=3.10-", "--violations", "--no-tips", *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)


def test_vermin_finds_nothing_newer_than_310_in_src() -> None:
    proc = _vermin("--eval-annotations", "--backport", "typing_extensions", "src/imageforge")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vermin_catches_a_311_only_api(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import datetime\nprint(datetime.datetime.now(datetime.UTC))\n", encoding="utf-8")
    proc = _vermin(str(bad))
    assert proc.returncode != 0
    assert "datetime.UTC" in proc.stdout
