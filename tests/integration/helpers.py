"""Helpers shared by the integration tests (one home for each; import them from here).

* :func:`free_port` -- a free TCP port on 127.0.0.1 (imageforge.serve.ports's own).
* :func:`cpu_base_refs` -- the cpu recipe's computed references: (OS image tag, vLLM base tag).
* :func:`os_image` -- the recipe's OS image, found **by its computed tag**, never by the
  ``org.imageforge.kind=os-base`` label: every image built FROM the OS image inherits that label (a user's
  ``FROM imageforge/os:...``, a dangling layer of a plain ``docker build`` of a submission tree, a test's committed
  probe), so "the newest image with the label" may hold anyone's files.
* :func:`run_in_dir` -- a command in a directory, capturing output, asserting its exit code.
* :func:`sigint_default` -- a ``preexec_fn`` for a child that a test interrupts with SIGINT: Ctrl-C as a terminal
  gives it, whatever the suite was started from (a background job of a non-interactive shell, e.g. ``cmd &`` or
  ``nohup``, inherits SIGINT *ignored*, and Python keeps an ignored SIGINT: the child would never see the Ctrl-C).
* :func:`hooks_for` -- the smoke runner's :class:`ServerHooks` (alive, log tail) of a started server.
* :func:`kill_mid_suite` -- the smoke claim "a server killed mid-suite" run against a server a test has finished
  with (the claim costs no vLLM start of its own): a suite whose first check is a long generation, the
  container killed once it generates; the caller asserts the report (after its ``serving()`` block: removal).
* :func:`labelled` -- the containers (running or not) imageforge labelled, with all of the given labels (whole
  keys, :mod:`imageforge.labels`' constants), on the local daemon or a given client's, made during this session.
* :func:`scratch_dir` -- a new directory for a test's bulk scratch data (a 2.5 GB image tarball, a second daemon's
  data root): in memory (``/dev/shm``) when the machine has room to spare, else under ``/tmp``.
* :func:`this_session` -- the containers of a listing created since this test session began: a test asserting
  "nothing is left" speaks of its own session's, never of an earlier, interrupted run's (a killed suite or daemon
  leaves exited containers with the same labels behind, on a daemon the machine keeps).
* :func:`sdk` -- a docker SDK client of the local daemon (or a host) with a long timeout (no imageforge code on
  that side); :func:`one_maker` -- the lock under which a shared fixture image is made.
* :func:`plain_docker_build` -- ``docker build`` of a directory through the SDK only (a submission tree, as the
  platform builds it): (image id or None, build log lines).
* :func:`remove_tags` -- every tag of some repositories removed (conftest's ``remove_images`` after a test; a module
  fixture after its module).
* :func:`write_cpu_variant` -- a manifest whose cpu target is the repository's plus extra steps, under its own image
  name (conftest's ``cpu_variant`` writes one per test; a module fixture writes its own).
"""

from __future__ import annotations

import contextlib
import datetime
import re
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import yaml

from imageforge.serve.ports import free_port
from imageforge.smoke import ServerHooks, SmokeReport, load_suite, run_suite
from tests.cli import merged_environ

REPO = Path(__file__).resolve().parents[2]
CPU_RECIPE = REPO / "images" / "cpu"

__all__ = ["REPO", "cpu_base_refs", "free_port", "hooks_for", "kill_mid_suite",
           "one_maker", "os_image", "plain_docker_build", "run_in_dir", "sdk", "sigint_default"]


def sigint_default() -> None:
    """In the child before exec: SIGINT back to its default action (see the module)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cpu_base_refs() -> tuple[str, str]:
    """(OS image tag, vLLM base image tag) the cpu recipe computes (``invoke base --target cpu`` makes them)."""
    from imageforge.base.images import base_image_status

    status = base_image_status(CPU_RECIPE)
    return status.os_ref, status.ref


def os_image(c: docker.DockerClient, *, or_vllm_base: bool = False) -> Any:
    """The cpu recipe's OS image by reference; ``or_vllm_base``: its vLLM base when the OS image was removed."""
    os_ref, vllm_ref = cpu_base_refs()
    for ref in (os_ref, vllm_ref) if or_vllm_base else (os_ref,):
        try:
            return c.images.get(ref)
        except docker.errors.ImageNotFound:
            continue
    raise RuntimeError(f"no {os_ref} on the daemon: run `invoke base --target cpu`")


