"""The Docker engine: make sure a daemon answers, hand out one SDK client, translate its errors.

Every task that talks to Docker calls :func:`ensure_daemon` first. The daemon is the one the
docker CLI would use (:mod:`imageforge.docker_engine.endpoint`: DOCKER_HOST, else the current
``docker context``). Only when asked -- the set-up commands (``engine``, ``demo``, ``test``,
``base``) pass ``start=True``, or ``IMAGEFORGE_START_DOCKERD=1`` -- does a machine without a daemon
get Debian's ``docker.io`` (apt-get) and a ``dockerd`` started in the background (there is no
systemd here); every other command without a daemon stops at once (exit 5) naming those.

:func:`daemon_errors` is the one place where SDK and connection failures become imageforge
errors (exit 5, infrastructure), never a traceback.  Reading and writing files of containers
(``get_archive``/``put_archive``) is in :mod:`imageforge.docker_engine.containers`.

The ``docker`` package is imported lazily inside the functions (through
:func:`~imageforge.docker_engine.endpoint.sdk`): the CLI's fast paths (``--help``, ``validate``) must not
pay for it. A process makes one SDK client per endpoint (:func:`client`), and its API version is
negotiated by the ``/_ping`` that tells the daemon answers (its ``API-Version`` header), not by a second
``GET /version``: a no-op build makes one client and one ping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imageforge.docker_engine.endpoint import Endpoint, client_kwargs, resolve_endpoint, sdk
from imageforge.errors import BuildError, InfraError
from imageforge.labels import L_KIND, L_RECIPE_KEY, L_TOOL, TOOL
from imageforge.rundirs import file_lock

if TYPE_CHECKING:  # pragma: no cover
    import docker
    from docker.models.containers import Container

#: Labels on everything imageforge creates (images, containers).
LABEL_TOOL = L_TOOL
LABEL_KIND = L_KIND
LABEL_RECIPE_KEY = L_RECIPE_KEY

#: The environment variable that lets any command install and start dockerd (as `invoke engine` does).
START_DOCKERD_ENV = "IMAGEFORGE_START_DOCKERD"
DOCKERD_LOG = Path("/var/log/imageforge-dockerd.log")
DOCKERD_LOCK = Path("/run/imageforge-dockerd.lock")
#: Seconds an SDK call may take (commits and imports of multi-GB images are slow on 2 cores).
CLIENT_TIMEOUT = 900
#: Seconds the ping that makes a client (and negotiates its API version) may take.
PING_TIMEOUT = 5
#: SDK clients made in this process (one per endpoint and timeout; tests count them).
CLIENTS_MADE: list[Endpoint] = []

GiB = 1024**3
MiB = 1024**2


# --------------------------------------------------------------------------------------------
# pure helpers (unit-tested without a daemon)
# --------------------------------------------------------------------------------------------


def endpoint() -> Endpoint:
    """The daemon the docker CLI would talk to here and now (DOCKER_HOST, else the current context)."""
    return resolve_endpoint(os.environ)


def _new_client(ep: Endpoint, timeout: int, ping_timeout: float = PING_TIMEOUT) -> docker.DockerClient:
    """An SDK client for ``ep`` whose API version comes from the daemon's answer to one ``/_ping``.

    The SDK's own negotiation (``version="auto"``) costs a ``GET /version`` on top of the ping that
    :func:`ensure_daemon` needs anyway; the ping's ``API-Version`` header is the same number (the SDK
    reads ``ApiVersion`` of /version). A daemon too old to send the header is asked /version as before.
    Failures are the SDK's own ``DockerException`` ("Error while fetching server API version"), as with
    ``version="auto"``.
    """
    sdk_ = sdk(ssh=ep.is_ssh)
    from docker.constants import MINIMUM_DOCKER_API_VERSION

    kwargs = client_kwargs(ep, os.environ)
    c: docker.DockerClient = sdk_.DockerClient(timeout=timeout, version=MINIMUM_DOCKER_API_VERSION, **kwargs)
    api = c.api
    try:
        response = api._get(api._url("/_ping", versioned_api=False), timeout=ping_timeout)
        api._raise_for_status(response)
        version = response.headers.get("API-Version") or api._retrieve_server_version()
    except Exception as exc:
        with contextlib.suppress(Exception):
            c.close()
        raise sdk_.errors.DockerException(f"Error while fetching server API version: {exc}") from exc
    api._version = str(version)
    CLIENTS_MADE.append(ep)
    _ANSWERED.add(ep)
    return c


def tail_lines(text: str | bytes, n: int = 30) -> list[str]:
    """The last ``n`` non-empty lines of ``text`` (bytes are decoded leniently)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-n:]


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


