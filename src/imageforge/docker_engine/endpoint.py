"""Which Docker daemon imageforge talks to, resolved as the docker CLI resolves it.

``DOCKER_HOST`` first (with ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``, as ``docker.from_env``);
else the context named by ``DOCKER_CONTEXT``, else ``currentContext`` in the Docker config
(``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``) with its endpoint from
``contexts/meta/<sha256(name)>/meta.json`` -- read through the SDK's own
``docker.context.ContextAPI.kwargs_from_context`` (``docker.from_env`` ignores contexts); else the
``default`` context, this machine's socket.

Whether the daemon is on this machine is decided from that base URL (:attr:`Endpoint.local`):
a unix socket or a TCP address on loopback publishes ports here and keeps its data on this
disk; ``ssh://`` and other TCP hosts do not. Only the default socket lets imageforge start a
dockerd itself (:attr:`Endpoint.default_socket`).

``ssh://`` endpoints use the SDK's ssh client (``use_ssh_client=True``: the system ``ssh`` binary
running ``docker system dial-stdio`` on the host) rather than paramiko's own SSH: the binary honours
``~/.ssh/config``, the agent, ``known_hosts``, ProxyJump and certificates exactly as the docker CLI
does, and the ``ssh -L`` forward to a served port (:mod:`imageforge.docker_engine.forward`) goes
through the same binary and configuration. The SDK still *imports* paramiko for any ssh:// URL
(docker/transport/sshconn.py), so ssh hosts need the ``imageforge[ssh]`` extra (``docker[ssh]``);
the core install stays without paramiko, cryptography, bcrypt and PyNaCl, and
:func:`client_kwargs` says so (exit 5) when the extra is missing.

:func:`sdk` is the one import of the SDK: where the endpoint is not ``ssh://`` it imports ``docker``
without its ssh transport (paramiko, cryptography, PyNaCl, bcrypt: ~55 ms of a no-op build's ~125 ms SDK
import) and attaches that transport later in the same process only if an ssh endpoint asks.
The default context is recognised without importing the SDK at all (``currentContext`` read as the SDK
reads it); only another context's endpoint is read through ``ContextAPI``.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from imageforge.errors import InfraError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
DEFAULT_SOCKETS = frozenset({DEFAULT_SOCKET, "unix://var/run/docker.sock", "unix:///run/docker.sock"})


@dataclass(frozen=True)
class Endpoint:
    """A daemon's base URL and where it came from (``DOCKER_HOST``, ``context NAME`` or ``default``)."""

    host: str
    source: str
    tls: Any = field(default=None, compare=False)  # docker.tls.TLSConfig of a context with TLS material

    @property
    def scheme(self) -> str:
        return urlsplit(self.host).scheme.lower()

    @property
    def is_ssh(self) -> bool:
        return self.scheme == "ssh"

    @property
    def hostname(self) -> str:
        return urlsplit(self.host).hostname or ""

    @property
    def default_socket(self) -> bool:
        """This machine's standard socket: the one daemon imageforge may start (``engine``)."""
        return self.host.rstrip("/") in DEFAULT_SOCKETS

    @property
    def local(self) -> bool:
        """The daemon runs on this machine: ports it publishes are reached here, its data root is this disk."""
        if self.scheme in ("unix", "npipe", ""):
            return True
        if self.scheme in ("tcp", "http", "https"):
            name = self.hostname
            if name == "localhost":
                return True
            try:
                return ipaddress.ip_address(name).is_loopback
            except ValueError:
                return False
        return False  # ssh:// and anything else

    def describe(self) -> str:
        return f"{self.host} ({self.source})"


