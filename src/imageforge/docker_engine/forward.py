"""An ``ssh -L`` port forward to a port on an ``ssh://`` Docker host, opened and closed by imageforge.

A serving container on a daemon reached over ssh publishes its port on *that* host (on
``host_address``, default its 127.0.0.1); :class:`SSHForward` runs the system ``ssh`` (the same binary
and ``~/.ssh/config`` the docker SDK's ssh client uses) with ``-N -L 127.0.0.1:LOCAL:ADDR:PORT`` and
``ExitOnForwardFailure``, waits until LOCAL accepts connections, and ends the ssh process on
:meth:`close` (also when the with-block is left by an error or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from imageforge.docker_engine import _terminate  # the package's one TERM-then-KILL
from imageforge.errors import InfraError
from imageforge.serve.ports import free_port
from imageforge.serve.waits import wait_until

#: Seconds the forward may take to accept connections (ssh login included).
OPEN_TIMEOUT = 30.0


def ssh_destination(ssh_url: str) -> list[str]:
    """``ssh://user@host:port`` -> ssh's arguments ``[-l user] [-p port] -- host`` (as the SDK's ssh client)."""
    parts = urlsplit(ssh_url)
    if parts.scheme != "ssh" or not parts.hostname:
        raise ValueError(f"not an ssh:// URL: {ssh_url}")
    args: list[str] = []
    if parts.username:
        args += ["-l", parts.username]
    if parts.port:
        args += ["-p", str(parts.port)]
    return [*args, "--", parts.hostname]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def end_recorded(path: Path) -> int | None:
    """End the detached forward recorded at ``path`` (when that very process still runs); remove the record.

    Returns the pid that was ended, else None.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    pid = int(data.get("pid") or 0)
    if pid <= 0 or data.get("start") is None or _start_time(pid) != data.get("start"):
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        return pid
    return None


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class SSHForward:
    """``127.0.0.1:local_port`` here -> ``remote_address:remote_port`` as seen from the ssh host."""

    def __init__(self, ssh_url: str, remote_address: str, remote_port: int, *, local_port: int | None = None) -> None:
        self.ssh_url = ssh_url
        self.remote_address = remote_address
        self.remote_port = remote_port
        self.local_port = local_port or free_port("127.0.0.1")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def command(self) -> list[str]:
        ssh = shutil.which("ssh") or "ssh"
        spec = f"127.0.0.1:{self.local_port}:{self.remote_address}:{self.remote_port}"
        return [ssh, "-N", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15",
                "-L", spec, *ssh_destination(self.ssh_url)]

    def open(self, *, timeout: float = OPEN_TIMEOUT, detach: bool = False) -> SSHForward:
        """Start ssh; return once the local port accepts connections. InfraError (exit 5) when it does not.

        ``detach``: ssh gets its own session, so it outlives this process (``invoke run`` leaves it up).
        """
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL if detach else subprocess.PIPE,
                                     start_new_session=detach)
        proc = self.proc

        def ready() -> bool | None:
            if proc.poll() is not None:
                return False
            return True if _accepts(self.local_port) else None

        ok = wait_until(ready, timeout=timeout, interval=0.2)
        if not ok:
            reason = ""
            if proc.poll() is not None and proc.stderr is not None:
                reason = proc.stderr.read().decode("utf-8", "replace").strip()[-500:]
            self.close()
            raise InfraError(
                f"the ssh forward 127.0.0.1:{self.local_port} -> {self.remote_address}:{self.remote_port} on "
                f"{self.ssh_url} did not open within {timeout:.0f}s",
                found=reason or f"ssh exit {proc.returncode}",
                hint=f"check that `ssh {' '.join(ssh_destination(self.ssh_url))} true` logs in without a prompt "
                "(keys, known_hosts) and that the port is published on that host")
        return self

    def close(self) -> None:
        """End the ssh process (TERM, then KILL after 5 s)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        _terminate(proc, grace=5)
        if proc.stderr is not None:
            proc.stderr.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def record(self, path: Path) -> None:
        """Write pid + start time of a detached forward to ``path`` (``end_recorded`` ends it later)."""
        if self.proc is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pid": self.proc.pid, "start": _start_time(self.proc.pid), "url": self.url,
                                    "ssh": self.ssh_url}), encoding="utf-8")

    def __enter__(self) -> SSHForward:
        return self.open() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once nothing accepts on the local port any more."""
        deadline = time.monotonic() + timeout
        while _accepts(self.local_port):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True