@dataclass(frozen=True)
class DiskNeed:
    """``need`` bytes must be free on the file system holding ``path`` (``what`` says why)."""

    what: str
    path: Path
    need: int


def disk_shortfalls(needs: Sequence[DiskNeed], free_of: Callable[[Path], int]) -> list[str]:
    """One readable line per need that ``free_of`` says is not met (empty: all fine).

    Needs on the same file system (same existing ancestor's device) are added up.
    """
    groups: dict[Any, list[DiskNeed]] = {}
    for need in needs:
        groups.setdefault(_device_of(need.path), []).append(need)
    out: list[str] = []
    for group in groups.values():
        total = sum(n.need for n in group)
        if total <= 0:
            continue
        free = free_of(group[0].path)
        if free < total:
            parts = " + ".join(f"{human_bytes(n.need)} for {n.what}" for n in group)
            out.append(
                f"{_existing_ancestor(group[0].path)}: {human_bytes(free)} free, {human_bytes(total)} needed ({parts})"
            )
    return out


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _device_of(path: Path) -> Any:
    try:
        return os.stat(_existing_ancestor(path)).st_dev
    except OSError:  # pragma: no cover - vanished meanwhile
        return str(path)


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing_ancestor(path)).free


def check_disk(needs: Sequence[DiskNeed]) -> None:
    """Raise InfraError (exit 5) when any need is not met, saying how much is needed."""
    short = disk_shortfalls(needs, free_bytes)
    if short:
        raise InfraError(
            "not enough free disk space: " + "; ".join(short),
            hint="free some space (e.g. `docker image prune`, remove old entries under the imageforge "
            "cache) or point IMAGEFORGE_CACHE at a larger disk",
        )


# --------------------------------------------------------------------------------------------
# subprocess helpers
# --------------------------------------------------------------------------------------------


def run_logged(
    cmd: Sequence[str],
    *,
    what: str,
    env: dict[str, str] | None = None,
    error: type[BuildError] | type[InfraError] = BuildError,
    hint: str | None = None,
    tail: int = 30,
) -> str:
    """Run ``cmd``; return its output, or raise ``error`` with the command and its last lines.

    The child gets its own process group only implicitly through Ctrl-C reaching the whole
    foreground group; on KeyboardInterrupt we make sure it is gone before re-raising.
    """
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        out_b, _ = proc.communicate()
    except BaseException:
        _terminate(proc)
        raise
    out = out_b.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise error(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}",
            hint=hint,
            log_tail=tail_lines(out, tail),
        )
    return out


