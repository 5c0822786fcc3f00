"""`imageforge native build --in-place` on this machine: a real C Python extension built by the step's `build:`,
checked against this machine's files, imported by the target interpreter, its pin rewritten; `--check` compares.

The target's package is pyelftools (any installed distribution does: native build needs the interpreter, not
vLLM); the interpreter is this test's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None or not Path(sysconfig.get_paths()["include"], "Python.h").is_file(),
                                reason="no C compiler or no Python headers on this host")

EXT = "demo" + str(sysconfig.get_config_var("EXT_SUFFIX"))
MODULE_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) { return PyNumber_Add(arg, arg); }
static PyMethodDef methods[] = {{"twice", twice, METH_O, "twice(x) -> x + x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "demo", NULL, -1, methods};
PyMODINIT_FUNC PyInit_demo(void) { return PyModule_Create(&mod); }
"""
PIN = "sha256:" + "0" * 64


def manifest(root: Path, *, pin: str = PIN, build: str | None = None, record: bool = False) -> Path:
    native = root / "native"
    native.mkdir(parents=True, exist_ok=True)
    (native / "demo.c").write_text(MODULE_C)
    include = sysconfig.get_paths()["include"]
    build = build or f"{CC} -shared -fPIC -O1 -I{include} demo.c -o {EXT}"
    path = root / "build.yaml"
    if record:
        (root / "vendor-api.json").write_text('{"format": 1, "python": "3.10.12", "modules": {}}\n')
    vendor_api = "    vendor_api: vendor-api.json\n" if record else ""
    path.write_text(f"""\
version: 1
default_target: box
targets:
  box:
    base: {{image: "example/base:1"}}
    package: {{import: elftools, distribution: pyelftools, version: "*", flags: off}}
    image: imageforge-test/box
{vendor_api}    steps:
      - id: demo-ext
        kind: native
        why: a C extension built where it runs
        directory: native
        build: "{build}"
        interpreter: {os.path.realpath(sys.executable)}
        extensions:
          - file: {EXT}
            dest: elftools/{EXT}
            sha256: "{pin}"   # written by native build
    serving:
      config_path: /etc/imageforge/serving.yaml
      command: [python3, -m, http.server]
      args: {{model: /m}}
""")
    return path


def native_build(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imageforge.cli.launch", "native", "build", "--manifest", str(path),
                           "--step", "demo-ext", "--in-place", "--python", sys.executable, *args],
                          capture_output=True, text=True, timeout=300, cwd=path.parent)


def test_build_checks_imports_and_rewrites_the_pin_then_check_compares(tmp_path: Path) -> None:
    path = manifest(tmp_path)
    done = native_build(path, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the build's own output (cc's) is on stderr
    built = tmp_path / "native" / EXT
    digest = hashlib.sha256(built.read_bytes()).hexdigest()
    assert report["pins"] == [{"file": EXT, "old": "0" * 64, "new": digest, "changed": True}]
    assert report["findings"] == [] and report["rewritten"] is True
    assert report["imports"]["modules"] == [{"name": "demo", "ok": True, "functions": {"twice": "twice(x) -> x + x"}}]
    text = path.read_text()
    assert f'sha256: "sha256:{digest}"   # written by native build\n' in text  # only the value changed
    assert text == manifest(tmp_path / "again", pin=f"sha256:{digest}").read_text().replace(
        str(tmp_path / "again"), str(tmp_path))
    same = native_build(path, "--check")
    assert same.returncode == 0, same.stderr
    assert "matches its pin" in same.stdout
    path.write_text(text.replace(digest, "1" * 64))
    stale = native_build(path, "--check")
    assert stale.returncode == 3 and "differs from its pin" in stale.stdout
    assert "1" * 64 in path.read_text()  # --check rewrites nothing


def test_a_build_that_makes_a_broken_extension_keeps_the_pins(tmp_path: Path) -> None:
    include = sysconfig.get_paths()["include"]
    path = manifest(tmp_path, build=f"echo building on stdout && {CC} -shared -fPIC -O1 -I{include} demo.c "
                                    f"-o {EXT} -DPyInit_demo=PyInit_other && cp {EXT} stray.so")
    done = native_build(path, "--json")
    assert done.returncode == 3
    report = json.loads(done.stdout)
    assert sorted(f["code"] for f in report["findings"]) == ["import-failed", "no-pyinit", "unpinned"]
    assert PIN in path.read_text()


def test_build_writes_the_functions_into_the_vendor_api_record(tmp_path: Path) -> None:
    path = manifest(tmp_path, record=True)
    done = native_build(path, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["recorded"] is True and report["record"] == str((tmp_path / "vendor-api.json").resolve())
    record = json.loads((tmp_path / "vendor-api.json").read_text())
    assert record["modules"] == {"elftools.demo": {"complete": False,
                                                   "twice": {"kind": "function", "signature": "(x) -> x + x"}}}
    before = (tmp_path / "vendor-api.json").read_text()
    again = native_build(path)
    assert again.returncode == 0, again.stderr
    assert "already lists these functions" in again.stdout
    assert (tmp_path / "vendor-api.json").read_text() == before
