"""serve/container.py and serve/spec.py without a daemon: container options, ports, readiness failures."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from imageforge.errors import InfraError, SmokeError
from imageforge.manifest.model import Volume, frozen_map
from imageforge.manifest.resolve import Resolved
from imageforge.serve.container import Server, wait_ready
from imageforge.serve.ports import HOST, free_port, port_in_use, port_taken_error
from imageforge.serve.spec import (
    container_port,
    container_spec,
    device_requests,
    expand_vars,
)
from imageforge.serve.startfail import exit_hint
from imageforge.serve.waits import Progress
from imageforge.steps import PatchSpec

REPO = Path(__file__).resolve().parents[2]


def rooted(resolved: Resolved, root: Path) -> Resolved:
    return replace(resolved, manifest=replace(resolved.manifest, root=root))


def test_spec_for_built_image_publishes_on_localhost_only(cpu: Resolved, tmp_path: Path) -> None:
    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    spec = container_spec(rooted(cpu, tmp_path), "imageforge/cpu:conservative", host_port=18123, run_id="r1",
                          environ={})
    assert spec["ports"] == {"8000/tcp": (HOST, 18123)}
    assert HOST == "127.0.0.1"
    assert spec["labels"] == {"org.imageforge.tool": "imageforge", "org.imageforge.kind": "server",
                              "org.imageforge.run-id": "r1", "org.imageforge.target": "cpu",
                              "org.imageforge.profile": "conservative"}
    assert spec["shm_size"] == "1g"
    assert "command" not in spec  # the image's CMD serves the rendered config
    assert spec["environment"] == {}  # serving env is in the image already
    source = str((tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").resolve())
    # the model bound read-only from the host; vLLM's cache a named volume, writable, kept by the daemon (nothing
    # on the host to check: the daemon makes it on first use)
    assert spec["volumes"] == {source: {"bind": "/models/tiny-qwen3-moe", "mode": "ro"},
                               "imageforge-vllm-cache": {"bind": "/root/.cache/vllm", "mode": "rw"}}
    assert spec["name"] == "imageforge-cpu-r1"


def test_spec_for_base_image_carries_args_and_env(cpu: Resolved, tmp_path: Path) -> None:
    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    spec = container_spec(rooted(cpu, tmp_path), "base:1", host_port=1, run_id="r2", environ={}, base=True)
    assert spec["command"][:3] == ["vllm", "serve", "/models/tiny-qwen3-moe"]
    assert spec["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert spec["labels"]["org.imageforge.profile"] == "base"


def test_spec_run_options_of_the_competition_target(bi100: Resolved, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    run = replace(bi100.run, gpus="all", devices=("/dev/iluvatar0:/dev/iluvatar0:rwm",),
                  ulimits=frozen_map({"memlock": (-1, -1)}), env=frozen_map({"A": "1"}))
    spec = container_spec(replace(bi100, run=run), "img", host_port=8001, run_id="r3",
                          environ={"IMAGEFORGE_MODEL_DIR": str(model)})
    assert spec["privileged"] is True and spec["ipc_mode"] == "host" and spec["shm_size"] == "16g"
    assert spec["devices"] == ["/dev/iluvatar0:/dev/iluvatar0:rwm"]
    assert spec["environment"] == {"A": "1"}
    assert spec["volumes"] == {str(model.resolve()): {"bind": "/model", "mode": "ro"}}
    (request,) = spec["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    (limit,) = spec["ulimits"]
    assert limit["Name"] == "memlock" and limit["Soft"] == -1


def test_unset_volume_variable_and_missing_source(bi100: Resolved, cpu: Resolved, tmp_path: Path) -> None:
    with pytest.raises(InfraError) as info:
        container_spec(bi100, "img", host_port=1, run_id="r", environ={})
    assert "${IMAGEFORGE_MODEL_DIR}" in info.value.message and "export IMAGEFORGE_MODEL_DIR" in (info.value.hint or "")
    with pytest.raises(InfraError) as info:
        container_spec(rooted(cpu, tmp_path), "img", host_port=1, run_id="r", environ={})
    err = info.value
    assert "does not exist" in err.message and err.key_path == "targets.cpu.run.volumes[0].source"
    assert "invoke base --target cpu" in (err.hint or "")
    run = replace(cpu.run, volumes=(Volume("${NOPE}/x", "/x", False),))
    with pytest.raises(InfraError, match="NOPE"):
        container_spec(replace(cpu, run=run), "img", host_port=1, run_id="r", environ={})


def test_expand_vars() -> None:
    assert expand_vars("${A}/b/${B}", {"A": "/a", "B": "c"}, what="x") == "/a/b/c"
    with pytest.raises(InfraError):
        expand_vars("${A}", {"A": ""}, what="x")


@pytest.mark.parametrize("gpus, expected", [
    (None, []),
    ("all", [{"Count": -1}]),
    (2, [{"Count": 2}]),
    ("3", [{"Count": 3}]),
    ("device=0,2", [{"DeviceIDs": ["0", "2"]}]),
    ("1,3", [{"DeviceIDs": ["1", "3"]}]),
])
def test_device_requests(gpus: Any, expected: list[dict[str, Any]]) -> None:
    got = device_requests(gpus)
    assert len(got) == len(expected)
    for request, want in zip(got, expected, strict=True):
        for key, value in want.items():
            assert request[key] == value
        assert request["Capabilities"] == [["gpu"]]


def test_container_port_prefers_the_serving_port(cpu: Resolved) -> None:
    assert container_port(cpu) == 8000
    args = tuple(v for v in cpu.serving if v.key != "port")
    assert container_port(replace(cpu, serving=args, run=replace(cpu.run, port=9000))) == 9000


def test_port_in_use_and_free_port() -> None:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert port_in_use(port)
        assert "already in use" in port_taken_error(port).message
    port = free_port()
    assert not port_in_use(port)


def test_exit_hints() -> None:
    assert "import failed" in exit_hint(["ModuleNotFoundError: No module named 'vllm.x'"])
    assert "does not compile" in exit_hint(["  File x", "SyntaxError: invalid syntax"])
    assert "rejected an argument" in exit_hint(["vllm serve: error: unrecognized arguments: --bogus"])
    assert exit_hint(["something else"]) == "the last log lines below say why"


def test_exit_hint_names_the_step_whose_file_is_in_the_traceback(cpu: Resolved) -> None:
    step = next(s for s in cpu.steps if s.kind == "patch")
    site = "/opt/venv/lib/python3.11/site-packages/"
    lines = ["Traceback (most recent call last):", f'  File "{site}{PatchSpec.of(step).file}", line 3, in <module>',
             "RuntimeError: boom"]
    hint = exit_hint(lines, cpu)
    assert f"step {step.id!r} (patch, " in hint and "build.yaml:" in hint
    assert "steps" not in exit_hint(["RuntimeError: boom"], cpu).split(";")[0]


def test_progress_line_on_a_pipe() -> None:
    lines: list[str] = []
    progress = Progress("waiting", lines.append, every=10, stream=io.StringIO())
    for t in (0.0, 4.0, 10.5, 12.0, 21.0):
        progress.update(t)
    progress.done("ready")
    assert lines == ["waiting: 0s", "waiting: 10s", "waiting: 21s", "ready"]


# --------------------------------------------------------------------------- readiness without Docker


class FakeContainer:
    def __init__(self, running: bool, exit_code: int = 0, oom: bool = False, logs: bytes = b"") -> None:
        self.name = "imageforge-test"
        self.attrs: dict[str, Any] = {"State": {"Running": running, "Status": "running" if running else "exited",
                                                "ExitCode": exit_code, "OOMKilled": oom, "Error": ""}}
        self._logs = logs

    def reload(self) -> None:
        pass

    def logs(self, stdout: bool = True, stderr: bool = True, tail: Any = "all") -> bytes:
        lines = self._logs.splitlines(keepends=True)
        return b"".join(lines[-tail:] if isinstance(tail, int) else lines)


def fake_server(container: FakeContainer, port: int, tmp_path: Path) -> Server:
    return Server(container=container, run_id="r", url=f"http://{HOST}:{port}", host_port=port, target="cpu",
                  profile="conservative", image="img", run_dir=tmp_path / "run")


@pytest.fixture
def health_server() -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = HTTPServer((HOST, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_ready_when_health_answers(health_server: int, tmp_path: Path) -> None:
    server = fake_server(FakeContainer(running=True), health_server, tmp_path)
    lines: list[str] = []
    seconds = wait_ready(server, timeout=10, log=lines.append, progress_stream=io.StringIO())
    assert seconds >= 0 and server.startup_seconds == seconds
    assert lines[-1].startswith(f"ready: http://{HOST}:{health_server}/health OK after")


def test_exited_container_reports_code_log_tail_and_hint(tmp_path: Path) -> None:
    logs = b"".join(f"line {i}\n".encode() for i in range(80)) + b"ModuleNotFoundError: No module named 'x'\n"
    server = fake_server(FakeContainer(running=False, exit_code=1, logs=logs), free_port(), tmp_path)
    with pytest.raises(SmokeError) as info:
        wait_ready(server, timeout=30, log=lambda _l: None, progress_stream=io.StringIO())
    err = info.value
    assert "stopped before it was ready" in err.message
    assert "exit code 1" in (err.found or "")
    assert len(err.log_tail) == 50 and err.log_tail[-1] == "ModuleNotFoundError: No module named 'x'"
    assert "import failed" in (err.hint or "") and "server.log" in (err.hint or "")
    assert (tmp_path / "run" / "server.log").read_bytes() == logs


def test_oom_killed_is_infrastructure(tmp_path: Path) -> None:
    server = fake_server(FakeContainer(running=False, exit_code=137, oom=True), free_port(), tmp_path)
    with pytest.raises(InfraError) as info:
        wait_ready(server, timeout=30, log=lambda _l: None, progress_stream=io.StringIO())
    assert "OOMKilled" in (info.value.found or "")


def test_timeout_reports_state_and_hint(tmp_path: Path) -> None:
    server = fake_server(FakeContainer(running=True, logs=b"still loading\n"), free_port(), tmp_path)
    with pytest.raises(SmokeError) as info:
        wait_ready(server, timeout=0.6, interval=0.1, log=lambda _l: None, progress_stream=io.StringIO())
    err = info.value
    assert "not ready within 1s" in err.message
    assert "status running" in (err.found or "") and "ConnectError" in (err.found or "")
    assert err.log_tail == ("still loading",)
    assert "startup_timeout" in (err.hint or "")


def test_host_address_publishes_there_and_daemon_may_pick_the_port(cpu: Resolved, tmp_path: Path) -> None:
    from imageforge.serve.ports import default_host_address

    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    spec = container_spec(rooted(cpu, tmp_path), "img", host_port=None, run_id="r4", environ={},
                          host_address="10.0.0.5")
    assert spec["ports"] == {"8000/tcp": ("10.0.0.5", None)}
    assert default_host_address({}) == "127.0.0.1"
    assert default_host_address({"IMAGEFORGE_HOST_ADDRESS": " 192.0.2.7 "}) == "192.0.2.7"


def test_an_exited_server_names_the_step_unless_it_serves_the_base(cpu: Resolved, tmp_path: Path) -> None:
    """The traceback's file is a step's (the built image); the base image holds no step's file. Of two
    patches to one file, the one whose new text holds the failing line is named (else the last writer)."""
    first, second = [s for s in cpu.steps if isinstance(s.spec, PatchSpec)
                     and s.spec.file == "vllm/v1/attention/ops/prefix_prefill.py"][:2]
    rel = PatchSpec.of(first).file
    code = PatchSpec.of(first).new.strip().splitlines()[0].strip()

    def failed(base: bool, shown: str) -> str:
        logs = (f'Traceback (most recent call last):\n  File "/opt/venv/lib/python3.11/site-packages/{rel}", line 3, '
                f"in <module>\n{shown}RuntimeError: boom\n").encode()
        server = replace(fake_server(FakeContainer(running=False, exit_code=1, logs=logs), free_port(), tmp_path),
                         base=base)
        with pytest.raises(SmokeError) as info:
            wait_ready(server, timeout=30, log=lambda _l: None, resolved=cpu, progress_stream=io.StringIO())
        assert "stopped before it was ready" in (info.value.found or "")
        return info.value.message

    where = f"vLLM did not start: RuntimeError in {rel} line 3"
    assert failed(False, "") == f"{where}, written by step {second.id!r} (patch)"
    assert failed(False, f"    {code}\n    ^^^^\n") == f"{where}, written by step {first.id!r} (patch)"
    assert failed(True, f"    {code}\n") == where


def test_sigterm_while_serving_removes_the_server_as_ctrl_c_does(cpu: Resolved,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM inside ``serving()``'s block is turned into the KeyboardInterrupt that Ctrl-C raises: the server is
    removed and the interrupt goes on (the CLI's exit 130). Ctrl-C itself runs end to end in
    tests/integration/test_run.py (`smoke --target` interrupted while it waits for /health); this was its SIGTERM
    twin there, a vLLM start of its own for the one line that differs."""
    import os
    import signal
    import time

    from imageforge.serve import container

    assert threading.current_thread() is threading.main_thread()  # pytest (and each xdist worker) runs tests there
    server = object()
    removed: list[object] = []

    def wait_ready(srv: object, **_kw: Any) -> None:
        assert srv is server
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3)  # the handler raises before this ends
        pytest.fail(f"SIGTERM did not interrupt the wait (the caller's handler got {caught})")

    monkeypatch.setattr(container, "start_server", lambda resolved, log, **kw: server)
    monkeypatch.setattr(container, "wait_ready", wait_ready)
    monkeypatch.setattr(container, "remove_server", lambda srv, log: removed.append(srv))
    caught: list[int] = []

    def callers_handler(signum: int, _frame: Any) -> None:
        caught.append(signum)  # where SIGTERM would land without serving()'s own handler

    previous = signal.signal(signal.SIGTERM, callers_handler)
    try:
        with (pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"),
              container.serving(cpu, log=lambda _line: None)):
            pytest.fail("the block ran: the wait was not interrupted")
        assert removed == [server] and caught == []
        assert signal.getsignal(signal.SIGTERM) is callers_handler  # the caller's handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------- --reuse-servers