def _terminate(proc: subprocess.Popen[Any], grace: float = 20.0) -> None:
    """End ``proc``: TERM, then KILL when it has not exited after ``grace`` seconds (nothing if it already has)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def apt_install(packages: Sequence[str], *, log: Callable[[str], None] = print) -> None:
    """Install Debian packages (apt-get update first; noninteractive).  InfraError when impossible."""
    if os.geteuid() != 0:
        raise InfraError(
            f"{', '.join(packages)} missing and not running as root, so it cannot be installed",
            hint=f"run as root, or install it: sudo apt-get install -y {' '.join(packages)}",
        )
    if shutil.which("apt-get") is None:
        raise InfraError(
            f"{', '.join(packages)} missing and there is no apt-get to install it",
            hint="install the Debian packages " + " ".join(packages) + " (or their equivalents) by hand",
        )
    # Recommends included: that is the set measured to work here (cgroupfs-mount, apparmor, ...).
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_MODE="a", NEEDRESTART_SUSPEND="1")
    hint = "check that Debian's package repositories are reachable (apt-get update)"
    t0 = time.monotonic()
    log(f"installing Debian packages: {' '.join(packages)} (apt-get)")
    run_logged(["apt-get", "update", "-q"], what="apt-get update", env=env, error=InfraError, hint=hint)
    run_logged(
        ["apt-get", "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold", *packages],
        what="apt-get install",
        env=env,
        error=InfraError,
        hint=hint,
    )
    log(f"installed {' '.join(packages)} in {time.monotonic() - t0:.1f}s")


def ensure_tool(executable: str, package: str, *, log: Callable[[str], None] = print) -> str:
    """Path of ``executable``; installs Debian ``package`` when it is missing."""
    found = shutil.which(executable) or _which_sbin(executable)
    if found:
        return found
    apt_install([package], log=log)
    found = shutil.which(executable) or _which_sbin(executable)
    if not found:
        raise InfraError(f"{executable} still missing after installing {package}")
    return found


def _which_sbin(executable: str) -> str | None:
    for d in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        candidate = Path(d) / executable
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


# --------------------------------------------------------------------------------------------
# daemon and client
# --------------------------------------------------------------------------------------------


_ANSWERED: set[Endpoint] = set()


def _ping(timeout: float = PING_TIMEOUT) -> str | None:
    """None when a daemon answers, else a short reason (a daemon that answered once is trusted).

    The ping is the one that makes the process's shared client (:func:`client`): no client of its own.
    """
    ep = endpoint()
    if ep in _ANSWERED:
        return None
    sdk(ssh=ep.is_ssh)
    from docker.errors import DockerException

    try:
        _client_for(ep, CLIENT_TIMEOUT, timeout)  # a client already made for ep counts as its answer
        return None
    except DockerException as exc:
        return str(exc)
    except InfraError as exc:  # the ssh extra missing (client_kwargs)
        return exc.message


def _dockerd_running() -> bool:
    pidfile = Path("/var/run/docker.pid")
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return "dockerd" in Path(f"/proc/{pid}/comm").read_text()
    except OSError:  # pragma: no cover
        return True


def _log_tail(n: int = 25) -> list[str]:
    try:
        return tail_lines(DOCKERD_LOG.read_bytes()[-20000:], n)
    except OSError:
        return []


def start_asked(environ: Mapping[str, str] | None = None) -> bool:
    """IMAGEFORGE_START_DOCKERD=1 (or true/yes): any command may install and start dockerd."""
    value = (os.environ if environ is None else environ).get(START_DOCKERD_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def ensure_daemon(*, start: bool | None = None, install: bool = True, timeout: float = 60,
                  log: Callable[[str], None] = print) -> None:
    """Make sure a Docker daemon answers; install/start one on this machine only when asked.

    - a daemon answers (DOCKER_HOST, else the current docker context) -> return at once;
    - the endpoint is another daemon than this machine's default socket -> InfraError (we never
      start someone else's daemon);
    - not asked (``start`` false, or None and IMAGEFORGE_START_DOCKERD unset) -> InfraError at once,
      naming the set-up commands that start one;
    - ``dockerd`` missing -> ``apt-get install docker.io`` (when ``install``), then
      ``dockerd`` is started in the background (own session, log in DOCKERD_LOG) and pinged
      until ``timeout`` seconds have passed -> InfraError with the log's last lines.
    """
    reason = _ping()
    if reason is None:
        return
    ep = endpoint()
    if not ep.default_socket:
        where = f"DOCKER_HOST={ep.host}" if ep.source == "DOCKER_HOST" else ep.describe()
        raise InfraError(
            f"no Docker daemon answers at {where}",
            found=reason,
            hint="start that daemon, or unset DOCKER_HOST / `docker context use default` to use this machine's "
            "(`invoke engine` starts a local dockerd)",
        )
    if not (start if start is not None else start_asked()):
        raise InfraError(
            f"no Docker daemon answers at {ep.describe()}",
            found=reason,
            hint="`invoke engine` installs Debian's docker.io when missing and starts dockerd (so do `invoke demo`, "
            f"`invoke test` and `invoke base`); or set {START_DOCKERD_ENV}=1, or start a daemon yourself",
        )
    if shutil.which("dockerd") is None and _which_sbin("dockerd") is None:
        if not install:
            raise InfraError(
                "no Docker daemon answers and dockerd is not installed",
                hint="install Debian's docker.io (apt-get install docker.io) or start a Docker daemon",
            )
        ensure_tool("dockerd", "docker.io", log=log)
    if os.geteuid() != 0:
        raise InfraError(
            "no Docker daemon answers and only root can start dockerd here",
            found=reason,
            hint="start it as root (sudo dockerd &) or give this user access to a running daemon",
        )
    with file_lock(DOCKERD_LOCK):  # two tasks at once start one dockerd
        if _ping() is None:
            return
        proc: subprocess.Popen[bytes] | None = None
        if not _dockerd_running():
            dockerd = shutil.which("dockerd") or _which_sbin("dockerd") or "dockerd"
            log(f"starting dockerd in the background (log: {DOCKERD_LOG})")
            DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
            with open(DOCKERD_LOG, "ab") as out:
                proc = subprocess.Popen(
                    [dockerd],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # survives this process and its Ctrl-C
                    close_fds=True,
                )
        else:
            log("dockerd is running but not answering yet; waiting for it")
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            reason = _ping(timeout=3)
            if reason is None:
                log(f"Docker daemon answers after {time.monotonic() - t0:.1f}s")
                return
            if proc is not None and proc.poll() is not None:
                raise InfraError(
                    f"dockerd exited with code {proc.returncode} right after starting",
                    hint=f"see {DOCKERD_LOG}; a container runtime needs root, cgroups and an overlay-"
                    "capable file system",
                    log_tail=_log_tail(),
                )
            if time.monotonic() >= deadline:
                raise InfraError(
                    f"the Docker daemon did not answer within {timeout:.0f}s",
                    found=reason,
                    hint=f"see {DOCKERD_LOG}; retry with a longer wait, or start dockerd by hand",
                    log_tail=_log_tail(),
                )
            time.sleep(0.5)


@contextlib.contextmanager
def daemon_errors(what: str, *, hint: str | None = None) -> Iterator[None]:
    """Map SDK/connection failures to InfraError (exit 5), never a traceback.

    The one translator of daemon errors: a refusal (an API error) is the same exit code in every
    task, whether a build step, a serving container or a clean-up asked.  ``what`` completes
    "lost the Docker daemon while ..." and "Docker refused ..."; ``hint`` goes with a refusal.
    """
    sdk()
    import docker.errors
    import requests.exceptions

    try:
        yield
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError, ConnectionError) as exc:
        raise InfraError(f"lost the Docker daemon while {what}", found=(str(exc).splitlines() or [""])[0][:200],
                         hint="is dockerd still running? `docker info` tells") from None
    except docker.errors.ImageNotFound as exc:
        raise InfraError(f"an image disappeared from the Docker daemon while {what}",
                         found=explanation(exc)[:300],
                         hint="was it removed meanwhile (docker rmi, invoke clean)? Run the build again; a removed "
                         "base image must be made or loaded again") from None
    except docker.errors.APIError as exc:
        text = explanation(exc)
        if "no space left" in text.lower():
            raise InfraError(f"out of disk space while {what}", found=text[:300],
                             hint="free space (invoke clean) or move Docker's data root") from None
        raise InfraError(f"Docker refused {what}", found=text[:500], hint=hint) from None


def explanation(exc: BaseException) -> str:
    """The daemon's own words for an SDK error (``APIError.explanation``), else the error text."""
    return str(getattr(exc, "explanation", None) or exc)