def run_in_dir(argv: Sequence[str], cwd: Path, *, expect: int | None = 0, timeout: float = 600,
               env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=merged_environ(env))
    if expect is not None and proc.returncode != expect:
        raise AssertionError(f"{' '.join(argv)} (in {cwd}) -> {proc.returncode}, expected {expect}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def hooks_for(server: Any) -> ServerHooks:
    """The smoke runner's hooks for a started server (a container's :class:`Server`)."""
    return ServerHooks(alive=lambda: None if server.running() else server.describe_state(),
                       log_tail=lambda n: server.logs(n))


KILL_SUITE = textwrap.dedent("""\
    version: 1
    setup:
      - {id: models, request: {endpoint: /v1/models}, bind: {model: "$.data[0].id"}}
    checks:
      - id: long-generation
        serial: true
        request:
          endpoint: /v1/completions
          body: {model: "${model}", prompt: "long", max_tokens: 1900, ignore_eos: true, n: 16}
          timeout: 120
        expect: {status: 200}
      - {id: after-1, request: {endpoint: /health}, expect: {status: 200}}
      - {id: after-2, request: {endpoint: /v1/models}, expect: {status: 200}}
      - {id: after-3, request: {endpoint: /version}, expect: {status: 200}}
    """)


def kill_mid_suite(server: Any, suite_dir: Path, echo: Callable[[str], None]) -> SmokeReport:
    """Run :data:`KILL_SUITE` against ``server`` (a running container's :class:`Server`, results in its run dir),
    killing its container once the long generation runs; the report (the caller asserts it)."""
    import httpx

    suite_path = suite_dir / "kill.yaml"
    suite_path.write_text(KILL_SUITE)

    def kill_when_generating() -> None:
        # The gauge can lag on a quiet machine; 16 x 1900 tokens take far longer than this deadline (4 x 1900
        # finished inside it once on an idle machine, and the suite passed unkilled).
        deadline = time.monotonic() + 3
        with httpx.Client(timeout=5) as http:  # one client: each new one builds an SSL context (~25 ms of CPU)
            while time.monotonic() < deadline:
                metrics = http.get(f"{server.url}/metrics").text
                if re.search(r"^vllm:num_requests_running\{[^}]*\} [1-9]", metrics, re.M):
                    break
                time.sleep(0.1)
        server.container.kill()

    killer = threading.Thread(target=kill_when_generating, daemon=True)
    killer.start()
    report = run_suite(load_suite(suite_path), server.url, run_dir=server.run_dir, hooks=hooks_for(server),
                       echo=echo, live=False)
    killer.join(timeout=60)
    return report


def labelled(labels: Mapping[str, str] | None = None, *, c: docker.DockerClient | None = None) -> list[Any]:
    """Containers (running or not) carrying ``org.imageforge.tool=imageforge`` and every one of ``labels``, on the
    local daemon (imageforge's client) or ``c``'s."""
    from imageforge.docker_engine import client
    from imageforge.labels import L_TOOL, TOOL

    wanted = [f"{L_TOOL}={TOOL}", *(f"{k}={v}" for k, v in (labels or {}).items())]
    return this_session((c or client()).containers.list(all=True, ignore_removed=True, filters={"label": wanted}))


SHM = Path("/dev/shm")
GIB = 1 << 30


def mem_available() -> int:
    """The kernel's estimate of the memory available to new work (``MemAvailable``), in bytes; 0 when unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def scratch_dir(prefix: str, *, needs: int, spare: int = 6 * GIB) -> Path:
    """A new directory for ``needs`` bytes a test writes and reads back at once (an exported image's tarball, the
    data root of a daemon that loads it): under ``/dev/shm`` when it has the room and the machine's available memory
    covers them with ``spare`` left for the servers beside, else under ``/tmp``. On this machine's disk the export's
    ``docker load`` of the cpu image took 49 s and its test 117 s; in memory 29 s and 75 s (2026-12-05, alone)."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage(SHM).free >= needs and mem_available() >= needs + spare:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=SHM))
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def created_at(container: Any) -> float:
    """A container's creation time (epoch seconds) from its inspection (``2026-12-05T10:05:52.353230575Z``)."""
    stamp = str(container.attrs["Created"]).rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    seconds = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc).timestamp()
    return seconds + float(f"0.{fraction or 0}")