def test_run_spec_digest_is_what_is_served_and_how_not_which_container(cpu: Resolved, tmp_path: Path) -> None:
    """Two containers with one digest serve alike: the image ID and the run options count; the name, the labels and
    the host port do not (they differ between any two starts)."""
    from imageforge.serve.spec import run_spec_digest

    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    resolved = rooted(cpu, tmp_path)
    one = container_spec(resolved, "imageforge/cpu:conservative", host_port=18123, run_id="r1", environ={})
    two = container_spec(resolved, "imageforge/cpu:x", host_port=18999, run_id="r2", environ={})
    two["labels"] = {**two["labels"], "org.imageforge.started-by": "run"}
    digest = run_spec_digest("sha256:aa", one)
    assert len(digest) == 32 and run_spec_digest("sha256:aa", two) == digest  # the tag is not the image: its ID is
    assert run_spec_digest("sha256:bb", one) != digest
    for key, value in (("environment", {"VLLM_CPU_KVCACHE_SPACE": "2"}), ("shm_size", "2g"),
                       ("command", ["vllm", "serve"]), ("privileged", True),
                       ("volumes", {**one["volumes"], "/data": {"bind": "/data", "mode": "ro"}}),
                       ("ports", {"8000/tcp": ("0.0.0.0", 18123)}), ("ports", {"9000/tcp": (HOST, 18123)})):
        assert run_spec_digest("sha256:aa", {**one, key: value}) != digest, key


