"""Whole-session plugins for every test tier.

* **vLLM starts**: counts every vLLM server brought up while the session runs and prints "N vLLM starts" in the
  terminal summary (issue 24's budget: at most 8 in Docker mode and 5 in place for the whole run). Counted where they
  really happen, not inside one helper: Docker mode from the daemon's container `start` events (a container whose
  command runs vllm: `start_server`, `invoke run/smoke/bench/equiv/...` subprocesses, and the containers
  test_submission and test_export start themselves); in-place servers (a process, in a box container or on the host)
  from a poll of /proc for a process whose command line runs vllm's server and whose parent does not (the top process
  of each server), leaving out the main process of a container already counted. It counts what the machine does while
  the session runs: on a shared machine other users' servers count too (CI has the machine alone).
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

    def __init__(self) -> None:
        self.containers: dict[str, str] = {}  # container id -> image
        self.processes: dict[tuple[int, str], str] = {}  # (pid, start time) -> its cgroups
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
                            self.containers[cid] = str(attrs["Config"].get("Image", ""))

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
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
                with self._lock:
                    self.processes.setdefault((pid, started), cgroup)

    def start(self) -> None:
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
            docker_mode = len(self.containers)
            # the main process of a container counted from its start event is not a second start
            in_place = sum(not any(cid in cgroup for cid in self.containers) for cgroup in self.processes.values())
        return [f"{docker_mode + in_place} vLLM starts ({docker_mode} in Docker containers, {in_place} as processes "
                f"in place)"]


_COUNTER = VllmStarts()


def pytest_sessionstart(session: pytest.Session) -> None:
    _COUNTER.start()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    _COUNTER.stop()
    terminalreporter.section("vLLM starts")
    for line in _COUNTER.lines():
        terminalreporter.write_line(line)
