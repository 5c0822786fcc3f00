"""Whole-session plugins for every test tier.

* **vLLM starts**: counts every vLLM server brought up while the session runs and prints "N vLLM starts" in the
  terminal summary (issue 24's budget: at most 8 in Docker mode and 5 in place for the whole run). Counted where they
  really happen, not inside one helper: Docker mode from the daemon's container `start` events (a container whose
  command runs vllm: `start_server`, `invoke run/smoke/bench/equiv/...` subprocesses, and the containers
  test_submission and test_export start themselves); in-place servers (a process, in a box container or on the host)
  from a poll of /proc for a process whose command line runs vllm's server and whose parent does not (the top process
  of each server), leaving out the main process of a container already counted; a server that is the first process of
its PID namespace (``NSpid`` ends in 1: a container's main process, e.g. one on test_export's second daemon, whose
events this daemon never sees) counts as a Docker-mode start. It counts what the machine does while
  the session runs: on a shared machine other users' servers count too (CI has the machine alone). Each start is
  put down to the test running when it was seen (session fixtures: the first test that asked for them), and the
  summary lists the starts per test file.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

SERVER_ARGV = re.compile(r"(^|\s|/)vllm(\s+serve\b|\.entrypoints\.openai\.api_server\b)")
DOCKER_SOCKET = Path("/var/run/docker.sock")


def runs_vllm_server(argv: list[str]) -> bool:
    return bool(SERVER_ARGV.search(" ".join(argv)))


class VllmStarts:
    """Counts vLLM server starts while the session runs (see the module's docstring)."""

    FAKE = b"IMAGEFORGE_TEST_FAKE_VLLM=1"  # in a process's environment: a test's stand-in, not a server start

    def __init__(self, *, count_fakes: bool = False) -> None:
        self.count_fakes = count_fakes
        self.containers: dict[str, str] = {}  # container id -> the test running when it started
        # (pid, start time) -> (its cgroups, test, whether it is its PID namespace's first process: a container's)
        self.processes: dict[tuple[int, str], tuple[str, str, bool]] = {}
        self.current = "(outside any test)"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._events: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ Docker mode: the daemon's events
    def _watch_docker(self) -> None:
        try:
            import docker

            client = docker.DockerClient(base_url=f"unix://{DOCKER_SOCKET}", timeout=30)
            client.ping()
            self._events = client.events(decode=True, filters={"type": "container", "event": "start"})
        except Exception:  # no daemon (unit tier on a laptop): nothing to count there
            return
        with contextlib.suppress(Exception):
            for event in self._events:
                cid = str(event.get("id") or event.get("Actor", {}).get("ID") or "")
                with contextlib.suppress(Exception):
                    attrs = client.api.inspect_container(cid)
                    argv = [*(attrs["Config"].get("Entrypoint") or []), *(attrs["Config"].get("Cmd") or [])]
                    if runs_vllm_server(argv):
                        with self._lock:
                            self.containers[cid] = self.current

    # ------------------------------------------------------------------ in place: processes
    def _poll_processes(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self._scan_proc()

    def _scan_proc(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            with contextlib.suppress(OSError, IndexError, ValueError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if not runs_vllm_server(argv):
                    continue
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                ppid, started = int(fields[1]), fields[19]
                parent = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if runs_vllm_server(parent):
                    continue  # a worker of a server already seen
                if not self.count_fakes and self.FAKE in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    continue
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
                nspid = next((line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                              if line.startswith("NSpid:")), [])
                container_main = len(nspid) > 1 and nspid[-1] == "1"
                with self._lock:
                    self.processes.setdefault((pid, started), (cgroup, self.current, container_main))

    def start(self) -> None:
        # the SDK imported here, not first inside the watcher thread: a test importing ``docker.types`` while that
        # thread imports ``docker`` got the SDK's circular import half done ("partially initialized module")
        with contextlib.suppress(ImportError):
            import docker  # noqa: F401
        for target in (self._watch_docker, self._poll_processes):
            thread = threading.Thread(target=target, name=f"vllm-starts-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        time.sleep(0.2)  # the last events
        self._stop.set()
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.close()

    def lines(self) -> list[str]:
        with self._lock:
            # the main process of a container counted from its start event is not a second start
            unseen = [(test, main) for cgroup, test, main in self.processes.values()
                      if not any(cid in cgroup for cid in self.containers)]
            docker_tests = [*self.containers.values(), *(test for test, main in unseen if main)]
            process_tests = [test for test, main in unseen if not main]
        per_file: dict[str, list[int]] = {}
        for tests, column in ((docker_tests, 0), (process_tests, 1)):
            for test in tests:
                per_file.setdefault(test.split("::")[0], [0, 0])[column] += 1
        out = [f"  {d:>2} in Docker, {p:>2} in place  {name}" for name, (d, p) in sorted(per_file.items())]
        return [*out, f"{len(docker_tests) + len(process_tests)} vLLM starts ({len(docker_tests)} in Docker "
                      f"containers, {len(process_tests)} as processes in place)"]


_COUNTER = VllmStarts()


def pytest_sessionstart(session: pytest.Session) -> None:
    _COUNTER.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _COUNTER.current = item.nodeid
    yield
    _COUNTER.current = "(between tests)"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    _COUNTER.stop()
    terminalreporter.section("vLLM starts")
    for line in _COUNTER.lines():
        terminalreporter.write_line(line)
