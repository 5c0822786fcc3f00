"""Shared fixtures for integration tests on the real Docker daemon.

* ``cpu_server`` -- ONE vLLM server of the ``cpu`` target (profile conservative), built and
  started once per test session and always removed at the end. Each vLLM start costs 30-50 s
  on 2 cores, so every test that only needs *a* working server shares this one. It serves the
  shipped image exactly as ``equiv --against base`` serves its candidate (``cpu_equiv_side``: float32,
  a serving-config layer tagged ``imageforge/cpu-equiv:conservative``), so that test_forensics_run's
  equiv of the shipped image compares it against ``cpu_base_run`` without a start of its own.
* ``cpu_variant`` -- writes a manifest into a tmp dir whose ``cpu`` target is the repository's
  plus extra steps (a broken overlay, a bad patch ...), under its own image name; the shared
  steps reuse the cached layers of the real target.
* ``invoke_cli`` -- runs ``imageforge ARGS`` (in this process; ``process=True``: a child) and returns (exit
  code, output, stdout).
* ``cpu_base_run`` -- ``imageforge run --target cpu --base --set dtype=float32`` on a free port, started on first
  use (:meth:`RunBase.up`) and left running: the cpu base image serving the cpu config in float32, i.e.
  ``equiv --against base``'s reference (test_forensics_run's equiv tests compare against its URL) and the
  ``run --base`` that test_run checks and removes with ``stop``. Stopped at the session's end if still up.
* ``cpu_submission`` -- the submission tree of the cpu target's ``aggressive`` profile, built twice: by imageforge
  and by a plain ``docker build`` of the tree (docker SDK only), once per session: test_submission compares their
  filesystems, test_image_contract starts the plain one as computility-run.yaml says (the one vLLM start for the
  image contract and the submission's dummy suite). The plain image is removed at the session's end.
* ``box`` -- ONE in-place box per test session (:mod:`tests.integration.box_fixture`: a container of the cpu base,
  no network, no Docker socket, imageforge installed offline into its own venv), used in turn by the files of the
  in-place group (tests/conftest.py's ``VLLM_INPLACE``, one worker, file by file): test_inplace_box applies and
  reverts (the box left as it was), test_inplace_serve serves in place (reverted again at its end), test_native
  builds the native step in it last. Removed at the session's end.

Other test modules may add fixtures here (each listed above). Helpers that are not fixtures (free port, the cpu
base's references, the OS image by its computed tag, run in a directory, invoke) are in ``helpers.py``; the
session-wide "N vLLM starts" count is ``tests/conftest.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli import imageforge
from tests.integration import helpers

REPO = helpers.REPO


def _log(line: str) -> None:
    print(line, flush=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """forge_fixtures' leftovers removed in the session, where an xdist worker still has time (see there)."""
    made = sys.modules.get("tests.integration.forge_fixtures")
    if made is not None:
        made.session_cleanup()


@pytest.fixture(scope="session")
def box(docker_ready: None) -> Iterator[Any]:
    """The session's in-place box (see the module; tests.integration.box_fixture.Box)."""
    from tests.integration.box_fixture import make_box

    try:
        made = make_box()
    except FileNotFoundError as exc:  # the cpu base image or the tiny model is not there
        pytest.skip(str(exc))
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="session")
def docker_ready() -> None:
    from imageforge.docker_engine import ensure_daemon

    ensure_daemon(start=True, log=_log)  # the test set-up may start one (as `invoke test` does)


@pytest.fixture(scope="session")
def cpu_resolved(docker_ready: None) -> Any:
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve

    return resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ=os.environ)


@pytest.fixture(scope="session")
def cpu_equiv_side(cpu_resolved: Any) -> Any:
    """``equiv --against base``'s candidate for the shipped cpu image (imageforge.equiv.runner.Side): the
    conservative profile with ``dtype`` float32, its images tagged ``imageforge/cpu-equiv``."""
    from imageforge.equiv.runner import sides

    return sides(cpu_resolved, "base", dtype="float32")[0]