def this_session(containers: Sequence[Any]) -> list[Any]:
    """The ones created since this test session started (tests/conftest.py's ``session_start``)."""
    from tests.conftest import session_start

    start = session_start()
    return [x for x in containers if created_at(x) >= start]


def sdk(host: str | None = None) -> docker.DockerClient:
    """A docker SDK client of ``host`` (default: the local daemon), with a build's long timeout."""
    return docker.DockerClient(base_url=host or "unix:///var/run/docker.sock", timeout=900)


def one_maker(name: str) -> Any:
    """The machine-wide lock under which a shared fixture image ``name`` is made: the other worker of ``invoke
    test`` (or another session) waits, then finds it, instead of committing a second one that moves the tag."""
    from filelock import FileLock

    return FileLock(f"{tempfile.gettempdir()}/imageforge-{name}.lock")


def plain_docker_build(tree: Path) -> tuple[str | None, list[str]]:
    """``docker build`` of the tree, only the docker SDK: (image id or None, build log lines)."""
    lines: list[str] = []
    try:
        image, stream = sdk().images.build(path=str(tree), rm=True, forcerm=True)
        for chunk in stream:
            lines.extend(str(chunk.get("stream", "")).splitlines())
        return str(image.id), lines
    except docker.errors.BuildError as exc:
        for chunk in exc.build_log:
            lines.extend(str(chunk.get("stream", "") or chunk.get("error", "")).splitlines())
        return None, lines


def _copy_sources(target: dict[str, Any], root: Path) -> None:
    """Copy every file or folder a step or the smoke section reads into ``root`` (same relative path)."""
    steps = [*target.get("steps", []), *(s for p in target.get("profiles", {}).values() for s in p.get("steps", []))]
    for rel in [str(s["directory"]) for s in steps if "directory" in s and "$" not in str(s["directory"])]:
        if not (root / rel).exists():  # a step's host folder (a native step's pinned extensions)
            shutil.copytree(REPO / rel, root / rel)
    paths: list[str] = [str(step["source"]) for step in steps if "source" in step]
    if "suite" in target.get("smoke", {}):
        paths.append(str(target["smoke"]["suite"]))
    for rel in paths:
        src = REPO / rel
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(src, dest)


def write_cpu_variant(root: Path, image: str, steps: Sequence[Mapping[str, Any]] = (),
                      files: Mapping[str, str] | None = None) -> Path:
    """``root/build.yaml``: the repository's cpu target under ``image`` with ``steps`` added after its own and
    ``files`` (relative to ``root``) written; what a step or the suite reads and ``files`` does not give is copied
    from the repository. The shared steps reuse the real target's cached layers; the volumes' sources are the
    repository's (the same run spec as the session's servers, for --reuse-servers)."""
    data = yaml.safe_load((REPO / "build.yaml").read_text())
    target = data["targets"]["cpu"]
    target["image"] = image
    target["base"]["recipe"] = str((REPO / target["base"]["recipe"]).resolve())
    for volume in target.get("run", {}).get("volumes", []):  # the repository's tiny model, not a copy per test:
        if volume.get("type", "bind") == "bind" and not Path(volume["source"]).is_absolute():  # the same run spec
            volume["source"] = str(REPO / volume["source"])  # as the session's servers (--reuse-servers)
    target["steps"] = [*target.get("steps", []), *(dict(s) for s in steps)]
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _copy_sources(target, root)  # what `files` did not provide comes from the repository
    manifest = {"version": 1, "default_target": "cpu", "targets": {"cpu": target}}
    path = root / "build.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def remove_tags(repos: Sequence[str]) -> None:
    """Every tag of these repositories removed from the local daemon (the images go when nothing else tags them)."""
    from imageforge.docker_engine import client

    for repo in repos:
        for image in client().images.list(name=repo):
            for tag in image.tags:
                if tag.rsplit(":", 1)[0] == repo:
                    with contextlib.suppress(Exception):
                        client().images.remove(tag)
