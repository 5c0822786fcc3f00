"""Start a target's serving container, wait until it is ready, stop it again.

* :func:`start_server` creates the container :func:`imageforge.serve.spec.container_spec`
  describes (the built ``<image>:<profile>``, or the base image with ``base=True``) and starts it.
* The container port is published on 127.0.0.1 only (or ``--host-address``), on ``port`` or on a
  free port.
* :func:`wait_ready` polls ``GET /health`` with a progress line; a container that exits or a
  timeout raises with the state, the exit code, the last 50 log lines and a hint.
* :func:`serving` is the context manager the smoke runner and the tests use: the container is
  always stopped and removed (errors and Ctrl-C included), its log kept in the run directory.
* :func:`start_detached` is ``invoke run``: start, wait, leave running.
* :func:`stop_servers` removes what ``invoke run`` left running, found by label.
* :class:`ContainerRuntime` is the container implementation of :class:`imageforge.serve.runtime.Runtime`: its
  ``prepare`` builds (or reuses) the image; nothing here builds while serving.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from typing_extensions import Unpack

from .. import settings
from ..base import base_reference
from ..build import build_target
from ..docker_engine import (
    client,
    daemon_errors,
    endpoint,
    ensure_daemon,
    explanation,
    image_or_none,
)
from ..docker_engine.forward import SSHForward, end_recorded
from ..errors import ConfigError, InfraError, SmokeError
from ..labels import L_KIND, L_RUN, L_RUN_SPEC, L_STARTED_BY, L_TARGET, L_TOOL, TOOL
from ..manifest.resolve import Resolved
from ..rundirs import new_run_id, run_dir
from ..verify import record_started
from .ports import default_host_address, free_port, port_in_use, port_taken_error
from .runtime import Prepared, Runtime, sigterm_as_interrupt
from .spec import KIND_SERVER, container_port, container_spec, run_spec_digest
from .startfail import exit_hint, start_error
from .waits import Health, Progress, poll_health

Log = Callable[[str], None]

STARTED_BY_RUN = "invoke-run"
LOG_TAIL = 50
STOP_TIMEOUT = 5  # seconds of SIGTERM before SIGKILL (vLLM stops in ~1.3 s once serving)


# --------------------------------------------------------------------------- the server


@dataclass
class Server:
    """A started serving container."""

    container: Any
    run_id: str
    url: str
    host_port: int
    target: str
    profile: str
    image: str
    run_dir: Path
    started: float = field(default_factory=time.monotonic)
    forward: SSHForward | None = None  # ssh:// daemon: the ssh -L forward that makes ``url`` reach the port
    ready_at: float | None = None
    startup_seconds: float | None = None
    image_labels: Mapping[str, str] = field(default_factory=dict)  # the served image's (its verify facts)
    base: bool = False  # the base image with the serving config mounted: none of the steps is in it
    reused: bool = False  # a running server of the same run spec (--reuse-servers): not started, not removed here

    @property
    def name(self) -> str:
        return str(self.container.name)

    def state(self) -> dict[str, Any]:
        """The container's State (empty when it is gone)."""
        try:
            self.container.reload()
        except Exception:
            return {}
        state: dict[str, Any] = self.container.attrs.get("State") or {}
        return state

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def logs(self, tail: int | str = LOG_TAIL) -> list[str]:
        try:
            raw = self.container.logs(stdout=True, stderr=True, tail=tail)
        except Exception:
            return []
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]

    def save_log(self) -> Path | None:
        """Write the whole container log to ``<run dir>/server.log``."""
        try:
            raw = self.container.logs(stdout=True, stderr=True)
        except Exception:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "server.log"
        path.write_bytes(raw if isinstance(raw, bytes) else str(raw).encode())
        return path

    def describe_state(self) -> str:
        state = self.state()
        if not state:
            return "container is gone"
        parts = [f"status {state.get('Status')}"]
        if not state.get("Running"):
            parts.append(f"exit code {state.get('ExitCode')}")
        if state.get("OOMKilled"):
            parts.append("killed for memory (OOMKilled)")
        if state.get("Error"):
            parts.append(f"error {state.get('Error')}")
        return ", ".join(parts)


