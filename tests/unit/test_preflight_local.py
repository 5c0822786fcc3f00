"""``imageforge preflight --in-place`` on a tmp root holding a fake package tree (no daemon; the target interpreter is
this test's Python with ``PYTHONPATH`` at the fake site directory, as in test_inplace.py).

A clean target passes (exit 0) and changes nothing; a target with a planted defect of each kind the in-place run
covers (an anchor that misses, a ``.py`` that does not compile, a shell script using an unset variable, a CRLF file,
a vendor API record of another version) fails with exit 3 and names each one in the one report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from imageforge import inplace
from tests.cli import imageforge
from tests.unit.conftest import manifest_text
from tests.unit.test_inplace import make_root

SRC = Path(__file__).resolve().parents[2] / "src"

CLEAN = manifest_text("""\
    steps:
      - id: over
        kind: overlay
        source: overlays/sorted.py
        dest: vllm/sorted.py
      - id: fix
        kind: patch
        file: vllm/y.py
        old: "A = 1"
        new: "A = 2"
      - id: ops
        kind: script
        directory: scripts
        dest: /workspace/scripts
        command: [bash, run.sh]
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}
""")

BROKEN = manifest_text("""\
    steps:
      - id: over
        kind: overlay
        source: overlays/broken.py
        dest: vllm/broken.py
      - id: miss
        kind: patch
        file: vllm/moe.py
        old: "THREE = 3"
        new: "THREE = 9"
      - id: ops
        kind: script
        directory: scripts
        dest: /workspace/scripts
        command: [bash, run.sh]
    vendor_api: vendor-api.json
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}
""")

RUN_SH = """\
#!/bin/bash
set -euo pipefail
cp notes.txt /workspace/out.txt
"""


def _repo(tmp_path: Path, manifest: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "overlays").mkdir(parents=True)
    (repo / "scripts").mkdir()
    (repo / "overlays/sorted.py").write_text("def fused_experts():\n    return 1\n")
    (repo / "overlays/broken.py").write_text("def fused_experts(:\n    return 1\n")
    (repo / "scripts/run.sh").write_text(RUN_SH)
    (repo / "scripts/notes.txt").write_text("notes\n")
    (repo / "build.yaml").write_text(textwrap.dedent(manifest))
    return repo


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    root = make_root(tmp_path)
    return {"root": root, "env": {"PYTHONPATH": str(root / "site")}}


def _preflight(repo: Path, env: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    return imageforge("preflight", "--manifest", str(repo / "build.yaml"), "--target", "t", "--in-place",
                      "--root", str(env["root"]), "--python", sys.executable, "--allow-dirty", "--json", *extra,
                      env=env["env"], cwd=repo)


def test_a_clean_target_passes_and_changes_nothing(tmp_path: Path, env: dict[str, Any]) -> None:
    repo = _repo(tmp_path, CLEAN)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in env["root"].rglob("*"))
    proc = _preflight(repo, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["counts"]["error"] == 0, doc
    assert doc["ran"] == ["validate", "steps", "scripts", "run-env", "git"]
    # the script step is named, not run, with the journaled commands that run it for real
    [note] = [f for f in doc["findings"] if f["check"] == "script-not-run"]
    assert note["severity"] == "info" and "ops" in note["message"]
    assert "imageforge apply --in-place" in note["hint"] and "--steps ops" in note["hint"]
    assert "imageforge revert --root" in note["hint"]
    # each Docker phase left out is said, one line each
    for phase in ("python", "flags", "submission"):
        assert any(n.startswith(f"{phase}: ") for n in doc["notes"]), doc["notes"]
    assert doc["stats"]["compiled .py"] == 2  # the overlay and the patched file, by the target interpreter
    assert sorted((str(p), p.stat().st_mtime_ns) for p in env["root"].rglob("*")) == before
    assert not (env["root"] / inplace.JOURNAL_DIR.lstrip("/")).exists()


def test_every_planted_defect_is_a_finding_of_one_run(tmp_path: Path, env: dict[str, Any]) -> None:
    repo = _repo(tmp_path, BROKEN)
    (repo / "scripts/run.sh").write_text(RUN_SH + 'cp fused.so "${SCRIPT_DIR}/lib/"\n'  # never set
                                         + "python3 check.py\npython3 - <<'EOF'\nimport os\nprint(os.sep\nEOF\n")
    (repo / "scripts/check.py").write_text("import sys\n\ndef ok(:\n    return 0\n")  # the script runs it
    (repo / "scripts/dead.py").write_text("def never(:\n")  # nothing runs or imports it: not compiled
    (repo / "scripts/fused.so").write_bytes(b"not elf")
    (repo / "scripts/env.sh").write_bytes(b"export A=1\r\nexport B=2\r\n")
    record = {"format": 1, "python": sys.version.split()[0], "versions": {"vllm": "0.9"}, "modules": {},
              "libraries": {}}
    (repo / "vendor-api.json").write_text(json.dumps(record))
    proc = _preflight(repo, env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    by_check: dict[str, list[dict[str, Any]]] = {}
    for f in doc["findings"]:
        by_check.setdefault(f["check"], []).append(f)
    [miss] = [f for f in by_check["step"] if f["step"] == "miss"]
    assert "miss" in miss["message"] and miss["path"].endswith("build.yaml") and miss["line"]
    broken = [f for f in by_check.get("py-syntax", []) + by_check["step"] if "broken.py" in (f["path"] + f["message"])]
    assert broken, doc["findings"]
    [unset] = [f for f in by_check["shellcheck"] if "SCRIPT_DIR" in f["message"]]
    assert unset["path"].endswith("run.sh") and unset["line"] == 4 and unset["step"] == "ops"
    syntax = {(f["path"], f["line"], f["step"]) for f in by_check["py-syntax"]}
    assert syntax == {("/workspace/scripts/check.py", 3, "ops"), ("/workspace/scripts/run.sh", 8, "ops")}, syntax
    [crlf] = by_check["crlf"]
    assert crlf["path"].endswith("env.sh") and crlf["step"] == "ops"
    assert any("fused.so" in f["path"] for f in by_check["pin-missing"])
    [version] = by_check["vendor-versions"]
    assert (version["expected"], version["found"]) == ("0.9", "1.0")
    assert doc["ran"] == ["validate", "steps", "vendor-api", "scripts", "run-env", "git"]
    text = _preflight(repo, env).stdout
    assert json.loads(text)["counts"] == doc["counts"]  # nothing was written: a second run says the same


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # the step's own check, here
def test_a_file_the_target_interpreter_does_not_compile_is_a_finding_at_its_line(tmp_path: Path,
                                                                                   env: dict[str, Any]) -> None:
    """The target here is stricter than this machine's Python (warnings are errors: what a newer or older
    interpreter's grammar is to a file this one accepts): the step's own check passes, the target's compile of
    the final state fails, at the file and line."""
    repo = _repo(tmp_path, CLEAN)
    (repo / "overlays/sorted.py").write_text('def fused_experts():\n    return 1\n\n\nPATTERN = "\\d+"\n')
    target = tmp_path / "target-python"
    target.write_text(f"#!/bin/sh\nexec {sys.executable} -W error \"$@\"\n")
    target.chmod(0o755)
    proc = imageforge("preflight", "--manifest", str(repo / "build.yaml"), "--in-place", "--root",
                      str(env["root"]), "--python", str(target), "--allow-dirty", "--json", env=env["env"], cwd=repo)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    [found] = [f for f in doc["findings"] if f["severity"] == "error"]
    assert found["check"] == "py-syntax" and found["step"] == "over", found
    assert (found["path"], found["line"]) == ("/site/vllm/sorted.py", 5)
    assert "escape sequence" in found["message"]


def test_a_step_whose_file_breaks_is_a_finding_naming_the_file(tmp_path: Path, env: dict[str, Any]) -> None:
    repo = _repo(tmp_path, CLEAN)
    (repo / "overlays/sorted.py").write_text("def fused_experts():\n    return 1\n\n\nreturn 2\n")
    proc = _preflight(repo, env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [found] = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"]
    assert found["check"] == "step" and found["step"] == "over" and found["path"].endswith("build.yaml")
    assert "/site/vllm/sorted.py" in found["message"] and "line 5" in found["message"]


def test_root_and_python_need_in_place(tmp_path: Path, env: dict[str, Any]) -> None:
    repo = _repo(tmp_path, CLEAN)
    proc = imageforge("preflight", "--manifest", str(repo / "build.yaml"), "--root", str(env["root"]), cwd=repo)
    assert proc.returncode == 2 and "--in-place" in proc.stderr


def test_an_in_place_preflight_never_imports_docker(tmp_path: Path, env: dict[str, Any]) -> None:
    repo = _repo(tmp_path, CLEAN)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from imageforge import app
        s = app.settings(manifest={str(repo / 'build.yaml')!r})
        report = app.preflight(s, "t", None, root=Path({str(env['root'])!r}), python=sys.executable,
                               allow_dirty=True, show=lambda r: print(r.text()))
        assert "docker" not in sys.modules, sorted(m for m in sys.modules if m.startswith("docker"))
        print("NO-DOCKER", report.ok)
    """)
    run_env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{env['root'] / 'site'}"}
    done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=False,
                          cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NO-DOCKER True" in done.stdout


def test_without_the_package_the_scripts_are_still_read(tmp_path: Path, env: dict[str, Any]) -> None:
    """A --python that has no such distribution: that is a finding, and the checks that need no package (the
    shipped scripts read statically) still run in the same report."""
    repo = _repo(tmp_path, CLEAN)
    (repo / "scripts/run.sh").write_text(RUN_SH + 'echo "${NEVER_SET}"\n')
    empty = tmp_path / "empty-site"
    empty.mkdir()
    proc = _preflight(repo, {**env, "env": {"PYTHONPATH": str(empty)}})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    [missing] = [f for f in doc["findings"] if f["check"] == "step"]
    assert "vllm is not installed" in missing["message"]
    assert [f["line"] for f in doc["findings"] if f["check"] == "shellcheck"] == [4]
    assert any("could not be read" in n for n in doc["notes"]), doc["notes"]
