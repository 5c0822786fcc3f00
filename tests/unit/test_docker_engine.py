"""docker_engine without a daemon: pure helpers and ensure_daemon's failure paths (faked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge import docker_engine as de
from imageforge.errors import EXIT_BUILD, EXIT_INFRA, BuildError, InfraError


def test_tail_lines_and_human_bytes() -> None:
    text = b"a\n\nb\r\nc\xff\n" + b"x\n" * 50
    assert de.tail_lines(text, 3) == ["x", "x", "x"]
    assert de.tail_lines("a\n\n  \nb\n", 10) == ["a", "b"]
    assert de.tail_lines(b"c\xff")[0].startswith("c")
    assert de.human_bytes(512) == "512 B"
    assert de.human_bytes(1536) == "1.5 KiB"
    assert de.human_bytes(6 * de.GiB) == "6.0 GiB"


def test_disk_shortfalls_groups_one_file_system(tmp_path: Path) -> None:
    a, b = tmp_path / "cache" / "not-yet", tmp_path / "root"
    needs = [de.DiskNeed("the wheelhouse", a, 600 * de.MiB), de.DiskNeed("the image", b, 3 * de.GiB)]
    assert de.disk_shortfalls(needs, lambda p: 10 * de.GiB) == []
    short = de.disk_shortfalls(needs, lambda p: 1 * de.GiB)
    assert len(short) == 1  # same file system: needs are added up
    msg = short[0]
    assert "1.0 GiB free" in msg and "3.6 GiB needed" in msg
    assert "600.0 MiB for the wheelhouse" in msg and "3.0 GiB for the image" in msg
    assert de.disk_shortfalls([de.DiskNeed("nothing", a, 0)], lambda p: 0) == []


def test_check_disk_raises_infra_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(de, "free_bytes", lambda p: 100 * de.MiB)
    with pytest.raises(InfraError) as ei:
        de.check_disk([de.DiskNeed("the vLLM image", tmp_path, 6 * de.GiB)])
    assert ei.value.exit_code == EXIT_INFRA
    assert "6.0 GiB needed" in ei.value.message and "100.0 MiB free" in ei.value.message
    assert ei.value.hint
    monkeypatch.setattr(de, "free_bytes", lambda p: 100 * de.GiB)
    de.check_disk([de.DiskNeed("the vLLM image", tmp_path, 6 * de.GiB)])


def test_run_logged_ok_and_failure() -> None:
    assert de.run_logged([sys.executable, "-c", "print('hi')"], what="hello").strip() == "hi"
    code = "import sys\nfor i in range(100): print('line', i)\nsys.exit(4)"
    with pytest.raises(BuildError) as ei:
        de.run_logged([sys.executable, "-c", code], what="step", hint="fix it", tail=5)
    err = ei.value
    assert err.exit_code == EXIT_BUILD
    assert "step failed (exit 4)" in err.message and sys.executable in err.message
    assert err.log_tail == ("line 95", "line 96", "line 97", "line 98", "line 99")
    assert err.hint == "fix it"
    with pytest.raises(InfraError):
        de.run_logged([sys.executable, "-c", "raise SystemExit(1)"], what="x", error=InfraError)


def test_apt_install_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(InfraError) as ei:
        de.apt_install(["docker.io"])
    assert "apt-get install -y docker.io" in (ei.value.hint or "")


def test_tool_labels() -> None:
    assert de.tool_labels("os-base", "k") == {
        "org.imageforge.tool": "imageforge",
        "org.imageforge.kind": "os-base",
        "org.imageforge.recipe-key": "k",
    }
    assert de.tool_labels("run", extra="1")["extra"] == "1"


def test_docker_not_imported_by_fast_paths() -> None:
    code = "import sys, imageforge.docker_engine, imageforge.base; assert 'docker' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- ensure_daemon


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No daemon answers; dockerd's log/lock go to tmp; `dockerd` on PATH is a fake in tmp/bin."""
    monkeypatch.setattr(de, "_ping", lambda timeout=5: "connection refused")
    monkeypatch.setattr(de, "_dockerd_running", lambda: False)
    monkeypatch.setattr(de, "DOCKERD_LOG", tmp_path / "dockerd.log")
    monkeypatch.setattr(de, "DOCKERD_LOCK", tmp_path / "dockerd.lock")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.delenv(de.START_DOCKERD_ENV, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))  # no context: the default socket
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def _fake_dockerd(bin_dir: Path, body: str) -> None:
    exe = bin_dir / "dockerd"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)


def test_ensure_daemon_returns_when_ping_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(de, "_ping", lambda timeout=5: None)
    de.ensure_daemon(install=False)


def test_ensure_daemon_other_host_fails(no_daemon: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon()
    assert "DOCKER_HOST=tcp://127.0.0.1:1" in ei.value.message
    assert "unset DOCKER_HOST" in (ei.value.hint or "")


def test_ensure_daemon_missing_without_install(no_daemon: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(de, "_which_sbin", lambda exe: None)
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon(start=True, install=False)
    assert ei.value.exit_code == EXIT_INFRA
    assert "docker.io" in (ei.value.hint or "")


def test_ensure_daemon_dockerd_exits(no_daemon: Path) -> None:
    _fake_dockerd(no_daemon, "echo 'failed to start daemon: boom'; exit 3")
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon(start=True, timeout=20, log=lambda s: None)
    assert "exited with code 3" in ei.value.message
    assert any("boom" in line for line in ei.value.log_tail)


def test_ensure_daemon_timeout(no_daemon: Path) -> None:
    _fake_dockerd(no_daemon, "echo 'starting up'; sleep 3")
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon(start=True, timeout=1, log=lambda s: None)
    assert "did not answer within 1s" in ei.value.message
    assert "starting up" in ei.value.log_tail


def test_without_being_asked_no_dockerd_is_started(no_daemon: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any command but the set-up ones: exit 5 at once, naming what starts a daemon; nothing installed or run."""
    _fake_dockerd(no_daemon, f"touch {no_daemon / 'started'}; sleep 30")
    monkeypatch.setattr(de, "apt_install", lambda *a, **k: pytest.fail("apt-get must not run"))
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon(log=lambda s: None)
    assert ei.value.exit_code == EXIT_INFRA
    assert "no Docker daemon answers at unix:///var/run/docker.sock (default)" in ei.value.message
    hint = ei.value.hint or ""
    for named in ("invoke engine", "invoke demo", "invoke test", "invoke base", "IMAGEFORGE_START_DOCKERD=1"):
        assert named in hint
    assert not (no_daemon / "started").exists()
    with pytest.raises(InfraError):
        de.ensure_daemon(start=False, log=lambda s: None)
    assert not (no_daemon / "started").exists()


def test_imageforge_start_dockerd_asks_for_it(no_daemon: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dockerd(no_daemon, "echo 'failed to start daemon: asked'; exit 4")
    monkeypatch.setenv(de.START_DOCKERD_ENV, "1")
    with pytest.raises(InfraError, match="exited with code 4"):
        de.ensure_daemon(timeout=20, log=lambda s: None)
