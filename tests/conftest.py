"""Whole-session plugins for every test tier.

* **vLLM starts**: counts every vLLM server brought up while the session runs and prints "N vLLM starts" in the
  terminal summary (the budget: at most 8 in Docker mode and 5 in place for the whole run; bench/RESULTS.md, "CI").
  Counted where they really happen, not inside one helper: Docker mode from the daemon's container `start` events (a
  container whose command runs vllm: `start_server`, `invoke run/smoke/bench/equiv/...` subprocesses, and the
  containers test_submission and test_export start themselves); in-place servers (a process, in a box container or on
  the host) from a poll of /proc for a process whose command line runs vllm's server and whose parent does not (the
  top process of each server), leaving out the main process of a container already counted; a server that is the first
  process of its PID namespace (``NSpid`` ends in 1: a container's main process, e.g. one on test_export's second
  daemon, whose events this daemon never sees) counts as a Docker-mode start. It counts what the machine does while
  the session runs: on a shared machine other users' servers count too (CI has the machine alone). Each start is put
  down to the test running when it was seen (session fixtures: the first test that asked for them), and the summary
  lists the starts per test file.
* **Two workers** (``invoke test`` runs ``pytest -n 2``: pytest-xdist, with this file's scheduler, a
  ``LoadScopeScheduling`` whose scope is a test's group): the tests go to the workers in groups. The integration files
  whose tests start vLLM in Docker mode are one group (``VLLM_DOCKER``: they share the session's servers,
  ``cpu_server`` and ``cpu_base_run``, started once), the files that use the in-place box another (``VLLM_INPLACE``:
  one box, tests/integration/conftest.py's ``box``), the export to a second dockerd a third (``VLLM_OTHER_DAEMON``);
  every other file is a group of its own, taken by whichever worker is free. The server groups are queued first. Under
  xdist the counter runs in the controller and learns each worker's current test from its ``logstart`` reports (its
  group from its file); a start on this daemon is put down to the test the ``VLLM_DOCKER`` worker is running, an
  in-place one to the ``VLLM_INPLACE`` worker's, another daemon's container to the ``VLLM_OTHER_DAEMON`` worker's. A
  test outside ``VLLM_DOCKER`` asking for a session server is refused at collection (it would start a second one on
  its worker).
* **Where the time went** (:class:`GroupClock`): after the starts, a "test groups" section lists per worker the
  groups it ran, in order, with their span from the session's first test (seconds) and their tests' summed time;
  groups under 10 s are summed in one line. The split of the suite between the workers is read there.
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

VLLM_DOCKER = "vllm-docker"
VLLM_INPLACE = "vllm-inplace"
VLLM_OTHER_DAEMON = "vllm-other-daemon"
# the files of each server group (see the module's docstring); every other file is a group of its own. Queued in
# this order: the first two start at once, one per worker; xdist's LoadScopeScheduling gives a worker the next group
# when two tests of its own are left, so the export follows the in-place group (the shorter) on its worker while
# the other runs the Docker group (the longest), and the other files fill in after.
STREAMS: dict[str, tuple[str, ...]] = {
    # one box for the three (tests/integration/conftest.py's ``box``), used file by file in this order
    VLLM_INPLACE: tuple(f"tests/integration/{name}.py" for name in ("test_inplace_box", "test_inplace_serve",
                                                                     "test_native")),
    VLLM_DOCKER: tuple(f"tests/integration/{name}.py" for name in (
        "test_bench", "test_equiv_client", "test_evaluator_suite", "test_forensics_run", "test_image_contract",
        "test_run", "test_smoke", "test_submission")),
    # a server on a second dockerd: a container's main process this daemon's events never show
    VLLM_OTHER_DAEMON: ("tests/integration/test_export.py",),
}
SESSION_SERVERS = ("cpu_server", "cpu_base_run")  # session fixtures that start a vLLM server


def group_of(nodeid: str) -> str:
    """A test's group: its file's server group, else its file."""
    path = nodeid.split("::")[0]
    return next((group for group, files in STREAMS.items() if path in files), path)


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
        self.current: dict[str, str] = {}  # group (group_of) -> the test running in it
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
                        self.record_container(cid)

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
                with open(f"/proc/{pid}/cmdline", "rb") as fh:  # every process, every second: the cheap test first
                    raw = fh.read()
                if b"vllm" not in raw:
                    continue
                argv = raw.decode(errors="replace").split("\0")
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
                    if (pid, started) not in self.processes:
                        # a container's main process: another daemon's (this daemon's containers are counted from
                        # their start events, and their main process is left out in lines())
                        owner = self.owner(VLLM_OTHER_DAEMON if container_main else VLLM_INPLACE)
                        self.processes[(pid, started)] = (cgroup, owner, container_main)

    # ------------------------------------------------------------------ whose start it is
    def begin(self, nodeid: str) -> None:
        """A test starts (under xdist: a worker's report, read in the controller)."""
        with self._lock:
            self.current[group_of(nodeid)] = nodeid

    def end(self, nodeid: str) -> None:
        with self._lock:
            self.current.pop(group_of(nodeid), None)

    def owner(self, group: str) -> str:
        """The test a start of this kind is put down to: the one its server group is running, else any running."""
        return self.current.get(group) or next(iter(self.current.values()), "(between tests)")

    def record_container(self, cid: str) -> None:
        with self._lock:
            self.containers[cid] = self.owner(VLLM_DOCKER)

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


class GroupClock:
    """Per test group (:func:`group_of`): the worker that ran it, its first start and last end (seconds from the
    session's first test) and its tests' summed time, from the reports the controller reads."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.started: dict[str, float] = {}  # nodeid -> its start
        self.groups: dict[str, list[float]] = {}  # group -> [first start, last end, summed time]
        self.worker: dict[str, str] = {}  # group -> the worker that ran it ("-" without xdist)

    def begin(self, nodeid: str, now: float) -> None:
        self.t0 = now if self.t0 is None else self.t0
        self.started[nodeid] = now - self.t0
        self.groups.setdefault(group_of(nodeid), [now - self.t0, now - self.t0, 0.0])

    def end(self, nodeid: str, now: float) -> None:
        if self.t0 is None or nodeid not in self.started:
            return
        span = self.groups[group_of(nodeid)]
        span[1] = now - self.t0
        span[2] += now - self.t0 - self.started.pop(nodeid)

    def ran_on(self, nodeid: str, worker: str) -> None:
        self.worker.setdefault(group_of(nodeid), worker)

    def lines(self, small: float = 10.0) -> list[str]:
        out: list[str] = []
        for worker in sorted(set(self.worker.get(g, "-") for g in self.groups)):
            mine = sorted(((g, s) for g, s in self.groups.items() if self.worker.get(g, "-") == worker),
                          key=lambda gs: gs[1][0])
            busy = sum(s[2] for _, s in mine)
            end = max((s[1] for _, s in mine), default=0.0)
            out.append(f"{worker}: {len(mine)} groups, {busy:.0f} s of tests, its last test ended at {end:.0f} s")
            rest = [s for _, s in mine if s[2] < small]
            out += [f"  {s[0]:6.0f} -{s[1]:5.0f} s  {s[2]:6.1f} s  {g}" for g, s in mine if s[2] >= small]
            if rest:
                out.append(f"  {len(rest)} groups under {small:.0f} s each: {sum(s[2] for s in rest):.1f} s")
        return out


_CLOCK = GroupClock()


def _in_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker: the controller counts


SESSION_START = "IMAGEFORGE_TEST_SESSION_START"  # the session's start (epoch seconds), read by its xdist workers


def session_start() -> float:
    """When this test session started (the controller's clock, inherited by the workers it spawns)."""
    return float(os.environ[SESSION_START])


def pytest_configure(config: pytest.Config) -> None:
    # set before xdist spawns the workers (pytest_sessionstart): they inherit the controller's environment
    os.environ.setdefault(SESSION_START, f"{time.time():.6f}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _in_worker(session.config):
        _COUNTER.start()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    refused = sorted({item.nodeid.split("::")[0] for item in items
                      if group_of(item.nodeid) != VLLM_DOCKER
                      and set(SESSION_SERVERS) & set(getattr(item, "fixturenames", ()))})
    if refused:
        raise pytest.UsageError(f"{', '.join(refused)}: a test asking for {' or '.join(SESSION_SERVERS)} must be in "
                                f"tests/conftest.py's STREAMS[{VLLM_DOCKER!r}] (else a worker starts its own)")
    if _in_worker(config):  # the server groups first (the scheduler queues groups in this order): they start at once
        first = list(STREAMS)
        items.sort(key=lambda item: first.index(g) if (g := group_of(item.nodeid)) in first else len(first))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's LoadScopeScheduling with a test's group (:func:`group_of`) as its scope: a group runs on one worker,
    in order; groups queue as collected (``--no-loadscope-reorder``), the two server groups first."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _COUNTER.begin(nodeid)  # in the controller under xdist: a worker's report
    _CLOCK.begin(nodeid, time.monotonic())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _COUNTER.end(nodeid)
    _CLOCK.end(nodeid, time.monotonic())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # under xdist, in the controller: the worker that sent it
    _CLOCK.ran_on(report.nodeid, str(getattr(getattr(node, "gateway", None), "id", "-")))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _in_worker(config):
        return
    _COUNTER.stop()
    terminalreporter.section("vLLM starts")
    for line in _COUNTER.lines():
        terminalreporter.write_line(line)
    terminalreporter.section("test groups")
    for line in _CLOCK.lines():
        terminalreporter.write_line(line)