class ListedContainer:
    """A container as ``containers.list`` gives it: its name, creation time and port bindings."""

    def __init__(self, name: str, created: str, port: int) -> None:
        self.name = name
        self.attrs = {"Created": created, "HostConfig": {"PortBindings": {"8000/tcp": [
            {"HostIp": HOST, "HostPort": str(port)}]}}}


def test_reusable_server_is_the_oldest_running_match_and_honours_an_asked_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge.serve import container

    asked: list[dict[str, Any]] = []
    found = [ListedContainer("newer", "2026-12-03T10:00:02Z", 18002), ListedContainer("older", "2026-12-03T10:00:01Z",
                                                                                       18001)]

    class Containers:
        def list(self, **kwargs: Any) -> list[ListedContainer]:
            asked.append(kwargs)
            return list(found)

    class Client:
        containers = Containers()

    monkeypatch.setattr(container, "client", lambda: Client())
    lines: list[str] = []
    assert getattr(container.reusable_server("d1", log=lines.append), "name", None) == "older"
    assert asked[0]["filters"] == {"status": "running", "label": [
        "org.imageforge.tool=imageforge", "org.imageforge.kind=server", "org.imageforge.run-spec=d1"]}
    assert getattr(container.reusable_server("d1", port=18002, log=lines.append), "name", None) == "newer"
    assert lines == ["not reusing older: it is published on another port than --port 18002"]
    assert container.reusable_server("d1", port=18003, log=lines.append) is None
    found.clear()
    assert container.reusable_server("d1") is None


