"""Faults during a build: the right exit code, no traceback, nothing leaked, no tag moved.

The shared daemon is never stopped: "daemon gone" cuts a socket proxy the build talks to,
"disk full" is a daemon answer the proxy injects (and a script that writes to /dev/full).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from imageforge.labels import L_RUN, L_TARGET
from tests.integration.forge_fixtures import (
    INVOKE,
    REPO,
    SocketProxy,
    assert_clean_failure,
    client,
    invoke,
    run_id_of,
    tiny_base,
    write_manifest,
)
from tests.integration.helpers import labelled, sigint_default

pytestmark = pytest.mark.integration

EXTRA_FIRST = """\
          - id: extra
            kind: overlay
            source: overlays/extra.py
            dest: vllm/ops/extra.py
"""


def slow_steps(script: str = "scripts/slow.sh") -> str:
    return EXTRA_FIRST + f"""\
          - id: slow
            kind: script
            source: {script}
"""


class Running:
    """`invoke ARGS` in the background, its output collected line by line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("IMAGEFORGE_TRACEBACK", None)
        self.proc = subprocess.Popen([str(INVOKE), *args], cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default)
        self.lines: list[str] = []
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._q.put(line)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self._q.empty():
                    break
                continue
            if re.search(pattern, line):
                return
        raise AssertionError(f"never saw {pattern!r}:\n{self.output}")

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.2)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def base() -> str:
    return tiny_base()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[SocketProxy]:
    p = SocketProxy(tmp_path)
    yield p
    p.cut()


