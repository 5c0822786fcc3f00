"""The package stands on its own: `pip install .` (not editable) into a fresh venv validates build.yaml.

The JSON Schemas are package data (imageforge/schema/*.json, found through importlib.resources),
so a wheel installed anywhere validates a manifest and a smoke suite without the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

CHECK = """\
import sys
from pathlib import Path
import imageforge
from imageforge.manifest import load_manifest
from imageforge.resolve import validate_all
from imageforge.smoke import load_suite
repo = Path(sys.argv[1])
assert Path(imageforge.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), imageforge.__file__
print(validate_all(load_manifest(repo / "build.yaml")).text())
print("suite", load_suite(repo / "smoke" / "dummy.yaml").name)
"""


def test_pip_install_into_a_fresh_venv_validates_build_yaml(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building a wheel writes build/ and *.egg-info next to the sources
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
                             capture_output=True, text=True, env=env, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    proc = subprocess.run([str(python), "-c", CHECK, str(REPO)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "build.yaml: ok" in proc.stdout and "target cpu" in proc.stdout and "target bi100" in proc.stdout
    assert "suite dummy-ok" in proc.stdout