class StoppableContainer(FakeContainer):
    def __init__(self) -> None:
        super().__init__(running=True, logs=b"vllm log\n")
        self.calls: list[str] = []

    def stop(self, timeout: int = 0) -> None:
        self.calls.append("stop")

    def remove(self, force: bool = False, v: bool = False) -> None:
        self.calls.append("remove")


def test_a_reused_server_is_left_running_with_its_log_kept(health_server: int, tmp_path: Path) -> None:
    """A reused server (not started by this use) is waited for as any other, reports no start-up time of its own,
    and ``remove_server`` leaves it running: only its log is saved into this use's run dir."""
    from imageforge.serve.container import remove_server

    ours, reused = StoppableContainer(), StoppableContainer()
    server = replace(fake_server(ours, health_server, tmp_path), container=reused, reused=True)
    lines: list[str] = []
    wait_ready(server, timeout=10, log=lines.append, progress_stream=io.StringIO())
    assert server.startup_seconds is None and server.ready_at is not None
    assert lines[-1] == f"ready: http://{HOST}:{health_server}/health OK (imageforge-test reused)"
    remove_server(server, log=lines.append)
    assert reused.calls == [] and lines[-1] == "left imageforge-test running (reused)"
    assert (tmp_path / "run" / "server.log").read_bytes() == b"vllm log\n"
    started = fake_server(ours, health_server, tmp_path)
    remove_server(started, log=lines.append)
    assert ours.calls == ["stop", "remove"] and lines[-1] == "removed imageforge-test"
