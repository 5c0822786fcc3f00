"""The session plugin of tests/conftest.py that counts vLLM starts: what it takes for a server, and a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Collection

import pytest

from tests.conftest import (
    STREAMS,
    VLLM_DOCKER,
    VLLM_INPLACE,
    VLLM_OTHER_DAEMON,
    GroupClock,
    VllmStarts,
    group_of,
    runs_vllm_server,
)


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


def _ours(counter: VllmStarts, before: Collection[tuple[int, str]],
          session: int) -> dict[tuple[int, str], tuple[str, str, bool]]:
    """The servers the counter saw since ``before`` that belong to the test's own session (under ``invoke test``
    the other worker may start a real server meanwhile)."""

    def in_session(pid: int) -> bool:
        try:
            return os.getsid(pid) == session
        except OSError:
            return False

    return {k: v for k, v in counter.processes.items() if k not in before and in_session(k[0])}


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
            if _ours(counter, before, proc.pid):
                break
            time.sleep(0.1)
        time.sleep(0.3)
        counter._scan_proc()
        new = _ours(counter, before, proc.pid)
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
    counter.begin("tests/integration/test_x.py::test_y")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "bash", "-c", 'exec -a "vllm serve /model" sleep 30'],
                            start_new_session=True, env={**os.environ, "IMAGEFORGE_TEST_FAKE_VLLM": "1"})
    try:
        deadline = time.monotonic() + 10
        new: dict[tuple[int, str], tuple[str, str, bool]] = {}
        while time.monotonic() < deadline and not new:
            time.sleep(0.1)
            counter._scan_proc()
            new = _ours(counter, before, proc.pid)
        assert len(new) == 1 and next(iter(new.values()))[2] is True, new
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "   1 in Docker,  0 in place  tests/integration/test_x.py" in counter.lines()


def test_under_two_workers_a_start_is_put_down_to_its_server_groups_test() -> None:
    """Each kind of start goes to the test its server group is running (under xdist both groups run at once)."""
    counter = VllmStarts()
    counter.begin("tests/integration/test_inplace_serve.py::test_run")
    counter.begin("tests/integration/test_smoke.py::test_end_to_end")
    counter.record_container("c1")
    assert counter.containers == {"c1": "tests/integration/test_smoke.py::test_end_to_end"}
    assert counter.owner(VLLM_INPLACE) == "tests/integration/test_inplace_serve.py::test_run"
    counter.end("tests/integration/test_smoke.py::test_end_to_end")
    counter.record_container("c2")  # no Docker-group test running: the one that is
    assert counter.containers["c2"] == "tests/integration/test_inplace_serve.py::test_run"
    counter.begin("tests/integration/test_export.py::test_serves")  # a container on its second dockerd
    assert counter.owner(VLLM_OTHER_DAEMON) == "tests/integration/test_export.py::test_serves"
    counter.end("tests/integration/test_export.py::test_serves")
    counter.end("tests/integration/test_inplace_serve.py::test_run")
    assert counter.owner(VLLM_DOCKER) == "(between tests)"


def test_every_test_asking_for_a_session_server_is_in_the_docker_group() -> None:
    """The conftest refuses, at collection, a test outside ``STREAMS[VLLM_DOCKER]`` asking for ``cpu_server`` or
    ``cpu_base_run``; here, the other way round: the files listed exist and the groups do not overlap."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = [f for files in STREAMS.values() for f in files]
    assert len(listed) == len(set(listed)) and all((root / f).is_file() for f in listed)
    assert group_of("tests/integration/test_smoke.py::test_x") == VLLM_DOCKER
    assert group_of("tests/integration/test_inplace_box.py::test_x") == VLLM_INPLACE
    assert group_of("tests/integration/test_export.py::test_x") == VLLM_OTHER_DAEMON
    assert group_of("tests/unit/test_x.py::test_y") == "tests/unit/test_x.py"
    for path in (root / "tests/integration").glob("test_*.py"):
        rel = str(path.relative_to(root))
        if any(name in path.read_text() for name in ("cpu_server: ", "cpu_base_run: ")):
            assert group_of(rel) == VLLM_DOCKER, rel


def test_the_scheduler_keeps_each_group_on_one_worker() -> None:
    """``pytest -n 2`` with this repository's scheduler (tests/conftest.py): every file here is its own group, so
    each file's tests all run on one worker (xdist's own ``load`` would split them)."""
    import re
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = ["tests/unit/test_waits.py", "tests/unit/test_steps.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *files, "-n", "2", "--no-loadscope-reorder", "-v",
                           "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, path in re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", proc.stdout, re.M):
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == set(files) and all(len(w) == 1 for w in workers.values()), workers


def test_the_group_clock_lists_each_workers_groups_in_order_and_sums_the_small_ones() -> None:
    clock = GroupClock()
    docker, box = STREAMS[VLLM_DOCKER], STREAMS[VLLM_INPLACE]
    tests = [(f"{docker[0]}::a", "gw0", 100.0, 130.0), (f"{docker[1]}::b", "gw0", 130.0, 160.0),
             (f"{box[0]}::c", "gw1", 100.5, 150.0), ("tests/unit/test_x.py::d", "gw1", 150.0, 152.0),
             ("tests/unit/test_y.py::e", "gw0", 160.0, 163.5)]
    for nodeid, worker, start, _end in tests:
        clock.begin(nodeid, start)
        clock.ran_on(nodeid, worker)
    for nodeid, _worker, _start, end in tests:
        clock.end(nodeid, end)
    assert clock.lines() == [
        "gw0: 2 groups, 64 s of tests, its last test ended at 64 s",
        f"       0 -   60 s    60.0 s  {VLLM_DOCKER}",
        "  1 groups under 10 s each: 3.5 s",
        "gw1: 2 groups, 52 s of tests, its last test ended at 52 s",
        f"       0 -   50 s    49.5 s  {VLLM_INPLACE}",
        "  1 groups under 10 s each: 2.0 s",
    ]