class _Clients:
    """The process's SDK clients, one per (endpoint, timeout); ``cache_clear`` forgets them (tests switch daemons)."""

    def __init__(self) -> None:
        self._made: dict[tuple[Endpoint, int], docker.DockerClient] = {}

    def __call__(self, ep: Endpoint, timeout: int, ping_timeout: float = PING_TIMEOUT) -> docker.DockerClient:
        c = self._made.get((ep, timeout))
        if c is None:
            c = self._made[(ep, timeout)] = _new_client(ep, timeout, ping_timeout)
        return c

    def cache_clear(self) -> None:
        self._made.clear()


_client_for = _Clients()


def client(timeout: int = CLIENT_TIMEOUT) -> docker.DockerClient:
    """The shared SDK client for :func:`endpoint` (DOCKER_HOST, else the docker context), cached per endpoint."""
    return _client_for(endpoint(), timeout)


def data_root() -> Path | None:
    """The daemon's data root (e.g. /var/lib/docker) when the daemon is on this machine, else None."""
    if not endpoint().local:
        return None
    try:
        root = client().info().get("DockerRootDir")
    except Exception:
        return None
    return Path(root) if root else None


def image_or_none(ref: str) -> Any:
    """The SDK image object for ``ref``, or None when the daemon lacks it."""
    from docker.errors import ImageNotFound

    try:
        return client().images.get(ref)
    except ImageNotFound:
        return None


@contextlib.contextmanager
def removing(container: Container) -> Iterator[Container]:
    """Yield ``container`` and force-remove it afterwards, on errors and Ctrl-C too."""
    try:
        yield container
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)


def tool_labels(kind: str, key: str | None = None, **extra: str) -> dict[str, str]:
    """The labels imageforge puts on what it creates."""
    labels = {LABEL_TOOL: TOOL, LABEL_KIND: kind}
    if key is not None:
        labels[LABEL_RECIPE_KEY] = key
    labels.update(extra)
    return labels