@pytest.fixture(scope="session")
def cpu_server(cpu_equiv_side: Any) -> Iterator[Any]:
    """The session's one running cpu server (imageforge.serve.container.Server): ``cpu_equiv_side`` served, i.e.
    the shipped image in float32 (see the module); removed when the session ends."""
    from imageforge.serve.container import ContainerRuntime

    runtime = ContainerRuntime()
    prepared = runtime.prepare(cpu_equiv_side.resolved, environ=os.environ, log=_log)  # built, or reused
    with runtime.serving(cpu_equiv_side.resolved, prepared, environ=os.environ, log=_log) as server:
        yield server


@dataclass(frozen=True)
class Cli:
    code: int
    output: str  # stdout then stderr
    stdout: str = ""  # results only (tables, JSON, URL=...)


@pytest.fixture(scope="session")
def invoke_cli() -> Callable[..., Cli]:
    """``imageforge ARGS`` (:func:`tests.cli.imageforge`: in this process; ``process=True`` for a child process)."""

    def run(*args: str, timeout: float = 900, env: dict[str, str] | None = None, cwd: Path = REPO,
            process: bool = False) -> Cli:
        proc = imageforge(*args, timeout=timeout, env=env, cwd=cwd, process=process)
        output = proc.stdout + proc.stderr
        print(output[-6000:])
        return Cli(proc.returncode, output, proc.stdout)

    return run


@dataclass
class RunBase:
    """The session's ``run --target cpu --base --set dtype=float32`` (see the module)."""

    invoke_cli: Callable[..., Cli]
    port: int = 0
    cli: Cli | None = None  # the output of the `run` that started it
    starts: int = 0

    ARGS = ("run", "--target", "cpu", "--base", "--set", "dtype=float32")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> Cli:
        """Start it unless it is serving (a test before may have stopped it: then once more); its `run` output."""
        if self.cli is not None and self.answers():
            return self.cli
        self.port = helpers.free_port()
        self.cli = self.invoke_cli(*self.ARGS, "--port", str(self.port))
        self.starts += 1
        assert self.cli.code == 0, self.cli.output
        return self.cli

    def answers(self) -> bool:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        return False


@pytest.fixture(scope="session")
def cpu_base_run(invoke_cli: Callable[..., Cli], docker_ready: None) -> Iterator[RunBase]:
    run = RunBase(invoke_cli)
    yield run
    if run.cli is not None and run.answers():
        invoke_cli("stop", "--target", "cpu")


@pytest.fixture(scope="session")
def cpu_submission(docker_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """{"resolved", "imageforge" (image id), "plain" (image id), "tree", "base" (the base's reference)}."""
    import time

    from imageforge.build import build_target
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve
    from imageforge.submission import write_submission

    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", "aggressive", environ=os.environ)
    built = build_target(resolved, environ=os.environ, echo=print)
    tree = tmp_path_factory.mktemp("submission") / "tree"
    result = write_submission(resolved, tree, environ=os.environ)
    t0 = time.monotonic()
    plain, lines = helpers.plain_docker_build(tree)
    print(f"plain docker build of the tree: {time.monotonic() - t0:.1f}s")
    assert plain is not None, "\n".join(lines[-40:])
    try:
        yield {"resolved": resolved, "imageforge": built.image_id, "plain": plain, "tree": tree,
               "base": result.base_ref}
    finally:
        with contextlib.suppress(Exception):
            helpers.sdk().images.remove(plain, force=True)


@pytest.fixture
def cpu_variant(tmp_path: Path) -> Callable[..., Path]:
    """``write(image, steps=[...], files={rel: text})`` -> a manifest whose cpu target has extra steps
    (:func:`helpers.write_cpu_variant` in the test's tmp dir)."""

    def write(image: str, steps: Sequence[dict[str, Any]] = (), files: dict[str, str] | None = None) -> Path:
        return helpers.write_cpu_variant(tmp_path, image, steps, files)

    return write


@pytest.fixture
def remove_images() -> Iterator[list[str]]:
    """Repositories a test tagged images into; every tag of them is removed afterwards."""
    repos: list[str] = []
    yield repos
    helpers.remove_tags(repos)


