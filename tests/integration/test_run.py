"""`invoke run` / `invoke stop` and the serving() lifecycle on the real daemon.

One vLLM start here (``invoke run --base``: conftest's ``cpu_base_run``, shared with test_forensics_run's equiv
tests, which run before this module); the other tests never wait for vLLM. `smoke` interrupted (SIGINT) while it
waits for readiness interrupts a tiny target's server that never answers, not vLLM (SIGTERM's conversion to the
same interrupt is a unit test); the ``serving()`` interrupt is checked inside it (it reaches ``serving()``'s block).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.labels import L_KIND, L_PROFILE, L_RUN, L_TARGET, L_TOOL
from imageforge.serve.waits import wait_until
from tests.integration.helpers import labelled, sigint_default

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def test_run_base_prints_url_then_stop_removes_it(cpu_base_run: Any, invoke_cli: Callable[..., Any]) -> None:
    """``run --base`` (conftest's ``cpu_base_run``: float32, so that test_forensics_run's equiv tests compare against
    the same server before this test removes it) prints the URL, leaves the server up; ``stop`` removes it."""
    from imageforge.labels import L_STARTED_BY
    from imageforge.serve.container import STARTED_BY_RUN

    run_id: str | None = None
    try:
        cli = cpu_base_run.up()
        port = cpu_base_run.port
        assert f"URL=http://127.0.0.1:{port}" in cli.output.splitlines()
        assert re.search(rf"waiting for http://127\.0\.0\.1:{port}/health: \d+s", cli.output)
        match = re.search(r"started imageforge-cpu-(\S+) from imageforge/vllm-cpu-base:", cli.output)
        assert match, cli.output
        run_id = match.group(1)
        (container,) = labelled({L_RUN: run_id})
        labels = container.labels
        assert labels[L_TOOL] == "imageforge" and labels[L_KIND] == "server"
        assert labels[L_TARGET] == "cpu" and labels[L_PROFILE] == "base"
        assert labels[L_STARTED_BY] == STARTED_BY_RUN
        bindings = container.attrs["HostConfig"]["PortBindings"]
        assert bindings == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
        assert container.attrs["HostConfig"]["ShmSize"] == 1024**3
        # the model bound read-only; vLLM's cache a named volume (the daemon's), writable, where vLLM wrote its
        # record of the model class at start-up: the next start reads it instead of inspecting the class again
        mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
        assert (mounts["/models/tiny-qwen3-moe"]["Type"], mounts["/models/tiny-qwen3-moe"]["RW"]) == ("bind", False)
        cache = mounts["/root/.cache/vllm"]
        assert (cache["Type"], cache["Name"], cache["RW"]) == ("volume", "imageforge-vllm-cache", True)
        code, out = container.exec_run(["ls", "/root/.cache/vllm/modelinfos"])
        assert code == 0 and "Qwen3MoeForCausalLM" in out.decode(), out
        cmd = container.attrs["Config"]["Cmd"]
        assert cmd[:3] == ["vllm", "serve", "/models/tiny-qwen3-moe"] and "--max-num-seqs" in cmd
        assert cmd[cmd.index("--dtype") + 1] == "float32"  # --set reaches the flags
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "tiny-qwen3-moe"
        # still running after the task returned: a second run on the same port is refused
        again = invoke_cli("run", "--target", "cpu", "--base", "--port", str(port))
        assert again.code == 5 and f"port {port} on 127.0.0.1 is already in use" in again.output
    finally:
        stop = invoke_cli("stop", "--target", "cpu")
    assert stop.code == 0, stop.output
    assert run_id is not None and f"removed imageforge-cpu-{run_id}" in stop.output
    assert labelled({L_RUN: run_id}) == []
    assert not cpu_base_run.answers()


def test_port_taken_is_refused_before_anything_starts(invoke_cli: Callable[..., Any], taken_port: int) -> None:
    for task in ("run", "smoke"):
        cli = invoke_cli(task, "--target", "cpu", "--port", str(taken_port), timeout=300)
        assert cli.code == 5, cli.output
        assert f"port {taken_port} on 127.0.0.1 is already in use" in cli.output
        assert "hint:" in cli.output and "Traceback" not in cli.output
        assert "started imageforge-cpu" not in cli.output


def test_stop_leaves_servers_it_did_not_start(cpu_server: Any, invoke_cli: Callable[..., Any]) -> None:
    cli = invoke_cli("stop", "--target", "cpu")
    assert cli.code == 0
    assert cpu_server.running()
    assert httpx.get(f"{cpu_server.url}/health", timeout=10).status_code == 200


def test_missing_image_is_an_infra_error(cpu_resolved: Any) -> None:
    from imageforge.errors import InfraError
    from imageforge.serve.container import start_server

    with pytest.raises(InfraError) as info:
        start_server(cpu_resolved, environ=os.environ, image="imageforge-test/does-not-exist:1", log=lambda _l: None)
    assert "does not exist" in info.value.message and "invoke build" in (info.value.hint or "")


def test_interrupted_smoke_removes_its_server(tmp_path: Path) -> None:
    """Ctrl-C while `invoke smoke` waits for readiness: exit 130, nothing left running. The interrupt reaches
    ``serving()``'s block (its ``wait_ready``): that ``serving()`` removes its running container on an interrupt and
    keeps its log is checked here too (it had a test and a vLLM start of its own). SIGTERM, which
    ``serving()`` turns into the same KeyboardInterrupt, was this test's second case and second start: it is
    tests/unit/test_serve_container.py::test_sigterm_while_serving_removes_the_server_as_ctrl_c_does.

    What is interrupted is imageforge's wait and its container, not vLLM: the server is a tiny target's (forge_fixtures'
    tiny base) whose serving command runs and never answers /health, so this claim costs no vLLM start
    (it was the cpu target's, killed while vLLM imported)."""
    from tests.integration.forge_fixtures import tiny_base, write_manifest

    never_ready = '[python3, -c, "import time; print(\'not serving\', flush=True); time.sleep(3600)"]'
    manifest, target = write_manifest(tmp_path / "m", tiny_base(), command=never_ready)
    proc = subprocess.Popen([str(INVOKE), "smoke", "--manifest", str(manifest), "--target", target,
                             "--suite", str(REPO / "smoke" / "dummy.yaml")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=sigint_default)
    assert proc.stdout is not None
    lines: list[str] = []
    run_id = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(rf"started imageforge-{target}-(\S+) from", line)
            if match:
                run_id = match.group(1)
            if run_id and "waiting for" in line:
                break
        assert run_id, "".join(lines)
        (container,) = labelled({L_RUN: run_id})
        assert container.status == "running"
        # its command runs: the log to keep has a line
        assert wait_until(lambda: True if b"not serving" in container.logs() else None, timeout=60, interval=0.2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "interrupted" in output and f"removed imageforge-{target}-{run_id}" in output
    assert labelled({L_RUN: run_id}) == []
    server_log = tmp_path / "m" / ".imageforge" / "runs" / run_id / "server.log"
    assert "not serving" in server_log.read_text()  # the container's own log, kept