def image_for(resolved: Resolved, environ: Mapping[str, str], log: Log, *, base: bool) -> str:
    """The image to run when none is given: the base image, or ``<image>:<profile>`` as it is (never built here:
    :meth:`ContainerRuntime.prepare` builds)."""
    if base:
        with daemon_errors("finding the base image"):
            return base_reference(resolved, environ, log, make=True).ref
    tag = f"{resolved.target.image}:{resolved.profile_name}"
    if image_or_none(tag) is None:
        raise InfraError(f"image {tag} does not exist",
                         hint=f"build it: invoke build --target {resolved.target.name} "
                         f"--profile {resolved.profile_name}")
    return tag


class StartOptions(TypedDict, total=False):
    """How :func:`start_server` starts a server (every key optional); :func:`serving` passes them on."""

    environ: Mapping[str, str] | None  # default os.environ
    base: bool  # serve the base image with the serving config mounted, not the built image
    port: int | None  # the host port (default: a free one)
    image: str | None  # serve this image instead
    run_id: str | None
    labels: Mapping[str, str] | None  # extra container labels
    host_address: str | None  # where the port is published and reached (default: from environ)
    detach_forward: bool  # ssh:// daemon: the ssh -L forward outlives this process (`invoke run`)
    port_is_preference: bool  # reusing, a server on another port will do (`invoke run`: the target's run.port)


def start_server(resolved: Resolved, *, log: Log = print, **options: Unpack[StartOptions]) -> Server:
    """Create and start the serving container (no waiting). Raises InfraError for port/daemon trouble.

    The port is published on ``host_address`` of the Docker host (default 127.0.0.1) and the server's URL
    uses the same address. With a local daemon a free port is chosen here; with a remote ``DOCKER_HOST`` the
    daemon picks one and it is read back.
    """
    environ = options.get("environ")
    environ = os.environ if environ is None else environ
    base, port, image = options.get("base", False), options.get("port"), options.get("image")
    run_id, labels = options.get("run_id"), options.get("labels")
    host_address = options.get("host_address") or default_host_address(environ)
    ensure_daemon(log=log)
    run_id = run_id or new_run_id()
    local = endpoint().local  # from the client's base URL: a socket or loopback TCP is this machine
    reuse = settings.reuse_servers_wanted(False, environ)
    if port is not None:
        if not 0 < port < 65536:
            raise ConfigError("--port must be 1-65535", found=str(port))
        if local and not reuse and port_in_use(port, host_address):  # reusing, the port may be the reused one's
            raise port_taken_error(port, host_address)
    ref = image or image_for(resolved, environ, log, base=base)
    cli = client()
    import docker.errors

    try:
        served = cli.images.get(ref)
    except docker.errors.ImageNotFound:
        raise InfraError(f"image {ref} does not exist", hint=f"invoke build --target {resolved.target.name}") from None
    config = served.attrs.get("Config") or {}
    host_port: int | None = port if port is not None else (free_port(host_address) if local else None)
    kwargs = container_spec(resolved, ref, host_port=host_port, run_id=run_id, environ=environ, base=base,
                            entrypoint=config.get("Entrypoint"), host_address=host_address)
    digest = run_spec_digest(str(served.id), kwargs)
    image_name = kwargs.pop("image")
    kwargs.pop("detach")
    kwargs["labels"] = {**kwargs["labels"], **(labels or {}), L_RUN_SPEC: digest}
    container = None
    if reuse:
        container = reusable_server(digest, port=None if options.get("port_is_preference") else port, log=log)
    reused = container is not None
    if container is None:
        container = _create_and_start(cli, image_name, kwargs, host_port, host_address)
    if host_port is None or reused:
        host_port = published_port(container, container_port(resolved))
    url, forward = f"http://{host_address}:{host_port}", None
    ep = endpoint()
    if ep.is_ssh:  # the port is on the ssh host: reach it through a forward of our own
        forward = SSHForward(ep.host, host_address, host_port)
        try:
            forward.open(detach=bool(options.get("detach_forward")))
        except BaseException:
            if not reused:
                with contextlib.suppress(Exception):
                    container.remove(force=True, v=True)
            raise
        url = forward.url
        log(f"ssh forward {forward.url} -> {host_address}:{host_port} on {ep.host} (ssh pid {forward.pid})")
    server = Server(
        container=container,
        run_id=run_id,
        url=url,
        forward=forward,
        host_port=host_port,
        target=resolved.target.name,
        profile="base" if base else resolved.profile_name,
        image=ref,
        run_dir=run_dir(resolved.manifest.root, run_id),
        image_labels=dict(config.get("Labels") or {}),
        base=base,
        reused=reused,
    )
    if reused:
        log(f"reusing {server.name} on {server.url}: it serves {ref} with the same run options "
            "(--reuse-servers; left running afterwards)")
        return server
    log(f"started {server.name} from {ref} on {server.url} (container port {container_port(resolved)})")
    return server


