"""`invoke wheels --python 3.11`: a real download from PyPI, sent as parts, joined and installed with no index.

The wheelhouse is built through the task (a subprocess, as a user runs it), its parts are joined by
the shipped stdlib script into another folder, and a fresh venv installs from there with
``--no-index --require-hashes``; the installed package then imports, finds its schemas and validates
the repository's build.yaml and a smoke suite from outside the checkout, and invoke lists the tasks.
No Docker daemon is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
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
from imageforge.manifest.yaml_schema import load_schema
repo = Path(sys.argv[1])
assert Path(imageforge.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), imageforge.__file__
assert load_schema("build.schema.json")["title"] and load_schema("smoke.schema.json")["title"]
print(validate_all(load_manifest(repo / "build.yaml")).text())
print("suite", load_suite(repo / "smoke" / "dummy.yaml").name)
print("docker" in sys.modules)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def test_wheels_for_3_11_join_and_install_offline_into_a_fresh_venv(tmp_path: Path) -> None:
    out = tmp_path / "wheelhouse-cp311"
    env = {**_env(), "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "wheels", "--python", "3.11",
                           "--out", str(out), "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    names = {w["name"] for w in report["wheels"]}
    assert {"imageforge", "invoke", "pyyaml", "jsonschema", "docker"} <= names
    files = {w["file"] for w in report["wheels"]}
    assert all("cp311" in f or "abi3" in f or "none-any" in f for f in files), files
    assert report["total_bytes"] == sum(p.stat().st_size for p in out.glob("*.whl"))
    parts = [Path(p) for p in report["parts"]]
    assert parts and all(p.stat().st_size <= 4_000_000 for p in parts)

    own = next(out.glob("imageforge-*.whl"))
    with zipfile.ZipFile(own) as wheel:
        held = set(wheel.namelist())
    assert {"imageforge/schema/build.schema.json", "imageforge/schema/smoke.schema.json"} <= held
    assert "imageforge/wheelhouse/join.py" in held

    joined = tmp_path / "joined"
    join = subprocess.run([sys.executable, "-I", str(out / "parts" / "wheelhouse_join.py"), "--out", str(joined)],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert join.returncode == 0, join.stderr
    assert sorted(p.name for p in joined.iterdir()) == sorted(p.name for p in out.iterdir() if p.is_file())

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_env(), timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: what the check imports compiles as it runs; the rest (pygments' lexers ...) never needs to
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                              "--no-index", "--find-links", str(joined), "--require-hashes",
                              "-r", str(joined / "requirements.txt")],
                             capture_output=True, text=True, env=_env(), timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    check = subprocess.run([str(python), "-c", CHECK, str(REPO)], capture_output=True, text=True, env=_env(),
                           cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "build.yaml: ok" in check.stdout and "target cpu" in check.stdout
    assert "suite dummy-ok" in check.stdout
    assert check.stdout.strip().endswith("False")  # validating never imported the docker SDK

    listing = subprocess.run([str(venv / "bin" / "invoke"), "-r", str(REPO), "--list"], capture_output=True,
                             text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert listing.returncode == 0, listing.stderr[-3000:]
    assert "wheels" in listing.stdout and "validate" in listing.stdout
