"""The invoke shell: exit codes, no tracebacks unless asked, JSON output; no daemon needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli import imageforge, without_imageforge_settings

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``imageforge ARGS`` with the tool's defaults: no ``IMAGEFORGE_*`` of this process, ``env`` over them."""
    return imageforge(*args, env=without_imageforge_settings(env))


def test_validate_ok_and_json() -> None:
    proc = invoke("validate")
    assert proc.returncode == 0, proc.stderr
    assert "build.yaml: ok" in proc.stdout
    data = json.loads(invoke("validate", "--json").stdout)
    assert data["ok"] is True and data["default_target"] == "bi100"
    assert set(data["targets"]) == {"cpu", "bi100"}


def test_bad_manifest_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nversion: 2\n")
    proc = invoke("validate", "--manifest", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"config error: {bad}:2:1: version: duplicate key 'version'" in proc.stderr


def test_traceback_only_when_asked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("")
    assert "Traceback" in invoke("validate", "--manifest", str(bad), "--traceback").stderr
    assert "Traceback" in invoke("validate", "--manifest", str(bad), env={"IMAGEFORGE_TRACEBACK": "1"}).stderr


def test_plan_json_without_daemon() -> None:
    proc = invoke("plan", "--target", "bi100", "--profile", "replay", "--json", "--no-daemon")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["target"] == "bi100" and data["profile"] == "replay"
    assert data["serving"]["max-num-seqs"] == 2 and data["serving"]["served-model-name"] == "llm"
    assert "--trust-remote-code" in data["argv"] and data["argv"][data["argv"].index("-tp") + 1] == "4"
    assert data["steps"] and all(s["cache"] == "UNKNOWN" for s in data["steps"])


def test_plan_set_and_env_sources() -> None:
    proc = invoke("plan", "--target", "cpu", "--no-daemon", "--set", "max-num-seqs=3",
                  env={"IMAGEFORGE_SET": "max-model-len=1024"})
    assert proc.returncode == 0, proc.stderr
    assert "max-num-seqs" in proc.stdout and "[cli:--set]" in proc.stdout and "[env:IMAGEFORGE_SET]" in proc.stdout
    bad = invoke("plan", "--target", "cpu", "--no-daemon", "--set", "max-num-seqs=many")
    assert bad.returncode == 2 and "wrong type for 'max-num-seqs'" in bad.stderr


def test_unknown_profile_exit_2() -> None:
    proc = invoke("plan", "--target", "cpu", "--profile", "agressive", "--no-daemon")
    assert proc.returncode == 2
    assert "did you mean 'aggressive'?" in proc.stderr