def _create_and_start(cli: Any, image: str, kwargs: dict[str, Any], host_port: int | None, host_address: str) -> Any:
    """Create and start the serving container; a port another process took meanwhile is a clean error."""
    import docker.errors

    with daemon_errors("creating the serving container"):
        container = cli.containers.create(image, **kwargs)
    with daemon_errors("starting the serving container", hint="check run options (devices, gpus, shm_size) in the "
                       "manifest"):
        try:
            container.start()
        except docker.errors.APIError as exc:
            text = explanation(exc)
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
            if "port is already allocated" in text or "address already in use" in text.lower():
                raise port_taken_error(host_port or 0, host_address) from None
            raise
    return container


def reusable_server(digest: str, *, port: int | None = None, log: Log = print) -> Any | None:
    """A running server container labelled with ``digest`` (:func:`imageforge.serve.spec.run_spec_digest`), the
    oldest first; with ``port``, only one published on it. None when there is none."""
    with daemon_errors("listing running servers"):
        found = client().containers.list(ignore_removed=True, filters={
            "status": "running", "label": [f"{L_TOOL}={TOOL}", f"{L_KIND}={KIND_SERVER}", f"{L_RUN_SPEC}={digest}"]})
    for container in sorted(found, key=lambda c: str(c.attrs.get("Created", ""))):
        if port is None:
            return container
        bindings = (container.attrs.get("HostConfig", {}).get("PortBindings") or {}).values()
        if any(str(b.get("HostPort")) == str(port) for binding in bindings for b in binding or []):
            return container
        log(f"not reusing {container.name}: it is published on another port than --port {port}")
    return None


def published_port(container: Any, cport: int) -> int:
    """The host port the daemon picked for ``cport`` (after start)."""
    container.reload()
    bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{cport}/tcp") or []
    for binding in bindings:
        if binding.get("HostPort"):
            return int(binding["HostPort"])
    raise InfraError(f"the daemon published no host port for container port {cport}",
                     found=json.dumps(bindings))


def wait_ready(
    server: Server,
    *,
    timeout: float,
    log: Log = print,
    interval: float = 0.5,
    resolved: Resolved | None = None,
    progress_stream: Any = None,
) -> float:
    """Poll ``GET /health`` until 200 (:func:`imageforge.serve.waits.poll_health`); return the seconds it took.

    The container exiting raises SmokeError (or InfraError when it was killed for memory), naming the step that
    wrote the file its traceback goes through (:mod:`imageforge.serve.startfail`); a timeout raises SmokeError.
    Both carry the state, the last 50 log lines and a hint. Ready: the served content's imports passed (the
    server imported them), recorded as verify's fact (:func:`imageforge.verify.record_started`).
    """
    progress = Progress(f"waiting for {server.url}/health", log, stream=progress_stream)
    t0 = server.started

    def exited(_last: Health) -> None:
        state = server.state()
        if state.get("Running"):
            return
        progress.done("")
        whole = server.logs("all")  # once: the tail is its end (the daemon streams the log again for save_log)
        tail = whole[-LOG_TAIL:]
        with_steps = None if server.base else resolved  # the base image holds none of the steps' files
        raise start_error(
            what=f"{server.target}:{server.profile}", package=resolved.target.package.import_name if resolved else "",
            seconds=time.monotonic() - t0, state=server.describe_state(), expected=f"GET {server.url}/health -> 200",
            hint=exit_hint(tail, with_steps, log=whole), log=whole, log_tail=tail, saved=server.save_log(),
            steps=with_steps.steps if with_steps else (),
            error_cls=InfraError if state.get("OOMKilled") else SmokeError)

    seconds, last = poll_health(server.url, timeout=timeout, interval=interval, started=t0, check=exited,
                                on_poll=progress.update)
    if seconds is not None:
        server.ready_at = time.monotonic()
        if server.reused:  # up before this use: no start-up time of its own to report
            progress.done(f"ready: {server.url}/health OK ({server.name} reused)")
            return seconds
        server.startup_seconds = seconds
        progress.done(f"ready: {server.url}/health OK after {seconds:.1f}s")
        content = record_started(server.image_labels)
        if content is not None:
            log(f"imports of {server.image} passed at this start: content {content[:12]} recorded as verified")
        return seconds
    progress.done("")
    tail = server.logs(LOG_TAIL)
    saved = server.save_log()
    raise SmokeError(
        f"the server of {server.target}:{server.profile} was not ready within {timeout:.0f}s",
        expected=f"GET {server.url}/health -> 200",
        found=f"{last.short if last else 'no answer yet'}; container {server.describe_state()}",
        hint="raise targets.<target>.smoke.startup_timeout if start-up is just slow"
        + (f"; full log: {saved}" if saved else ""),
        log_tail=tail,
    )


