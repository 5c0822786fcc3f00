"""The programs run inside an image are real modules of imageforge.inimage, shipped and sent as their text.

Each must run with a bare interpreter (``-I -S``: the standard library only) and say what its users read:
the verification its ``IMAGEFORGE-VERIFY`` line, the flag listing its ``IMAGEFORGE-FLAGS`` line (here against a
stand-in vLLM parser package), the submission runtime is run by tests/unit/test_submission.py.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from setuptools import find_packages

from imageforge import inimage, verify
from imageforge.docker_engine.containers import FIXED_MTIME
from imageforge.flags import learn as flags_read
from imageforge.inimage import PROGRAMS, apply_step, program
from imageforge.submission.applier import applier_source, verifier_source

SRC = Path(__file__).resolve().parents[2] / "src"


def test_each_program_is_a_module_of_the_package_read_back_verbatim() -> None:
    assert "imageforge.inimage" in find_packages(str(SRC)), "a package: the wheel ships its .py files"
    for name in PROGRAMS:
        path = SRC / "imageforge" / "inimage" / f"{name}.py"
        assert program(name) == path.read_text(encoding="utf-8")
        assert files(inimage).joinpath(f"{name}.py").is_file()
    assert program("verify_image") == verify.IN_IMAGE
    assert flags_read.introspection_source() == program("list_flags")
    with pytest.raises(ValueError, match="no in-image program 'nope'"):
        program("nope")


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_imports_the_standard_library_only(name: str) -> None:
    tree = ast.parse(program(name))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:  # apply_step's imports for the type checker
            assert name == "apply_step" and node.module in ("patches.anchored", "patches.pycheck")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for top in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]):
                assert top.split(".")[0] in sys.stdlib_module_names or top == "__future__", (name, top)


def test_the_runtime_writes_the_engines_fixed_mtime() -> None:
    assert apply_step._FIXED_MTIME == FIXED_MTIME
    source = applier_source()
    assert "from ..patching" not in source and "from ..pycheck" not in source
    assert "# imageforge.inimage.apply_step\n" in source and "\n_FIXED_MTIME = 1577836800  #" in source


def test_the_trees_verify_py_puts_the_future_import_after_the_prelude_comments() -> None:
    text = verifier_source("/stage")
    assert text.count("from __future__ import annotations") == 1
    code = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert code[0] == "from __future__ import annotations"
    compile(text, "verify.py", "exec")


def test_verification_reports_a_missing_file_a_changed_overlay_and_a_failed_import(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    spec = {"python_files": [str(good), str(tmp_path / "gone.py")], "overlays": {str(good): "0" * 64},
            "links": [str(tmp_path / "nolink")], "link_globs": [], "imports": ["json", "no_such_module_x"],
            "import_env": {}}
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", verify.IN_IMAGE, json.dumps(spec)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1].removeprefix(verify.MARK))
    assert out["checked"] == {"python": 2, "run": 0, "overlays": 1, "symlinks": 1, "imports": 2}
    assert out["missing"] == [str(tmp_path / "gone.py")] and out["syntax"] == [] and out["stale"] == []
    assert out["compiled"] == [str(tmp_path / "__pycache__" / f"good.{sys.implementation.cache_tag}.pyc")]
    assert out["hash"][0]["found"] != "0" * 64 and out["symlinks"][0]["target"] is None
    assert [i["module"] for i in out["imports"]] == ["no_such_module_x"] and "content" not in out
    assert verify.failures_of(out)[0] == f"changed file missing in the image: {tmp_path / 'gone.py'}"


def _run_verify(spec: dict[str, object], *args: str, pythonpath: Path | None = None) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    proc = subprocess.run([sys.executable, "-S", "-c", verify.IN_IMAGE, *args, json.dumps(spec)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1].removeprefix(verify.MARK))
    return out


def test_changed_files_under_an_import_root_are_checked_live_ones_compiled_and_dead_ones_listed(
        tmp_path: Path) -> None:
    """The dead-file case of the vendor tree: a script's folder outside the import roots holds a patcher it runs
    and a dead patcher with a syntax error; a broken file the script copies into the package fails."""
    site, folder = tmp_path / "site", tmp_path / "workspace" / "scripts"
    (site / "pkg").mkdir(parents=True)
    folder.mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "copied.py").write_text("x = 1\n")
    (folder / "patch_run.py").write_text("print('patched')\n")
    (folder / "patch_dead.py").write_text("def broken(:\n")
    changed = [str(site / "pkg" / "copied.py"), str(folder / "patch_run.py"), str(folder / "patch_dead.py")]
    spec = {"python_files": [], "overlays": {}, "links": [], "link_globs": [], "imports": [], "import_env": {},
            "changed": changed, "live": {str(folder / "patch_run.py"): "run by patch_ops.sh"}, "image": False}
    out = _run_verify(spec, pythonpath=site)
    assert out["python_files"] == [str(site / "pkg" / "copied.py")] and out["run"] == [str(folder / "patch_run.py")]
    assert out["dead"] == [str(folder / "patch_dead.py")] and out["syntax"] == []
    assert out["checked"]["python"] == 1 and out["checked"]["run"] == 1
    assert verify.verdict(out, str(tmp_path))["dead"] == ["/workspace/scripts/patch_dead.py"]
    assert not (folder / "__pycache__").exists(), "a live file outside the roots is compiled in memory"
    planned = _run_verify(spec, "--plan", pythonpath=site)
    assert planned["pycs"] == [[str(site / "pkg" / "copied.py"), out["compiled"][0]]]

    (folder / "patch_run.py").write_text("print('patched'\n")  # a live file that does not compile
    (site / "pkg" / "copied.py").write_text("def f(:\n")  # a broken file copied into the package
    out = _run_verify({**spec, "write": False}, pythonpath=site)
    assert sorted(item["path"] for item in out["syntax"]) == sorted(changed[:2])
    assert out["dead"] == [str(folder / "patch_dead.py")]
    without_root = _run_verify(spec)  # the package not on sys.path: the copied file is dead too
    assert str(site / "pkg" / "copied.py") in without_root["dead"]


FAKE_PARSER = '''
import argparse
import json


def make_arg_parser(parser):
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=["auto", "half"], default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--hf-overrides", type=json.loads)
    parser.add_argument("--allowed-origins", nargs="+", dest="allowed_origins")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int)
    return parser
'''


def test_the_flag_listing_reads_the_parser_it_finds(tmp_path: Path) -> None:
    for rel, text in {"vllm/__init__.py": "__version__ = '0.0-test'\n", "vllm/utils/__init__.py": "",
                      "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
                      "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/openai/__init__.py": "",
                      "vllm/entrypoints/openai/cli_args.py": FAKE_PARSER}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = subprocess.run([sys.executable, "-S", "-c", flags_read.introspection_source()], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.splitlines()[-1].removeprefix(flags_read.MARKER))
    assert data["module"] == "vllm.entrypoints.openai.cli_args" and data["vllm"] == "0.0-test"
    table = flags_read.parse_introspection(proc.stdout)
    assert table.source == "vLLM 0.0-test's parser (7 flags)"
    got = {name: (spec.type, spec.choices, spec.negatable, spec.takes_value, spec.multiple, spec.aliases)
           for name, spec in table.flags.items()}
    assert got == {
        "port": ("int", (), False, True, False, ()), "dtype": ("choice", ("auto", "half"), False, True, False, ()),
        "enforce-eager": ("bool", (), False, False, False, ()),
        "enable-prefix-caching": ("bool", (), True, False, False, ()),
        "hf-overrides": ("json", (), False, True, False, ()), "allowed-origins": ("str", (), False, True, True, ()),
        "tensor-parallel-size": ("int", (), False, True, False, ("-tp",)),
    }


def test_the_flag_listing_without_vllm_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", flags_read.introspection_source()], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1
    assert "imageforge: no vLLM parser found in vllm.utils.argparse_utils, vllm.utils" in proc.stderr


def test_the_trees_verify_py_fails_the_build_on_a_problem_and_removes_its_stage(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    for python_files, code in (([str(good)], 0), ([str(good), str(tmp_path / "gone.py")], 3)):
        stage.mkdir()
        (stage / "verify.py").write_text(verifier_source(str(stage)))
        (stage / "spec.json").write_text(json.dumps({"python_files": python_files, "overlays": {}, "links": [],
                                                     "link_globs": [], "imports": [], "import_env": {}}))
        proc = subprocess.run([sys.executable, "-I", "-S", str(stage / "verify.py"), str(stage / "spec.json")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stderr
        assert proc.stdout.startswith(verify.MARK) and not stage.exists()
        if code:
            assert proc.stderr.startswith("imageforge: step verify failed: ")
            assert json.loads(proc.stderr.split(": ", 2)[2]) == {"missing": [str(tmp_path / "gone.py")]}