def resolve_endpoint(environ: Mapping[str, str] | None = None) -> Endpoint:
    """The endpoint the docker CLI would use in ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST", "").strip()
    if host:
        return Endpoint(host, "DOCKER_HOST")
    name = env.get("DOCKER_CONTEXT", "").strip() or current_context_name()
    if name == "default":
        return Endpoint(DEFAULT_SOCKET, "default")  # no SDK import: a no-op build needs none for this
    sdk()  # lazy, and first: docker.context alone is a circular import in the SDK
    from docker.context import ContextAPI
    from docker.errors import DockerException

    try:
        kwargs = ContextAPI.kwargs_from_context(name, environment=dict(env))
    except DockerException as exc:
        raise InfraError(f"Docker context {name!r} cannot be read", found=str(exc)[:300],
                         hint="`docker context ls` lists the contexts; `docker context use default` or DOCKER_HOST "
                         "picks another daemon") from None
    base_url = str(kwargs.get("base_url") or "")
    if not base_url:
        raise InfraError(f"Docker context {name!r} is not there or has no docker endpoint (Host)",
                         hint="`docker context ls` lists the contexts; `docker context use default` or DOCKER_HOST "
                         "picks another daemon")
    return Endpoint(base_url, f"context {name}", kwargs.get("tls"))


def current_context_name() -> str:
    """``currentContext`` of the Docker config, read as the SDK's ``get_current_context_name`` reads it.

    The first of ``$DOCKER_CONFIG/config.json``, ``~/.docker/config.json``, ``~/.dockercfg`` that exists
    (the SDK's ``find_config_file``, from the process's environment as the SDK does); ``default`` when there
    is none, it cannot be read or it names none.
    """
    home = os.path.expanduser("~")
    candidates = [os.path.join(os.environ["DOCKER_CONFIG"], "config.json")] if os.environ.get("DOCKER_CONFIG") else []
    candidates += [os.path.join(home, ".docker", "config.json"), os.path.join(home, ".dockercfg")]
    for path in candidates:
        if os.path.exists(path):
            try:
                with open(path) as fh:
                    return str(json.load(fh).get("currentContext") or "default")
            except Exception:  # as the SDK: an unreadable config is the default context
                return "default"
    return "default"


def sdk(*, ssh: bool = False) -> ModuleType:
    """The ``docker`` package, imported once per process; its ssh transport only when ``ssh``.

    The SDK's ``docker.transport`` imports paramiko (and with it cryptography, PyNaCl, bcrypt) whenever
    paramiko is installed, for any endpoint. Where the endpoint is not ``ssh://`` the first import hides
    paramiko (``sys.modules["paramiko"] = None`` makes the SDK's own ``try: import`` skip the transport);
    an ssh endpoint later in the process imports the transport then and hands it to the SDK where its
    ``try`` would have put it (``docker.transport`` and ``docker.api.client``).
    """
    if "docker" not in sys.modules and not ssh and "paramiko" not in sys.modules:
        sys.modules["paramiko"] = None  # type: ignore[assignment]
        try:
            import docker
        finally:
            if sys.modules.get("paramiko", 0) is None:
                del sys.modules["paramiko"]
    import docker
    import docker.transport

    if ssh and not hasattr(docker.transport, "SSHHTTPAdapter") and importlib.util.find_spec("paramiko"):
        import docker.api.client
        from docker.transport.sshconn import SSHHTTPAdapter

        docker.transport.SSHHTTPAdapter = SSHHTTPAdapter
        docker.api.client.SSHHTTPAdapter = SSHHTTPAdapter
    module: ModuleType = sys.modules["docker"]
    return module


def client_kwargs(endpoint: Endpoint, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``docker.DockerClient(**kwargs)`` for ``endpoint`` (TLS from the environment or the context; ssh binary)."""
    env = os.environ if environ is None else environ
    if endpoint.source == "DOCKER_HOST":
        sdk(ssh=endpoint.is_ssh)
        from docker.utils import kwargs_from_env

        kwargs: dict[str, Any] = dict(kwargs_from_env(environment=dict(env)))
    else:
        kwargs = {"base_url": endpoint.host}
        if endpoint.tls is not None:
            kwargs["tls"] = endpoint.tls
    if endpoint.is_ssh:
        if importlib.util.find_spec("paramiko") is None:  # the SDK's ssh transport imports it, binary or not
            raise InfraError(f"the Docker endpoint {endpoint.describe()} is an ssh:// host and the docker SDK "
                             "needs paramiko for those",
                             hint="pip install 'imageforge[ssh]' (docker[ssh]); the connection itself then uses "
                             "the ssh binary and ~/.ssh/config")
        kwargs["use_ssh_client"] = True
    return kwargs