def remove_server(server: Server, *, log: Log | None = None, keep_log: bool = True) -> None:
    """Stop and remove the container (and its anonymous volumes); keep its log in the run dir. A reused server
    (``--reuse-servers``) is left running: only its log is kept and this use's ssh forward closed."""
    if keep_log:
        with contextlib.suppress(Exception):
            server.save_log()
    if server.reused:
        if server.forward is not None:
            server.forward.close()
        if log is not None:
            log(f"left {server.name} running (reused)")
        return
    with contextlib.suppress(Exception):
        server.container.stop(timeout=STOP_TIMEOUT)
    with contextlib.suppress(Exception):
        server.container.remove(force=True, v=True)
    if server.forward is not None:
        server.forward.close()
    if log is not None:
        log(f"removed {server.name}")


@contextlib.contextmanager
def serving(resolved: Resolved, *, startup_timeout: float | None = None, wait: bool = True, log: Log = print,
            **start: Unpack[StartOptions]) -> Iterator[Server]:
    """Start the target's server (``start``: :func:`start_server`'s options), wait until ``/health`` answers,
    yield it; always stop + remove it."""
    server = start_server(resolved, log=log, **start)
    try:
        with sigterm_as_interrupt():
            if wait:
                wait_ready(server, timeout=startup_timeout or resolved.target.smoke.startup_timeout, log=log,
                           resolved=resolved)
            yield server
    finally:
        remove_server(server, log=log)


def start_detached(resolved: Resolved, *, base: bool, port: int | None, timeout: float | None,
                   host_address: str, image: str | None = None, log: Log = print) -> Server:
    """``invoke run``: start, wait until ready, leave running. A failed start is removed again.

    Without ``port`` (and with a local daemon) the target's ``run.port`` is used when it is free.
    """
    preference = port is None
    if port is None and endpoint().local:
        configured = resolved.run.port
        port = None if port_in_use(configured, host_address) else configured
        if port is None:
            log(f"port {configured} is taken: picking a free one")
    server = start_server(resolved, base=base, image=image, port=port, log=log, labels={L_STARTED_BY: STARTED_BY_RUN},
                          host_address=host_address, detach_forward=True, port_is_preference=preference)
    try:
        wait_ready(server, timeout=timeout or resolved.target.smoke.startup_timeout, log=log, resolved=resolved)
    except BaseException:
        remove_server(server, log=log)
        raise
    if server.forward is not None:  # ssh:// daemon: the forward stays up with the server; `stop` ends it
        server.forward.record(forward_record(server.run_id))
    return server


def forward_record(run_id: str) -> Path:
    """Where ``run`` records the ssh forward of a detached server (pid + start time), for ``stop``."""
    return settings.cache_dir() / "forwards" / f"{run_id}.json"


def list_servers(target: str | None = None, *, every: bool = False) -> list[Any]:
    """Server containers ``invoke run`` started (``every``: also those of smoke runs and tests)."""
    filters = [f"{L_TOOL}={TOOL}", f"{L_KIND}={KIND_SERVER}"]
    if not every:
        filters.append(f"{L_STARTED_BY}={STARTED_BY_RUN}")
    if target:
        filters.append(f"{L_TARGET}={target}")
    # ignore_removed: another process may remove a listed container before the SDK inspects it
    return list(client().containers.list(all=True, ignore_removed=True, filters={"label": filters}))


def stop_servers(target: str | None = None, *, every: bool = False, log: Log = print) -> list[str]:
    """Stop and remove the server containers ``invoke run`` started (of ``target``); return their names.

    ``every`` also removes servers of smoke runs and tests (normally removed by their own run).
    """
    ensure_daemon(log=log)
    names: list[str] = []
    for container in list_servers(target, every=every):
        with contextlib.suppress(Exception):
            container.stop(timeout=STOP_TIMEOUT)
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
        run_id = (container.labels or {}).get(L_RUN)
        ended = end_recorded(forward_record(run_id)) if run_id else None
        if ended is not None:
            log(f"closed the ssh forward of {container.name} (pid {ended})")
        names.append(str(container.name))
        log(f"removed {container.name}")
    if not names:
        log("no imageforge server containers" + (f" of target {target}" if target else ""))
    return names


