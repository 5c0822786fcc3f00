"""The package stands on its own: `pip install .` (not editable) into a fresh venv validates build.yaml.

The JSON Schemas live in the top-level schema/ and are package data of the wheel (imageforge/schema/*.json,
copied there by setup.py's build hook, found through importlib.resources), so a wheel installed anywhere
validates a manifest and a smoke suite without the checkout.
"""

from __future__ import annotations

import json
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
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import validate_all
from imageforge.smoke import load_suite
from imageforge.inimage import PROGRAMS, program
repo = Path(sys.argv[1])
assert Path(imageforge.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), imageforge.__file__
print(validate_all(load_manifest(repo / "build.yaml")).text())
print("suite", load_suite(repo / "smoke" / "dummy.yaml").name)
print("programs", [compile(program(name), name, "exec") is not None for name in PROGRAMS])
"""


def _install_copy(tmp_path: Path, *pip_args: str) -> tuple[Path, Path, dict[str, str]]:
    """A copy of the project (building writes build/ and *.egg-info next to the sources) `pip install`ed with
    ``pip_args`` into a fresh venv outside the repository's environment: (the copy, the venv's python, its env)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):  # readme, license: metadata
        shutil.copy(REPO / name, source)
    shutil.copytree(REPO / "schema", source / "schema")
    # the starter's links to images/cpu and smoke/ are followed: the wheel holds copies
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: what the tests import compiles as it runs; the rest (pygments' lexers ...) never needs to
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                              *pip_args, str(source)], capture_output=True, text=True, env=env, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return source, python, env


def test_pip_install_into_a_fresh_venv_validates_build_yaml(tmp_path: Path) -> None:
    _, python, env = _install_copy(tmp_path)
    proc = subprocess.run([str(python), "-c", CHECK, str(REPO)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "build.yaml: ok" in proc.stdout and "target cpu" in proc.stdout and "target bi100" in proc.stdout
    assert "suite dummy-ok" in proc.stdout
    from imageforge.inimage import PROGRAMS

    assert f"programs {[True] * len(PROGRAMS)}" in proc.stdout, "the in-image programs are in the wheel"

    # the console command, outside the repository: init a starter project, then validate and plan it
    imageforge = python.parent / "imageforge"
    project = tmp_path / "project"
    init = subprocess.run([str(imageforge), "init", "--dir", str(project)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert init.returncode == 0, init.stderr[-3000:]
    assert (project / "images" / "cpu" / "base.yaml").read_bytes() == (REPO / "images/cpu/base.yaml").read_bytes()
    assert (project / "smoke" / "dummy.yaml").read_bytes() == (REPO / "smoke/dummy.yaml").read_bytes()
    validate = subprocess.run([str(imageforge), "validate", "--json"], capture_output=True, text=True, env=env,
                              cwd=project, timeout=120)
    assert validate.returncode == 0, validate.stderr[-3000:]
    assert set(json.loads(validate.stdout)["targets"]) == {"cpu"}
    plan = subprocess.run([str(imageforge), "plan", "-t", "cpu", "--no-daemon", "-j"], capture_output=True,
                          text=True, env=env, cwd=project, timeout=120)
    assert plan.returncode == 0 and json.loads(plan.stdout)["profile"] == "conservative", plan.stderr[-3000:]
    # the core install is small: the plots and model extras are not in it
    missing = subprocess.run([str(python), "-c", "import importlib.util as u; "
                              "print([m for m in ('matplotlib', 'numpy', 'safetensors') if u.find_spec(m)])"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.stdout.strip() == "[]", missing.stdout

SCHEMAS = """\
import sys
from importlib.resources import files
from pathlib import Path
import imageforge
from imageforge.manifest.yaml_schema import CHECKOUT_SCHEMAS, load_schema
packaged = files("imageforge").joinpath("schema").joinpath("build.schema.json").is_file()
print("packaged" if packaged else f"checkout {CHECKOUT_SCHEMAS}")
print(sorted(load_schema("build.schema.json")["$defs"])[:1], sorted(load_schema("smoke.schema.json")["$defs"])[:1])
"""


def test_editable_install_reads_the_top_level_schema_folder(tmp_path: Path) -> None:
    """`pip install -e .`: no copy of the schemas is made; the checkout's schema/ is what validates."""
    source, python, env = _install_copy(tmp_path, "-e")
    assert not (source / "src" / "imageforge" / "schema").exists()
    proc = subprocess.run([str(python), "-c", SCHEMAS], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == f"checkout {source / 'schema'}"
    (source / "schema" / "build.schema.json").write_text("{}")  # edits are seen at once: it is not a copy
    again = subprocess.run([str(python), "-c", SCHEMAS], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=120)
    assert again.returncode != 0 and "KeyError: '$defs'" in again.stderr
