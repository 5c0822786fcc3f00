"""The server as a process: a target's serving command run on this machine, without Docker (in-place mode).

The container runtime (:mod:`imageforge.serve.spec` + :mod:`imageforge.serve.container`) and this process runtime
serve the same thing: :mod:`imageforge.serve.process_spec` renders the command exactly as the container gets it
(the config file into the run directory, volume targets rewritten to their sources, host and port by the target's
flag names, the caller's environment less imageforge's own venv). Here:

* ``/dev/shm`` must be at least ``run.shm_size`` (the container would get that much);
* :func:`start_process` starts it in a new session (its own process group), logs to
  ``.imageforge/runs/<id>/server.log`` and records pid, process group and ``/proc/<pid>/stat`` start time in
  ``server.json`` beside it (:mod:`imageforge.serve.procfs` reads ``/proc``);
* :func:`wait_process_ready` waits for ``/health`` through :mod:`imageforge.serve.waits`;
* :func:`stop_server` ends the group (TERM, KILL after a grace) only after the pid's start time matches the
  record, so a recycled pid is never signalled.

One server at a time: a recorded server still up, or a busy port, is exit 5 naming the pid.  Nothing here imports
the docker SDK (``tests/unit/test_serve_process.py`` checks it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .. import inplace, settings
from ..errors import ConfigError, InfraError, SmokeError
from ..inplace import Journal
from ..inplace.verify import VERIFY_STEP
from ..manifest.resolve import Resolved, resolve
from ..rundirs import new_run_id, run_dir, runs_dir
from .ports import free_port, port_in_use, port_taken_error
from .process_spec import ProcessSpec, parse_size, process_spec
from .procfs import alive, group_members, port_holder, proc_stat
from .runtime import Prepared, Runtime, sigterm_as_interrupt
from .startfail import exit_hint, start_error
from .waits import Health, Progress, poll_health

Log = Callable[[str], None]

RECORD = "server.json"
LOG_NAME = "server.log"
STOP_GRACE = 15.0  # seconds of SIGTERM before SIGKILL (vLLM with an engine process needs a few)
LOG_TAIL = 50


# --------------------------------------------------------------------------- where and with what


@dataclass
class ProcessRuntime(Runtime):
    """The target's files live under ``root`` and its interpreter is ``python``: served as a process on this
    machine, one server at a time (``--in-place``; see :mod:`imageforge.serve.runtime`).

    :meth:`prepare` puts exactly a resolved step list on the root (through :mod:`imageforge.inplace`'s journal);
    :meth:`restoring` puts the root back as it was when the command began (reverted, or the earlier apply again).
    """

    root: Path = Path("/")
    python: str = "python3"  # the target interpreter (on the caller's PATH unless a path)
    # verify's import check after an apply: off, as an image build leaves it (``build --verify-imports``): every
    # command this runtime serves starts vLLM next, which imports them on its way to /health, and a start that
    # fails names the failing import (serve.startfail); `apply --in-place` checks them itself
    imports: bool = False
    #: ((target, profile, step ids), what the root served then) of this runtime's last apply
    _applied: tuple[tuple[str, str, tuple[str, ...]], str] | None = field(default=None, repr=False, compare=False)

    one_at_a_time: ClassVar[bool] = True

    @property
    def where(self) -> str:
        return f"in place on {self.root}"

    def applied_state(self) -> tuple[str, str, tuple[str, ...]] | None:
        """(target, profile, step ids) the root's journal holds, or None (nothing applied)."""
        journal = Journal.load(self.root)
        if journal is None or not journal.applied():
            return None
        ids = tuple(step for step, _ in journal.applied() if step != VERIFY_STEP)
        return str(journal.get("target")), str(journal.get("profile")), ids

    def prepare(self, resolved: Resolved, *, environ: Mapping[str, str] | None = None, log: Log = print,
                base: bool = False, image: str | None = None, pin: bool = False) -> Prepared:
        """Exactly ``resolved.steps`` applied under the root (none, ``base``: reverted); what the root serves now.

        Steps this runtime applied last, the root unchanged since (its journal's digest the same: a sweep's points
        that differ in serving flags only), are not applied again.
        """
        if image is not None:
            raise ConfigError(f"--in-place serves the files under the root: image {image} does not apply")
        ids = () if base else tuple(s.id for s in resolved.steps)
        wanted = (resolved.target.name, resolved.profile_name, ids)
        if self._applied is not None and self._applied == (wanted, served_identity(self.root)):
            note = "the applied files reused (serving flags only)"
            return Prepared(served=self._applied[1], note=note, line=note, base=base)
        self._applied = None
        t0 = time.monotonic()
        if ids:
            report = inplace.apply(resolved, root=self.root, python=self.python, environ=environ, steps=list(ids),
                                   imports=self.imports, log=_quiet)
            what = "nothing to change" if report.nothing_to_do else "changed"
            log(f"applied {len(ids)} step(s) in place ({what}) in {time.monotonic() - t0:.1f}s: {', '.join(ids)}")
        else:
            done = inplace.revert(self.root, log=_quiet)
            log("no steps: the root reverted as installed" if not done.nothing else "no steps: nothing applied")
        served = served_identity(self.root)
        self._applied = (wanted, served)
        return Prepared(served=served, note=served, line=served, base=base)

    def prepare_failed(self, what: str) -> str:
        return f"the files {what} did not apply in place"

    def serving(self, resolved: Resolved, prepared: Prepared, *, environ: Mapping[str, str] | None = None,
                log: Log = print, run_id: str | None = None, port: int | None = None,
                startup_timeout: float | None = None, host_address: str | None = None,
                wait: bool = True) -> contextlib.AbstractContextManager[ProcessServer]:
        return serving(resolved, self, environ=environ, log=log, run_id=run_id, port=port,
                       startup_timeout=startup_timeout, host_address=host_address, wait=wait)

    def serving_together(self, servings: Sequence[tuple[Resolved, Prepared, str]], *,
                         environ: Mapping[str, str] | None = None, log: Log = print,
                         startup_timeout: float | None = None,
                         host_address: str | None = None) -> contextlib.AbstractContextManager[list[Any]]:
        raise ConfigError(f"{len(servings)} servers at once {self.where}: one server at a time owns the card",
                          hint="a command that compares servers runs them one after the other in place")

    def identity(self, server: Any, prepared: Prepared) -> str:
        return str(server.image)

    @contextlib.contextmanager
    def restoring(self, manifest: Any, *, environ: Mapping[str, str] | None = None,
                  log: Log = print) -> Iterator[None]:
        """Run the block, then put the root back as it was before it (also after an error)."""
        before = self.applied_state()
        try:
            yield
        finally:
            self._applied = None
            if self.applied_state() != before:
                if before is None:
                    inplace.revert(self.root, log=_quiet)
                    log("root reverted as it was before this command (nothing applied)")
                else:
                    target, profile, ids = before
                    again = resolve(manifest, target, profile, environ=environ)
                    inplace.apply(again, root=self.root, python=self.python, environ=environ, steps=ids,
                                  imports=self.imports, log=_quiet)
                    log(f"root re-applied as it was before this command: {target}:{profile} ({len(ids)} steps)")

    def start_detached(self, resolved: Resolved, *, base: bool, port: int | None, timeout: float | None,
                       host_address: str, environ: Mapping[str, str] | None = None,
                       log: Log = print) -> ProcessServer:
        """``run --in-place`` serves the root as applied (``apply --in-place`` changes it; nothing is prepared)."""
        if base:
            raise ConfigError("--in-place serves the files under --root: --base does not apply",
                              hint="`invoke revert` puts the root back as installed; then run --in-place")
        return start_detached(resolved, self, port=port, timeout=timeout, host_address=host_address,
                              environ=environ, log=log)

    def detached_note(self, server: Any) -> str:
        return (f"pid {server.name.removeprefix('pid ')} ({server.image}) is serving; log "
                f"{server.run_dir / 'server.log'}; `imageforge stop --in-place` ends it")

    def stop(self, target: str | None, *, every: bool, root: Path, log: Log = print) -> list[str]:
        return [str(pid) for pid in stop_processes(root, target, log=log)]


def _quiet(_line: str) -> None:
    return None


# --------------------------------------------------------------------------- records


@dataclass
class ProcessServer:
    """A started serving process (the interface smoke/bench use of :class:`imageforge.serve.container.Server`)."""

    popen: subprocess.Popen[bytes] | None
    pid: int
    starttime: int
    run_id: str
    url: str
    host_port: int
    target: str
    profile: str
    image: str  # what is served: "in place: <root> (<journal digest>)"
    run_dir: Path
    started: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    startup_seconds: float | None = None

    @property
    def name(self) -> str:
        return f"pid {self.pid}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    def running(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        return alive(self.pid, self.starttime)

    def logs(self, tail: int | str = LOG_TAIL) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        lines = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return lines if tail == "all" else lines[-int(tail):]

    def save_log(self) -> Path | None:
        return self.log_path if self.log_path.exists() else None

    def describe_state(self) -> str:
        if self.running():
            return f"process {self.pid} running"
        code = self.popen.poll() if self.popen is not None else None
        if code is None:
            return f"process {self.pid} is gone"
        if code < 0:
            return f"process {self.pid} killed by signal {-code}" + (" (SIGKILL: out of memory?)"
                                                                      if code == -signal.SIGKILL else "")
        return f"process {self.pid} exited with code {code}"


def write_record(server: ProcessServer, spec: ProcessSpec, environ: Mapping[str, str], **extra: Any) -> Path:
    path = server.run_dir / RECORD
    payload = {
        "pid": server.pid, "pgid": server.pid, "starttime": server.starttime, "run_id": server.run_id,
        "url": server.url, "port": server.host_port, "target": server.target, "profile": server.profile,
        "served": server.image, "argv": list(spec.argv), "env": spec.changed_env(environ),
        "rewritten": dict(spec.rewritten), "log": str(server.log_path),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def records(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``server.json`` under the run directories of ``root`` not marked stopped, oldest first."""
    out = []
    for path in sorted(runs_dir(root).glob(f"*/{RECORD}")):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if not data.get("stopped"):
                out.append((path, data))
    return out


def running_records(root: Path) -> list[dict[str, Any]]:
    """Recorded servers still up (same pid and start time)."""
    return [data for _, data in records(root) if alive(int(data["pid"]), int(data["starttime"]))]


def mark_stopped(path: Path, how: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        data["stopped"] = how
        data["stopped_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        path.write_text(json.dumps(data, indent=2) + "\n")


def served_identity(root: Path) -> str:
    """What the root serves: the in-place journal's digest, or "no journal" (the root as installed)."""
    journal = root / "var" / "lib" / "imageforge" / "journal.json"
    if not journal.is_file():
        return f"in place: {root} (no journal: as installed)"
    return f"in place: {root} (journal sha256:{hashlib.sha256(journal.read_bytes()).hexdigest()[:16]})"


# --------------------------------------------------------------------------- start, wait, stop


def check_shm(resolved: Resolved, shm: Path = Path("/dev/shm")) -> None:
    """``/dev/shm`` at least ``run.shm_size`` (exit 5 with the mount command otherwise)."""
    if not resolved.run.shm_size:
        return
    want = parse_size(resolved.run.shm_size)
    try:
        st = os.statvfs(shm)
    except OSError as exc:
        raise InfraError(f"{shm} is not there", found=str(exc),
                         expected=f"a tmpfs of at least {resolved.run.shm_size} (run.shm_size)") from None
    have = st.f_blocks * st.f_frsize
    if have < want:
        raise InfraError(
            f"{shm} is {have / 1024**2:.0f} MiB, less than run.shm_size {resolved.run.shm_size}",
            expected=f">= {want} bytes (the container would get --shm-size {resolved.run.shm_size})",
            found=f"{have} bytes",
            hint=f"mount -o remount,size={resolved.run.shm_size} {shm} (as root), or start the box with "
            f"--shm-size {resolved.run.shm_size}",
        )


def refuse_if_busy(root: Path, host: str, port: int | None) -> None:
    """Exit 5 when a recorded server is still up (one at a time) or ``port`` is taken, naming the pid."""
    for data in running_records(root):
        raise InfraError(
            f"an in-place server is still up: pid {data['pid']} ({data['target']}:{data['profile']} on "
            f"{data['url']}, run {data['run_id']})",
            found=f"pid {data['pid']}, started {data.get('started_at')}",
            hint="`invoke stop --in-place` ends it (one server at a time on this machine)",
        )
    if port is not None and port_in_use(port, host):
        raise port_taken_error(port, host, pid=port_holder(port))


def start_process(resolved: Resolved, runtime: ProcessRuntime, *, environ: Mapping[str, str] | None = None,
                  port: int | None = None, run_id: str | None = None, host_address: str | None = None,
                  log: Log = print, record: Mapping[str, Any] | None = None) -> ProcessServer:
    """Render, check (shm, one server, port), start in a new session, record; no waiting."""
    environ = os.environ if environ is None else environ
    host = host_address or settings.host_address(None, environ)
    root = resolved.manifest.root
    if port is not None and not 0 < port < 65536:
        raise ConfigError("--port must be 1-65535", found=str(port))
    refuse_if_busy(root, host, port)
    if port is None:
        port = resolved.run.port if not port_in_use(resolved.run.port, host) else free_port(host)
    check_shm(resolved)
    run_id = run_id or new_run_id()
    directory = run_dir(root, run_id)
    spec = process_spec(resolved, host=host, port=port, run_directory=directory, python=runtime.python,
                        environ=environ)
    directory.mkdir(parents=True, exist_ok=True)
    if spec.config is not None and spec.config_path is not None:
        spec.config_path.write_bytes(spec.config)
    with open(directory / LOG_NAME, "ab") as out:
        try:
            popen = subprocess.Popen(list(spec.argv), env=dict(spec.env), cwd=str(spec.cwd), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise InfraError(f"cannot start {spec.argv[0]}", found=str(exc),
                             hint="check --python and the target's serving.command") from None
    stat = proc_stat(popen.pid)
    server = ProcessServer(popen, popen.pid, stat.starttime if stat else 0, run_id, spec.url, port,
                           resolved.target.name, resolved.profile_name, served_identity(runtime.root), directory)
    write_record(server, spec, environ, root=str(runtime.root), python=runtime.python, **dict(record or {}))
    log(f"started pid {server.pid} ({' '.join(spec.argv[:4])} ...) on {server.url}; log {server.log_path}")
    return server


def wait_process_ready(server: ProcessServer, *, timeout: float, log: Log = print, interval: float = 0.5,
                       resolved: Resolved | None = None) -> float:
    """Poll ``/health`` until 200 (:func:`imageforge.serve.waits.poll_health`: the seconds it took); the process exiting
    (naming the step that wrote the file its traceback goes through) or the timeout raises with its log."""
    progress = Progress(f"waiting for {server.url}/health", log)

    def exited(_last: Health) -> None:
        if server.running():
            return
        progress.done("")
        whole = server.logs("all")
        tail = whole[-LOG_TAIL:]
        raise start_error(
            what=f"{server.target}:{server.profile}", package=resolved.target.package.import_name if resolved else "",
            seconds=time.monotonic() - server.started, state=server.describe_state(),
            expected=f"GET {server.url}/health -> 200", hint=exit_hint(tail, resolved, log=whole), log=whole,
            log_tail=tail, saved=server.log_path, steps=resolved.steps if resolved else ())

    seconds, last = poll_health(server.url, timeout=timeout, interval=interval, started=server.started,
                                check=exited, on_poll=progress.update)
    if seconds is not None:
        server.ready_at = time.monotonic()
        server.startup_seconds = seconds
        progress.done(f"ready: {server.url}/health OK after {seconds:.1f}s")
        return seconds
    progress.done("")
    raise SmokeError(f"the server of {server.target}:{server.profile} was not ready within {timeout:.0f}s",
                     expected=f"GET {server.url}/health -> 200",
                     found=f"{last.short if last else 'no answer yet'}; {server.describe_state()}",
                     hint=f"raise targets.<target>.smoke.startup_timeout if start-up is just slow; full log: "
                     f"{server.log_path}", log_tail=server.logs(LOG_TAIL))


def end_group(pid: int, starttime: int, *, grace: float = STOP_GRACE, popen: subprocess.Popen[bytes] | None = None,
              proc: Path = Path("/proc")) -> str:
    """TERM the process group of ``pid`` (its session leader), KILL what is left after ``grace``; say how it ended.

    Only when ``pid`` still has ``starttime``: a recycled pid is never signalled ("gone").
    """
    if not alive(pid, starttime, proc):
        if popen is not None:
            with contextlib.suppress(Exception):
                popen.wait(timeout=0)
        return "gone"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=0.2)
        else:
            time.sleep(0.2)
        if not alive(pid, starttime, proc) and not group_members(pid, proc):
            return "terminated"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)
    return "killed"


def stop_server(server: ProcessServer, *, log: Log | None = None, grace: float = STOP_GRACE) -> str:
    how = end_group(server.pid, server.starttime, grace=grace, popen=server.popen)
    mark_stopped(server.run_dir / RECORD, how)
    if log is not None:
        log(f"stopped pid {server.pid} ({how}); log {server.log_path}")
    return how


def stop_processes(root: Path, target: str | None = None, *, log: Log = print,
                   grace: float = STOP_GRACE) -> list[int]:
    """``invoke stop --in-place``: end every recorded server still up (of ``target``); their pids.

    A record whose pid is gone or now belongs to another process (start time differs) is marked stale, and
    that process is left alone.  Never touches the Docker engine.
    """
    stopped: list[int] = []
    for path, data in records(root):
        if target and data.get("target") != target:
            continue
        pid, starttime = int(data["pid"]), int(data["starttime"])
        if not alive(pid, starttime):
            mark_stopped(path, "stale: the pid is gone or belongs to another process")
            continue
        how = end_group(pid, starttime, grace=grace)
        mark_stopped(path, how)
        stopped.append(pid)
        log(f"stopped pid {pid} ({data.get('target')}:{data.get('profile')}, run {data.get('run_id')}): {how}")
    if not stopped:
        log("no in-place server is running" + (f" for target {target}" if target else ""))
    return stopped


@contextlib.contextmanager
def serving(resolved: Resolved, runtime: ProcessRuntime, *, startup_timeout: float | None = None, wait: bool = True,
            log: Log = print, environ: Mapping[str, str] | None = None, port: int | None = None,
            run_id: str | None = None, host_address: str | None = None) -> Iterator[ProcessServer]:
    """Start the process server, wait for ``/health``, yield it; always stop it (errors and Ctrl-C included).

    """
    server = start_process(resolved, runtime, environ=environ, port=port, run_id=run_id,
                           host_address=host_address, log=log)
    try:
        with sigterm_as_interrupt():
            if wait:
                wait_process_ready(server, timeout=startup_timeout or resolved.target.smoke.startup_timeout,
                                   log=log, resolved=resolved)
            yield server
    finally:
        stop_server(server, log=log)


def start_detached(resolved: Resolved, runtime: ProcessRuntime, *, port: int | None, timeout: float | None,
                   host_address: str, environ: Mapping[str, str] | None = None, log: Log = print) -> ProcessServer:
    """``invoke run --in-place``: start, wait until ready, leave running (a failed start is stopped again)."""
    server = start_process(resolved, runtime, environ=environ, port=port, host_address=host_address, log=log,
                           record={"started_by": "invoke-run"})
    try:
        wait_process_ready(server, timeout=timeout or resolved.target.smoke.startup_timeout, log=log,
                           resolved=resolved)
    except BaseException:
        stop_server(server, log=log)
        raise
    return server


__all__ = [
    "ProcessRuntime",
    "ProcessServer",
    "check_shm",
    "end_group",
    "records",
    "serving",
    "start_detached",
    "start_process",
    "stop_processes",
    "stop_server",
    "wait_process_ready",
]
