"""ssh:// Docker hosts against a real openssh-server on loopback (Debian's openssh-server, installed when missing).

The test runs its own sshd on a free high port of 127.0.0.1 with generated host and client keys; an
``ssh`` wrapper first on PATH adds ``-F`` with that key (OpenSSH reads ~/.ssh from the passwd entry, not
$HOME, so a test cannot point it elsewhere otherwise). Through it: the shared daemon answers at
``ssh://root@127.0.0.1:PORT`` (the SDK's ssh client runs ``docker system dial-stdio`` there), as
DOCKER_HOST and as the current docker context; it counts as remote; and imageforge's ``ssh -L``
forward reaches a port on the "remote" host and is gone after close.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from imageforge import docker_engine as de
from imageforge.docker_engine.forward import SSHForward
from imageforge.errors import InfraError
from imageforge.serve.ports import free_port

pytestmark = [pytest.mark.integration]


@dataclass(frozen=True)
class Sshd:
    port: int
    bin_dir: Path  # holds the `ssh` wrapper

    @property
    def url(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"


def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing accepts on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root")
    sshd_bin = de.ensure_tool("sshd", "openssh-server", log=print)
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
    port = free_port()
    (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
AllowTcpForwarding local
""")
    (d / "ssh_config").write_text(f"""\
Host *
  IdentityFile {d}/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile {d}/known_hosts
  LogLevel ERROR
""")
    bin_dir = d / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d}/ssh_config \"$@\"\n")
    wrapper.chmod(0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    log = open(d / "sshd.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    try:
        _wait_port(port)
        yield Sshd(port, bin_dir)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def over_ssh(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    monkeypatch.setenv("PATH", f"{sshd.bin_dir}:{os.environ['PATH']}")
    de._ANSWERED.clear()
    de._client_for.cache_clear()
    yield sshd
    de._ANSWERED.clear()
    de._client_for.cache_clear()


def test_the_daemon_answers_over_ssh_as_docker_host_and_as_a_context(over_ssh: Sshd, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    local_version = de.client().version()["Version"]
    de._client_for.cache_clear()
    monkeypatch.setenv("DOCKER_HOST", over_ssh.url)
    ep = de.endpoint()
    assert ep.is_ssh and not ep.local and not ep.default_socket
    de.ensure_daemon(log=print)  # answers: nothing to start
    assert de.client().version()["Version"] == local_version
    assert de.data_root() is None  # not this machine's disk, though it is the same daemon

    monkeypatch.delenv("DOCKER_HOST")
    config = tmp_path / "docker-config"
    meta = config / "contexts" / "meta" / __import__("hashlib").sha256(b"loop").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "loop", "Metadata": {}, "Endpoints": {
        "docker": {"Host": over_ssh.url, "SkipTLSVerify": False}}}))
    (config / "config.json").write_text(json.dumps({"currentContext": "loop"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    de._ANSWERED.clear()
    ep = de.endpoint()
    assert (ep.host, ep.source) == (over_ssh.url, "context loop")
    de.ensure_daemon(log=print)
    assert de.client().version()["Version"] == local_version


def test_an_ssh_host_without_a_daemon_is_exit_5_and_starts_nothing(over_ssh: Sshd,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"ssh://root@127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(InfraError) as ei:
        de.ensure_daemon(start=True, log=print)
    assert ei.value.exit_code == 5 and "DOCKER_HOST=ssh://" in ei.value.message


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello through the forward"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_the_forward_reaches_a_port_on_the_ssh_host_and_is_closed(over_ssh: Sshd) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        remote_port = int(server.server_address[1])
        with SSHForward(over_ssh.url, "127.0.0.1", remote_port) as forward:
            assert forward.local_port != remote_port
            pid = forward.pid
            assert pid is not None
            assert httpx.get(forward.url + "/", timeout=10).text == "hello through the forward"
        assert forward.pid is None and forward.wait_closed()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        with pytest.raises(httpx.ConnectError):
            httpx.get(forward.url + "/", timeout=3)
        bad = SSHForward(f"ssh://root@127.0.0.1:{free_port()}", "127.0.0.1", remote_port)
        with pytest.raises(InfraError, match="did not open"):
            bad.open(timeout=10)
        assert bad.pid is None
    finally:
        server.shutdown()


HEALTH_SERVER = """\
import http.server, sys
port = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok over ssh"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", port), H).serve_forever()
"""


@pytest.fixture(scope="module")
def health_image(cpu_resolved: object) -> Iterator[str]:
    """A tiny image on the OS base whose entrypoint answers 200 on the cpu target's container port."""
    import io
    import tarfile

    from imageforge.serve.spec import container_port

    os_ref = next((t for i in de.client().images.list(name="imageforge/os") for t in i.tags), None)
    if os_ref is None:
        pytest.skip("no imageforge/os image (invoke base makes it)")
    port = container_port(cpu_resolved)  # type: ignore[arg-type]
    dockerfile = (f"FROM {os_ref}\nCOPY health.py /health.py\n"
                  f'ENTRYPOINT ["python3", "/health.py", "{port}"]\n').encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("health.py", HEALTH_SERVER.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    tag = f"imageforge-test/ssh-health:{os.getpid()}"
    de.client().images.build(fileobj=context, custom_context=True, tag=tag, rm=True, network_mode="none")
    try:
        yield tag
    finally:
        de.client().images.remove(tag, force=True)


def test_a_server_on_the_ssh_host_is_reached_through_a_forward_that_is_closed_after(
        over_ssh: Sshd, health_image: str, cpu_resolved: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge.serve.container import serving

    monkeypatch.setenv("DOCKER_HOST", over_ssh.url)
    de._client_for.cache_clear()
    lines: list[str] = []
    with serving(cpu_resolved, image=health_image, environ=os.environ,  # type: ignore[arg-type]
                 log=lines.append, startup_timeout=120) as server:
        assert server.forward is not None
        assert server.url == server.forward.url != f"http://127.0.0.1:{server.host_port}"
        assert httpx.get(server.url + "/v1/models", timeout=10).text == "ok over ssh"
        pid = server.forward.pid
        name = server.name
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert server.forward.pid is None
    assert any("ssh forward" in line for line in lines)
    assert de.client().containers.list(all=True, ignore_removed=True, filters={"name": name}) == []


def test_run_leaves_its_forward_up_and_stop_closes_it(over_ssh: Sshd, health_image: str, cpu_resolved: object,
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from imageforge.serve.container import forward_record, start_detached, stop_servers

    monkeypatch.setenv("DOCKER_HOST", over_ssh.url)
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path / "cache"))
    de._client_for.cache_clear()
    monkeypatch.setattr("imageforge.serve.container.image_for", lambda *a, **k: health_image)  # no build: tiny image
    server = start_detached(cpu_resolved, base=False, port=None, timeout=120,  # type: ignore[arg-type]
                            host_address="127.0.0.1", log=print)
    try:
        record = forward_record(server.run_id)
        pid = json.loads(record.read_text())["pid"]
        os.kill(pid, 0)  # up, in its own session: it outlives `invoke run`
        assert os.getsid(pid) == pid
        assert httpx.get(server.url + "/health", timeout=10).text == "ok over ssh"
    finally:
        lines: list[str] = []
        stop_servers(cpu_resolved.target.name, log=lines.append)  # type: ignore[attr-defined]
    assert any(f"closed the ssh forward of {server.name} (pid {pid})" in line for line in lines)
    assert not record.exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with_zombie = Path(f"/proc/{pid}/stat")
        if with_zombie.exists() and with_zombie.read_text().rpartition(")")[2].split()[0] == "Z":
            break  # ended; our child until reaped
        time.sleep(0.1)
    else:
        pytest.fail(f"ssh forward {pid} still running after stop")
