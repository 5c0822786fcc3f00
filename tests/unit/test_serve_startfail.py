"""A failed start names the step that wrote the file its traceback goes through (the first server start
proves the imports a default build no longer checks).

The logs under tests/fixtures/start-failures/ are real: ``invoke run`` of the cpu image with one extra step that
breaks it (captured 2026-12-03 from vLLM 0.32's CPU image; see that folder's README).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from imageforge.blame import Frame, diagnose, tracebacks, writers
from imageforge.errors import InfraError, SmokeError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve import process as sp
from imageforge.serve.ports import free_port
from imageforge.serve.startfail import exit_hint, start_error
from imageforge.steps import OverlaySpec

REPO = Path(__file__).resolve().parents[2]
CAPTURED = REPO / "tests" / "fixtures" / "start-failures"
SITE = "/opt/venv/lib/python3.11/site-packages/"


def lines_of(name: str) -> list[str]:
    return (CAPTURED / name).read_text().splitlines()


def cpu_with(tmp_path: Path, steps: list[dict[str, Any]], files: dict[str, str] | None = None) -> Resolved:
    """The repository's cpu target with ``steps`` added at its end (as the capture's manifest was made)."""
    data = yaml.safe_load((REPO / "build.yaml").read_text())
    target = data["targets"]["cpu"]
    target["base"]["recipe"] = str((REPO / target["base"]["recipe"]).resolve())
    target["steps"] = [*target["steps"], *steps]
    for rel, text in (files or {}).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for rel in [s["source"] for s in target["steps"] if "source" in s] + [target["smoke"]["suite"]]:
        if not (tmp_path / rel).exists():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes((REPO / rel).read_bytes())
    for rel in [s["directory"] for s in target["steps"] if "directory" in s and "$" not in s["directory"]]:
        if not (tmp_path / rel).exists():  # a step's host folder (the native step's pinned extensions)
            shutil.copytree(REPO / rel, tmp_path / rel)
    (tmp_path / "build.yaml").write_text(yaml.safe_dump({"version": 1, "default_target": "cpu",
                                                         "targets": {"cpu": target}}, sort_keys=False))
    return resolve(load_manifest(tmp_path / "build.yaml"), "cpu", None, environ={})


BREAK_CPU_MOE = {"id": "break-cpu-moe", "kind": "patch", "why": "a module-level AttributeError",
                 "file": "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py",
                 "old": "import math\nimport sys\n",
                 "new": "import math\nimport sys  # imageforge: fault test\n\nmath.imageforge_fault_test()\n"}


# --------------------------------------------------------------------------- parsing


def test_a_traceback_behind_vllms_log_prefix_is_read_whole() -> None:
    prefix = "(EngineCore pid=26) ERROR 12-03 12:11:35 [core.py:708] "
    lines = ["(APIServer pid=1) INFO 12-03 12:11:14 [api_utils.py:347] starting",
             prefix + "EngineCore failed to start.",
             prefix + "Traceback (most recent call last):",
             prefix + f'  File "{SITE}vllm/v1/engine/core.py", line 700, in run_engine_core',
             prefix + "    engine_core = EngineCoreProc(*args, **kwargs)",
             prefix + "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
             prefix + f'  File "{SITE}vllm/x.py", line 12, in <module>',
             prefix + "    y = undefined",
             prefix + "NameError: name 'undefined' is not defined",
             "(APIServer pid=1) Traceback (most recent call last):",
             f'(APIServer pid=1)   File "{SITE}vllm/entrypoints/cli/main.py", line 3, in main',
             "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above."]
    found = tracebacks(lines)
    assert [t.exception for t in found] == ["NameError: name 'undefined' is not defined",
                                            "RuntimeError: Engine core initialization failed. See root cause above."]
    assert found[0].frames[-1] == Frame(f"{SITE}vllm/x.py", 12, "<module>", "y = undefined")
    assert found[0].frames[0].code == "engine_core = EngineCoreProc(*args, **kwargs)"  # not the ^^^ line under it
    assert found[0].frames[-1].relative == "vllm/x.py" and found[0].type == "NameError"
    assert len(found[0].frames) == 2 and len(found[1].frames) == 1


def test_chained_tracebacks_each_count_and_a_log_without_one_gives_none(cpu_resolved: Resolved) -> None:
    lines = ["Traceback (most recent call last):", '  File "/a/site-packages/m.py", line 1, in <module>',
             "ImportError: no", "", "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "/a/site-packages/n.py", line 2, in f',
             "pkg.errors.ConfigFault: bad"]
    found = tracebacks(lines)
    assert [t.type for t in found] == ["ImportError", "ConfigFault"]
    assert diagnose(["RuntimeError: boom", "no traceback here"], cpu_resolved.steps) is None


@pytest.fixture(scope="module")
def cpu_resolved() -> Resolved:
    return resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={})


# --------------------------------------------------------------------------- which step wrote the file


def test_writers_by_kind(cpu_resolved: Resolved) -> None:
    by_id = {s.id: s for s in cpu_resolved.steps}
    moe = f"{SITE}vllm/model_executor/layers/fused_moe/experts/cpu_moe.py"
    assert [s.id for s in writers(cpu_resolved.steps, moe)] == ["cpu-moe-skip-prepack", "cpu-moe-native-grouping",
                                                                    "cpu-moe-apply-sorted"]
    overlay = next(s for s in cpu_resolved.steps if s.kind == "overlay")
    assert [s.id for s in writers(cpu_resolved.steps, SITE + OverlaySpec.of(overlay).dest)] == [overlay.id]
    # a script's declared touches: a directory it may change; a symlink's link directory
    assert "ldconfig" in [s.id for s in writers(cpu_resolved.steps, "/usr/local/lib/libx.so")]
    assert "torch-libs-into-usr-local" in [s.id for s in writers(cpu_resolved.steps, "/usr/local/lib/libx.so")]
    assert writers(cpu_resolved.steps, f"{SITE}vllm/entrypoints/cli/main.py") == []
    assert writers(cpu_resolved.steps, f"{SITE}other/vllm/model_executor/layers/fused_moe/experts/cpu_moe.pyc") == []
    assert by_id["ldconfig"].kind == "script"


def test_a_script_touching_the_install_scheme_is_found_under_site_packages(tmp_path: Path) -> None:
    (tmp_path / "s.sh").write_text("#!/bin/sh\n")
    resolved = cpu_with(tmp_path, [{"id": "pip-transformers", "kind": "script", "source": "s.sh",
                                    "touches": ["{purelib}/transformers"]}])
    found = writers(resolved.steps, f"{SITE}transformers/configuration_utils.py")
    assert [s.id for s in found] == ["pip-transformers"]


# --------------------------------------------------------------------------- real failing starts


def test_a_real_engine_start_broken_by_a_patch_names_that_patch(tmp_path: Path) -> None:
    resolved = cpu_with(tmp_path, [BREAK_CPU_MOE])
    log = lines_of("patch-cpu-moe.log")
    failure = diagnose(log, resolved.steps)
    assert failure is not None and failure.step is not None
    assert failure.step.id == "break-cpu-moe"  # the last of the three steps that write cpu_moe.py
    assert [s.id for s in failure.steps] == ["cpu-moe-skip-prepack", "cpu-moe-native-grouping", "cpu-moe-apply-sorted",
                                                "break-cpu-moe"]
    assert failure.frame.relative == "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py"
    assert failure.frame.line == 8 and failure.frame.function == "<module>"
    assert failure.trace.exception == "AttributeError: module 'math' has no attribute 'imageforge_fault_test'"
    assert failure.headline("vllm") == ("vLLM did not start: AttributeError in "
                                        "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py line 8, "
                                        "written by step 'break-cpu-moe' (patch)")
    err = start_error(what="cpu:conservative", package="vllm", seconds=41.2, state="status exited, exit code 1",
                      expected="GET http://127.0.0.1:1/health -> 200", hint=exit_hint(log[-50:], resolved, log=log),
                      log=log, log_tail=log[-50:], steps=resolved.steps, saved="/runs/x/server.log")
    assert isinstance(err, SmokeError) and err.exit_code == 4
    assert err.location is not None and err.location.file.endswith("build.yaml") and err.location.line
    assert err.key_path == failure.step.key_path
    assert (err.found or "").startswith("status exited, exit code 1, the server of cpu:conservative stopped before "
                                        "it was ready (41s after start): AttributeError: module 'math'")
    assert "which step 'break-cpu-moe' (patch, " in (err.hint or "") and "--base` runs" in (err.hint or "")
    assert (err.hint or "").endswith("full log: /runs/x/server.log")
    text = err.render()
    assert text.startswith(f"smoke failure: {err.location}: {failure.step.key_path}: vLLM did not start: ")


def test_a_real_api_server_broken_by_an_overlay_names_that_overlay(tmp_path: Path) -> None:
    resolved = cpu_with(tmp_path, [{"id": "break-serve", "kind": "overlay", "source": "faults/entry.py",
                                    "dest": "vllm/entrypoints/launchers/api_server/entry.py"}],
                        {"faults/entry.py": "raise RuntimeError('imageforge fault test')\n"})
    log = lines_of("overlay-api-server.log")
    failure = diagnose(log, resolved.steps)
    assert failure is not None and failure.step is not None and failure.step.id == "break-serve"
    assert failure.frame.relative == "vllm/entrypoints/launchers/api_server/entry.py" and failure.frame.line == 1
    assert failure.trace.type == "RuntimeError"
    # Without the step in the plan the same log still says where, and names no step.
    plain = diagnose(log, [s for s in resolved.steps if s.id != "break-serve"])
    assert plain is not None and plain.step is None
    assert plain.headline("vllm") == ("vLLM did not start: RuntimeError in "
                                      "vllm/entrypoints/launchers/api_server/entry.py line 1")


def test_without_a_traceback_the_start_error_is_the_one_of_before(cpu_resolved: Resolved) -> None:
    err = start_error(what="cpu:p", package="vllm", seconds=3, state="status exited, exit code 137",
                      expected="GET u/health -> 200", hint="h", log=["Killed"], log_tail=["Killed"],
                      steps=cpu_resolved.steps, error_cls=InfraError)
    assert isinstance(err, InfraError) and err.message == "the server of cpu:p stopped before it was ready (3s after " \
        "start)" and err.found == "status exited, exit code 137" and err.location is None


# --------------------------------------------------------------------------- an in-place process that fails


def test_an_in_place_process_that_fails_names_the_step(tmp_path: Path,
                                                       write_manifest: Callable[[str], Path]) -> None:
    """A real process (not vLLM) whose module-level error is in the file an overlay step writes."""
    fault = tmp_path / "root" / "lib" / "python3" / "site-packages" / "vllm" / "fault.py"
    fault.parent.mkdir(parents=True)
    fault.write_text("import sys\nraise ImportError('imageforge fault test: cannot import name x')\n")
    target = {"base": {"image": "debian:bookworm"},
              "package": {"import": "vllm", "distribution": "vllm", "version": "1.0"},
              "steps": [{"id": "the-fault", "kind": "overlay", "source": "overlays/x.py", "dest": "vllm/fault.py"}],
              "serving": {"config_path": "/x.yaml", "style": "argv", "command": [sys.executable, str(fault)],
                          "args": {"model": "/m"}},
              "default_profile": "one", "profiles": {"one": {}}, "smoke": {"startup_timeout": 20}}
    text = yaml.safe_dump({"version": 1, "default_target": "p", "targets": {"p": target}}, sort_keys=False)
    resolved = resolve(load_manifest(write_manifest(text)), "p", None, environ={})
    with pytest.raises(SmokeError) as info, sp.serving(resolved, sp.ProcessRuntime(python=sys.executable),
                                                        port=free_port(), log=lambda _line: None):
        pass
    err = info.value
    assert err.exit_code == 4
    assert err.message == ("vLLM did not start: ImportError in vllm/fault.py line 2, written by step 'the-fault' "
                           "(overlay)")
    assert err.location == resolved.steps[0].location and err.key_path == "targets.p.steps[0]"
    assert "stopped before it was ready" in (err.found or "") and "exited with code 1" in (err.found or "")
    assert "which step 'the-fault' (overlay, " in (err.hint or "") and "server.log" in (err.hint or "")
    assert any("cannot import name x" in line for line in err.log_tail)


def test_a_failed_import_of_verify_imports_names_the_step(cpu_resolved: Resolved) -> None:
    """``build --verify-imports``: the in-image program keeps a failed import's last 6 traceback lines (header cut)."""
    from imageforge.verify import failures_of

    step = next(s for s in cpu_resolved.steps if s.kind == "overlay")
    trace = ['  File "<frozen importlib._bootstrap_external>", line 940, in exec_module',
             '  File "<frozen importlib._bootstrap>", line 241, in _call_with_frames_removed',
             f'  File "{SITE}{OverlaySpec.of(step).dest}", line 5, in <module>', "    import vllm.not_there",
             "ModuleNotFoundError: No module named 'vllm.not_there'"]
    result = {"imports": [{"module": "m", "error": "ModuleNotFoundError: No module named 'vllm.not_there'",
                           "trace": trace}]}
    assert failures_of(result, cpu_resolved.steps) == [
        f"import m failed: ModuleNotFoundError: No module named 'vllm.not_there' (ModuleNotFoundError in "
        f"{OverlaySpec.of(step).dest} line 5, written by step {step.id!r} (overlay))"]
    assert failures_of(result) == ["import m failed: ModuleNotFoundError: No module named 'vllm.not_there' "
                                   f"(ModuleNotFoundError in {OverlaySpec.of(step).dest} line 5)"]