def tag_id(ref: str) -> str | None:
    try:
        return str(client().images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def test_daemon_gone_mid_build(tmp_path: Path, base: str, proxy: SocketProxy) -> None:
    manifest, target = write_manifest(tmp_path / "m", base, steps=slow_steps(),
                                      files={"scripts/slow.sh": "#!/bin/sh\necho started\nsleep 60\necho done\n"})
    run = Running("build", "--verbose", "--manifest", str(manifest), env={"DOCKER_HOST": proxy.host})
    run.wait_for(r"\| started")
    proxy.cut()
    code = run.finish(timeout=90)
    out = run.output
    assert code == 5, out
    assert "Traceback" not in out, out
    assert "lost the Docker daemon" in out, out
    assert tag_id(f"imageforge-test/{target}:small") is None, "no tag when the build did not finish"
    run_id = run_id_of(out)
    assert run_id
    # The daemon is back (it never went away: only the proxy did). The build could not remove its
    # script container while the daemon was unreachable; `invoke clean` knows it belongs to a dead
    # build of this checkout and removes it, whatever its state.
    left = labelled({L_RUN: run_id})
    cleaned = invoke("clean", "--manifest", str(manifest), "--min-age", "0", check=True)
    assert labelled({L_RUN: run_id}) == [], cleaned.stdout
    if left:
        assert "step-script" in cleaned.stdout


def test_script_step_exits_non_zero(tmp_path: Path, base: str) -> None:
    script = "#!/bin/sh\necho 'about to fail'\necho 'detail on stderr' >&2\nexit 7\n"
    manifest, target = write_manifest(tmp_path / "m", base, steps=slow_steps("scripts/fail.sh"),
                                      files={"scripts/fail.sh": script})
    proc = invoke("build", "--manifest", str(manifest))
    assert_clean_failure(proc, 3)
    err = proc.stderr
    assert "script step 'slow' exited with code 7" in err
    assert "about to fail" in err and "detail on stderr" in err, "the script's output is shown"
    assert f"{manifest}:" in err, "the error points into the manifest"
    run_id = run_id_of(proc.stderr)  # the build log is on stderr (stdout: results only)
    assert run_id and labelled({L_RUN: run_id}) == []
    assert tag_id(f"imageforge-test/{target}:small") is None


def test_disk_full_reported_by_the_daemon(tmp_path: Path, base: str, proxy: SocketProxy) -> None:
    manifest, target = write_manifest(tmp_path / "m", base)
    proxy.fail.append(("PUT", r"/containers/[0-9a-f]+/archive", 500,
                       "write /var/lib/docker/overlay2/x/diff/y: no space left on device"))
    proc = invoke("build", "--manifest", str(manifest), env={"DOCKER_HOST": proxy.host})
    assert_clean_failure(proc, 5)
    assert "out of disk space" in proc.stderr and "no space left on device" in proc.stderr
    assert "invoke clean" in proc.stderr, "the hint says how to free space"
    run_id = run_id_of(proc.stderr)  # the build log is on stderr (stdout: results only)
    assert run_id and labelled({L_RUN: run_id}) == []
    assert tag_id(f"imageforge-test/{target}:small") is None


def test_disk_full_inside_a_script_step(tmp_path: Path, base: str) -> None:
    script = "#!/bin/sh\necho writing\nhead -c 4096 /dev/zero > /dev/full\n"
    manifest, target = write_manifest(tmp_path / "m", base, steps=slow_steps("scripts/full.sh"),
                                      files={"scripts/full.sh": script})
    proc = invoke("build", "--manifest", str(manifest))
    assert_clean_failure(proc, 5)
    assert "No space left on device" in proc.stderr and "out of disk space" in proc.stderr
    run_id = run_id_of(proc.stderr)  # the build log is on stderr (stdout: results only)
    assert run_id and labelled({L_RUN: run_id}) == []
    assert tag_id(f"imageforge-test/{target}:small") is None


def test_ctrl_c_during_a_step_then_resume(tmp_path: Path, base: str) -> None:
    manifest, target = write_manifest(tmp_path / "m", base, steps=slow_steps(),
                                      files={"scripts/slow.sh": "#!/bin/sh\necho started\necho done\n"})
    invoke("build", "--manifest", str(manifest), check=True)
    before = tag_id(f"imageforge-test/{target}:small")
    assert before
    (tmp_path / "m" / "scripts" / "slow.sh").write_text("#!/bin/sh\necho started\nsleep 8\necho done\n")
    run = Running("build", "--verbose", "--manifest", str(manifest))
    run.wait_for(r"\| started")
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(timeout=60)
    out = run.output
    assert code == 130, out
    assert "Traceback" not in out and "interrupted" in out, out
    run_id = run_id_of(out)
    assert run_id and labelled({L_RUN: run_id}) == [], "no dangling containers"
    assert tag_id(f"imageforge-test/{target}:small") == before, "the tag did not move"
    again = invoke("build", "--manifest", str(manifest), check=True)
    steps = re.findall(r"\[\d+/\d+\] (\w+)\s+\w+\s+(\S+)", again.stderr)
    assert ("HIT", "extra") in steps, again.stderr  # resumed from the cache
    assert ("BUILT", "slow") in steps, again.stderr
    assert tag_id(f"imageforge-test/{target}:small") != before


def test_base_image_deleted_between_plan_and_build(tmp_path: Path) -> None:
    ref = tiny_base(unique=True)
    manifest, target = write_manifest(tmp_path / "m", ref)
    planned = invoke("plan", "--manifest", str(manifest), check=True)
    assert "MISS" in planned.stdout
    client().images.remove(ref)
    proc = invoke("build", "--manifest", str(manifest))
    assert_clean_failure(proc, 5)
    assert f"base image {ref!r} is not on the Docker daemon" in proc.stderr
    assert "hint" in proc.stderr
    assert labelled({L_TARGET: target}) == []


def test_base_image_deleted_after_the_build_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base vanishes inside the build, between planning and the first step (in-process)."""
    from imageforge import app
    from imageforge import build as b
    from imageforge.errors import InfraError
    from imageforge.plan import make_plan as real_make_plan

    ref = tiny_base(unique=True)
    manifest, target = write_manifest(tmp_path / "m", ref)

    def make_plan_then_delete(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        plan = real_make_plan(*args, **kwargs)  # type: ignore[arg-type]
        client().images.remove(ref, force=True)
        return plan

    monkeypatch.setattr(b, "make_plan", make_plan_then_delete)
    with pytest.raises(InfraError) as info:
        app.build(app.settings(manifest=str(manifest)), None, None, [], verbose=False, quiet=True)
    assert "disappeared" in info.value.message or "not on the Docker daemon" in info.value.message
    assert info.value.exit_code == 5
    assert labelled({L_TARGET: target}) == []
    assert tag_id(f"imageforge-test/{target}:small") is None
