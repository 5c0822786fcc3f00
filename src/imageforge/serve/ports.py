"""Where a server listens on this machine: the address servers are published on and reached at, and its ports.

Both runtimes pick and check ports here: a container's published port (:mod:`imageforge.serve.container`) and an
in-place process's listening port (:mod:`imageforge.serve.process`); so does the ssh forward to a remote daemon
(:mod:`imageforge.docker_engine.forward`), which is why this module sits below the daemon and imports nothing of
imageforge but the settings and the error root.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from .. import settings
from ..errors import InfraError

HOST = settings.DEFAULT_HOST_ADDRESS


def default_host_address(environ: Mapping[str, str] | None = None) -> str:
    """Where servers are published and reached: ``$IMAGEFORGE_HOST_ADDRESS`` or 127.0.0.1.

    With a remote ``DOCKER_HOST``, set it (or ``--host-address``) to an address of that host this
    machine can reach; ports are then published there and picked by the daemon.
    """
    return settings.host_address(None, os.environ if environ is None else environ)


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something already listens on ``host:port`` (or the port cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as a listening server would: connections in TIME_WAIT do not make the port taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError:
            return True
    return False


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken_error(port: int, host: str = HOST, *, pid: int | None = None) -> InfraError:
    """The error of a port something already listens on (``pid``: who, when this machine can tell)."""
    return InfraError(
        f"port {port} on {host} is already in use" + (f" by pid {pid}" if pid else ""),
        found=f"pid {pid} listens on :{port}" if pid else f"something listens on {host}:{port}",
        hint=f"pass another --port, or leave --port out to pick a free one; `invoke stop` removes servers "
        f"that `invoke run` left running (`invoke stop --in-place` those run in place; `ss -ltnp 'sport = :{port}'` "
        "shows who holds it)",
    )
