"""The session plugin of tests/conftest.py that counts vLLM starts: what it takes for a server, and a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import VllmStarts, runs_vllm_server


@pytest.mark.parametrize(("argv", "server"), [
    (["vllm", "serve", "/model", "--port", "8000"], True),
    (["/opt/venv/bin/vllm", "serve", "/model"], True),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model"], True),
    (["python3", "-c", "import vllm"], False),
    (["pytest", "tests/integration/test_vllm_serve_args.py"], False),
    (["bash", ".ci/run"], False),
])
def test_what_counts_as_a_server(argv: list[str], server: bool) -> None:
    assert runs_vllm_server(argv) is server


def test_a_server_process_counts_once_and_its_workers_not() -> None:
    counter = VllmStarts(count_fakes=True)
    counter._scan_proc()
    before = dict(counter.processes)
    # a "server" (argv[0] set with exec -a) with a "worker" child that has the same command line
    script = 'exec -a "vllm serve /model" bash -c \'(exec -a "vllm serve /model" sleep 30) & sleep 30\''
    # the session's own counter leaves it out (IMAGEFORGE_TEST_FAKE_VLLM); this one counts it
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True,
                            env={**os.environ, "IMAGEFORGE_TEST_FAKE_VLLM": "1"})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            counter._scan_proc()
            new = {k: v for k, v in counter.processes.items() if k not in before}
            if new:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        counter._scan_proc()
        new = {k: v for k, v in counter.processes.items() if k not in before}
        assert [pid for pid, _ in new] == [proc.pid], new
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and its worker
        proc.wait()
    counter.containers["c0ffee"] = "tests/integration/test_x.py::test_y"
    lines = counter.lines()
    assert "   1 in Docker,  0 in place  tests/integration/test_x.py" in lines
    # servers already up on the machine count too: a container's main process (the session's cpu server while the
    # unit tier runs after the integration tier) as Docker mode, any other as in place
    mains = sum(1 for _cgroup, _test, main in counter.processes.values() if main)
    assert lines[-1] == (f"{len(counter.processes) + 1} vLLM starts ({mains + 1} in Docker containers, "
                         f"{len(counter.processes) - mains} as processes in place)")


def test_a_server_that_is_its_pid_namespaces_first_process_counts_as_docker_mode() -> None:
    """A container's main process (e.g. on test_export's second daemon, whose events the session never sees) is a
    Docker-mode start; a server started inside a running container (the box) is an in-place one."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode:
        pytest.skip("needs root and unshare(1) to make a PID namespace")
    counter = VllmStarts(count_fakes=True)
    counter._scan_proc()
    before = set(counter.processes)
    counter.current = "tests/integration/test_x.py::test_y"
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "bash", "-c", 'exec -a "vllm serve /model" sleep 30'],
                            start_new_session=True, env={**os.environ, "IMAGEFORGE_TEST_FAKE_VLLM": "1"})
    try:
        deadline = time.monotonic() + 10
        new: dict[tuple[int, str], tuple[str, str, bool]] = {}
        while time.monotonic() < deadline and not new:
            time.sleep(0.1)
            counter._scan_proc()
            new = {k: v for k, v in counter.processes.items() if k not in before}
        assert len(new) == 1 and next(iter(new.values()))[2] is True, new
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "   1 in Docker,  0 in place  tests/integration/test_x.py" in counter.lines()
