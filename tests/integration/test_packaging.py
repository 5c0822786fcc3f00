"""The package stands on its own: `pip install .` (not editable) into a fresh venv validates build.yaml.

The JSON Schemas live in the top-level schema/ and are package data of the wheel (imageforge/schema/*.json,
copied there by setup.py's build hook, found through importlib.resources), so a wheel installed anywhere
validates a manifest and a smoke suite without the checkout.
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
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, source)
    shutil.copytree(REPO / "schema", source / "schema")
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


SCHEMAS = """\
import sys
from importlib.resources import files
from pathlib import Path
import imageforge
from imageforge.yamldoc import CHECKOUT_SCHEMAS, load_schema
packaged = files("imageforge").joinpath("schema").joinpath("build.schema.json").is_file()
print("packaged" if packaged else f"checkout {CHECKOUT_SCHEMAS}")
print(sorted(load_schema("build.schema.json")["$defs"])[:1], sorted(load_schema("smoke.schema.json")["$defs"])[:1])
"""


def test_editable_install_reads_the_top_level_schema_folder(tmp_path: Path) -> None:
    """`pip install -e .`: no copy of the schemas is made; the checkout's schema/ is what validates."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, source)
    shutil.copytree(REPO / "schema", source / "schema")
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e",
                              str(source)], capture_output=True, text=True, env=env, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    assert not (source / "src" / "imageforge" / "schema").exists()
    proc = subprocess.run([str(python), "-c", SCHEMAS], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == f"checkout {source / 'schema'}"
    (source / "schema" / "build.schema.json").write_text("{}")  # edits are seen at once: it is not a copy
    again = subprocess.run([str(python), "-c", SCHEMAS], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=120)
    assert again.returncode != 0 and "KeyError: '$defs'" in again.stderr
