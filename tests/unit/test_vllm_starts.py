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
    counter = VllmStarts()
    counter._scan_proc()
    before = dict(counter.processes)
    # a "server" (argv[0] set with exec -a) with a "worker" child that has the same command line
    script = 'exec -a "vllm serve /model" bash -c \'(exec -a "vllm serve /model" sleep 30) & sleep 30\''
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
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
    assert counter.lines() == [f"{len(counter.processes)} vLLM starts (0 in Docker containers, "
                               f"{len(counter.processes)} as processes in place)"]