def build_note(steps: Sequence[Any]) -> str:
    """``'1 of 10 layers built (serving-config)'`` from a BuildResult's steps."""
    built = [s.id for s in steps if s.status != "HIT"]
    if not built:
        return f"0 of {len(steps)} layers built (all cached)"
    return f"{len(built)} of {len(steps)} layers built ({', '.join(built)})"


@dataclass(frozen=True)
class ContainerRuntime(Runtime):
    """The target served from its image in a container (see :mod:`imageforge.serve.runtime`)."""

    one_at_a_time: ClassVar[bool] = False

    @property
    def where(self) -> str:
        return "in Docker containers"

    def prepare(self, resolved: Resolved, *, environ: Mapping[str, str] | None = None, log: Log = print,
                base: bool = False, image: str | None = None, pin: bool = False) -> Prepared:
        """The image: ``image`` as given, the base image (``base``: found or made, the serving config mounted at
        the start), else built (or reused) from ``resolved``."""
        environ = os.environ if environ is None else environ
        if image is not None:
            return Prepared(served=image, note=f"image {image}", line=f"image {image}", base=base)
        if base:
            ref = image_for(resolved, environ, log, base=True)
            return Prepared(served=ref, note=f"base image {ref}", line=f"base image {ref}", base=True)
        result = build_target(resolved, environ=environ, echo=log)
        note = build_note(result.steps)
        return Prepared(served=result.image_id if pin else str(result.tags[0]), note=note, line=f"build: {note}",
                        image_id=result.image_id, built=result.built, layers=len(result.steps))

    def prepare_failed(self, what: str) -> str:
        return f"the image {what} did not build"

    def serving(self, resolved: Resolved, prepared: Prepared, *, environ: Mapping[str, str] | None = None,
                log: Log = print, run_id: str | None = None, port: int | None = None,
                startup_timeout: float | None = None, host_address: str | None = None,
                wait: bool = True) -> contextlib.AbstractContextManager[Server]:
        return serving(resolved, environ=environ, base=prepared.base, image=prepared.served, run_id=run_id,
                       port=port, startup_timeout=startup_timeout, log=log, host_address=host_address, wait=wait)

    @contextlib.contextmanager
    def serving_together(self, servings: Sequence[tuple[Resolved, Prepared, str]], *,
                         environ: Mapping[str, str] | None = None, log: Log = print,
                         startup_timeout: float | None = None,
                         host_address: str | None = None) -> Iterator[list[Server]]:
        environ = os.environ if environ is None else environ
        started: list[Server] = []
        try:
            with sigterm_as_interrupt():
                for resolved, prepared, run_id in servings:
                    started.append(start_server(resolved, environ=environ, base=prepared.base,
                                                image=prepared.served or None, run_id=run_id, log=log,
                                                host_address=host_address))
                for (resolved, _prepared, _run_id), server in zip(servings, started, strict=True):
                    wait_ready(server, timeout=startup_timeout or resolved.target.smoke.startup_timeout, log=log,
                               resolved=resolved)
                yield started
        finally:
            for server in started:
                remove_server(server, log=log)

    def identity(self, server: Any, prepared: Prepared) -> str:
        found = image_or_none(prepared.served or server.image)
        return str(getattr(found, "id", None) or prepared.served or server.image)

    @contextlib.contextmanager
    def restoring(self, manifest: Any, *, environ: Mapping[str, str] | None = None,
                  log: Log = print) -> Iterator[None]:
        yield  # an image is never changed by serving it: nothing to put back

    def start_detached(self, resolved: Resolved, *, base: bool, port: int | None, timeout: float | None,
                       host_address: str, environ: Mapping[str, str] | None = None, log: Log = print) -> Server:
        prepared = self.prepare(resolved, environ=environ, log=log, base=base)
        return start_detached(resolved, base=base, image=prepared.served, port=port, timeout=timeout,
                              host_address=host_address, log=log)

    def detached_note(self, server: Any) -> str:
        return f"container {server.name} ({server.image}) is serving; `imageforge stop` removes it"

    def stop(self, target: str | None, *, every: bool, root: Path, log: Log = print) -> list[str]:
        return stop_servers(target, every=every, log=log)
