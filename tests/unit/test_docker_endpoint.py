"""The Docker endpoint as the docker CLI resolves it: DOCKER_HOST, DOCKER_CONTEXT, config.json's currentContext.

Contexts are written the way `docker context create` writes them (config.json + contexts/meta/<sha256>/meta.json)
into a DOCKER_CONFIG folder under tmp; nothing here talks to a daemon.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from imageforge.docker_engine.endpoint import Endpoint, client_kwargs, resolve_endpoint
from imageforge.errors import EXIT_INFRA, InfraError


def _config(tmp_path: Path, current: str | None, contexts: dict[str, str]) -> dict[str, str]:
    folder = tmp_path / "docker-config"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"currentContext": current} if current else {}))
    for name, host in contexts.items():
        meta = folder / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
        meta.mkdir(parents=True)
        (meta / "meta.json").write_text(json.dumps(
            {"Name": name, "Metadata": {}, "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": False}}}))
    return {"DOCKER_CONFIG": str(folder)}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))  # the SDK reads the process's env


def test_no_config_and_no_host_is_the_default_socket(tmp_path: Path) -> None:
    ep = resolve_endpoint({"DOCKER_CONFIG": str(tmp_path / "missing")})
    assert ep == Endpoint("unix:///var/run/docker.sock", "default")
    assert ep.local and ep.default_socket and not ep.is_ssh


def test_current_context_from_config_json(tmp_path: Path) -> None:
    env = _config(tmp_path, "remote", {"remote": "ssh://builder@10.0.0.7:2222", "other": "tcp://10.0.0.8:2376"})
    ep = resolve_endpoint(env)
    assert (ep.host, ep.source) == ("ssh://builder@10.0.0.7:2222", "context remote")
    assert ep.is_ssh and not ep.local and not ep.default_socket
    assert client_kwargs(ep, env) == {"base_url": "ssh://builder@10.0.0.7:2222", "use_ssh_client": True}


def test_docker_context_beats_config_json_and_docker_host_beats_both(tmp_path: Path) -> None:
    env = _config(tmp_path, "remote", {"remote": "ssh://builder@10.0.0.7", "lo": "tcp://127.0.0.1:2375"})
    assert resolve_endpoint({**env, "DOCKER_CONTEXT": "lo"}) == Endpoint("tcp://127.0.0.1:2375", "context lo")
    assert resolve_endpoint({**env, "DOCKER_CONTEXT": "default"}).source == "default"
    ep = resolve_endpoint({**env, "DOCKER_CONTEXT": "lo", "DOCKER_HOST": "unix:///tmp/d.sock"})
    assert ep == Endpoint("unix:///tmp/d.sock", "DOCKER_HOST")
    assert ep.local and not ep.default_socket  # this machine, but not the socket imageforge may start


def test_an_unknown_context_is_an_infrastructure_error(tmp_path: Path) -> None:
    env = _config(tmp_path, "gone", {})
    with pytest.raises(InfraError) as ei:
        resolve_endpoint(env)
    assert ei.value.exit_code == EXIT_INFRA and "'gone'" in ei.value.message
    assert "docker context ls" in (ei.value.hint or "")


@pytest.mark.parametrize(("host", "local"), [
    ("unix:///var/run/docker.sock", True), ("unix:///tmp/other.sock", True), ("tcp://127.0.0.1:2375", True),
    ("tcp://localhost:2375", True), ("tcp://[::1]:2375", True), ("tcp://10.1.2.3:2376", False),
    ("tcp://docker.example:2376", False), ("ssh://me@127.0.0.1:2222", False), ("ssh://box", False),
])
def test_local_is_decided_from_the_base_url(host: str, local: bool) -> None:
    assert Endpoint(host, "test").local is local


def test_docker_host_keeps_the_sdks_tls_variables(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (certs / name).write_text("x")
    env = {"DOCKER_HOST": "tcp://10.0.0.9:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(certs)}
    kwargs = client_kwargs(resolve_endpoint(env), env)
    assert kwargs["base_url"] == "tcp://10.0.0.9:2376" and kwargs["tls"] is not None
    assert "use_ssh_client" not in kwargs


def test_ssh_hosts_need_the_ssh_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "paramiko" else real(name, *a))
    with pytest.raises(InfraError) as ei:
        client_kwargs(Endpoint("ssh://me@box", "DOCKER_HOST"), {"DOCKER_HOST": "ssh://me@box"})
    assert ei.value.exit_code == EXIT_INFRA and "imageforge[ssh]" in (ei.value.hint or "")


def test_ssh_destination_matches_the_sdks_ssh_arguments() -> None:
    from imageforge.docker_engine.forward import ssh_destination

    assert ssh_destination("ssh://builder@10.0.0.7:2222") == ["-l", "builder", "-p", "2222", "--", "10.0.0.7"]
    assert ssh_destination("ssh://box") == ["--", "box"]
    with pytest.raises(ValueError):
        ssh_destination("tcp://box:2375")


def test_resolving_first_in_a_fresh_process_imports_the_sdk_cleanly(tmp_path: Path) -> None:
    """docker.context imported before docker is a circular import in the SDK: resolve_endpoint imports docker first."""
    import os
    import subprocess
    import sys

    code = "from imageforge.docker_engine.endpoint import resolve_endpoint; print(resolve_endpoint().source)"
    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path)}
    env.pop("DOCKER_HOST", None)
    env.pop("DOCKER_CONTEXT", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "default"


def test_the_sdk_is_imported_without_its_ssh_transport_until_an_ssh_endpoint_asks(tmp_path: Path) -> None:
    """paramiko (+ cryptography, PyNaCl, bcrypt: ~55 ms) stays out of a process whose daemon is a socket;
    an ssh:// endpoint later in the same process still gets the SDK's ssh adapter. A fresh process, as a command."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("paramiko") is None:
        pytest.skip("paramiko is not installed here: nothing to keep out")
    code = (
        "import sys\n"
        "from imageforge.docker_engine.endpoint import Endpoint, client_kwargs, resolve_endpoint, sdk\n"
        "ep = resolve_endpoint()\n"
        "docker = sdk(ssh=ep.is_ssh)\n"
        "import docker.transport\n"
        "print(ep.source, 'paramiko' in sys.modules, hasattr(docker.transport, 'SSHHTTPAdapter'))\n"
        "kwargs = client_kwargs(Endpoint('ssh://me@box', 'DOCKER_HOST'), {'DOCKER_HOST': 'ssh://me@box'})\n"
        "import docker.api.client\n"
        "print('paramiko' in sys.modules, docker.api.client.SSHHTTPAdapter is docker.transport.SSHHTTPAdapter,"
        " kwargs['use_ssh_client'])\n"
    )
    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path)}
    env.pop("DOCKER_HOST", None)
    env.pop("DOCKER_CONTEXT", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.strip().splitlines()
    assert first == "default False False"
    assert second == "True True True"
