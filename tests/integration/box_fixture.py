"""A "box": the card's machine rehearsed here, shared by the in-place integration tests.

A container from the cpu base image (real vLLM for CPU in ``/opt/venv``, ``python3`` on PATH is the target
interpreter), started with ``--shm-size 1g``, no network and no Docker socket.  Into it go the repository (the
files git tracks or would track, as a fresh clone has them), the tiny model at the place the cpu target's volume
source names (``.imageforge/models/tiny-qwen3-moe``), and imageforge installed into its own venv
(``/opt/imageforge``) from a wheelhouse made on this machine for cp311 (``pip wheel`` of the repository +
``pip download`` of its dependencies, binary only, cached under ``/tmp``).  Inside, commands run as a team on
the card runs them: ``cd /work/repo && /opt/imageforge/bin/invoke TASK ... --in-place``.

:func:`make_box` makes one (from the cpu base, or another image such as the bi100 vendor-layout fixture);
:class:`Box` runs shell commands in it (``sh``), ``invoke`` tasks and the ``imageforge`` command, reads files,
lists trees (:meth:`Box.listing`: what revert must give back) and is removed at the end.  One cpu box per test
session: tests/integration/conftest.py's ``box``, used in turn by the files of the in-place group
(tests/conftest.py's ``VLLM_INPLACE``); each vLLM start in it costs 30-50 s on 2 cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BOX_REPO = "/work/repo"
BOX_VENV = "/opt/imageforge"
BOX_WHEELS = "/wheels"
TEST_LABEL = "org.imageforge.test"
MODEL_REL = ".imageforge/models/tiny-qwen3-moe"
WHEEL_CACHE = Path(os.environ.get("IMAGEFORGE_BOX_WHEELS", "/tmp/imageforge-box-wheels"))
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _log(line: str) -> None:
    print(line, flush=True)


def repo_files(repo: Path = REPO) -> list[str]:
    """What a clone has: tracked files and untracked files git does not ignore (work in progress included)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                         capture_output=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (repo / p).is_file())


def model_dir() -> Path:
    """The tiny model (written by `invoke base --target cpu`): this checkout's, else the main checkout's."""
    for root in (REPO, Path("/work/main")):
        if (root / MODEL_REL / "config.json").is_file():
            return root / MODEL_REL
    raise FileNotFoundError(f"no {MODEL_REL}: run `invoke base --target cpu`")


VLLM_CACHE = "imageforge-vllm-cache"  # build.yaml's cpu run.volumes: vLLM's cache, at /root/.cache/vllm


def vllm_cache_tar(client: Any) -> bytes | None:
    """The content of the cpu target's vLLM cache volume as a tar of ``.cache/vllm/...`` (``put_archive`` it at
    ``/root``): the archive of ``/root/.cache`` of a created, never started container of the cpu base with the
    volume mounted; None when the volume does not exist yet. vLLM keys its record of the model class by the class's
    source file, not by the model's path: a server in a box or on another daemon seeded with it skips the ~10 s
    inspection subprocess of a first start on this machine, as every container of the target does."""
    import docker

    try:
        client.volumes.get(VLLM_CACHE)
    except docker.errors.NotFound:
        return None
    container = client.containers.create(cpu_base_ref(), ["true"], volumes={VLLM_CACHE: {"bind": "/root/.cache/vllm",
                                                                                             "mode": "ro"}},
                                         labels={TEST_LABEL: "vllm-cache-copy"})
    try:
        stream, _ = container.get_archive("/root/.cache")
        return b"".join(stream)
    finally:
        container.remove(force=True)


@contextlib.contextmanager
def wheelhouse(python_version: str = "3.11") -> Iterator[Path]:
    """imageforge's wheel (this checkout) + its dependencies for cpXY manylinux x86_64, in a folder under
    ``WHEEL_CACHE``, held under a file lock while the caller reads it (the folder is shared: another test session, or
    the other worker of ``invoke test``, may be remaking its ``own/`` wheel)."""
    from filelock import FileLock

    pyproject = (REPO / "pyproject.toml").read_bytes()
    deps = WHEEL_CACHE / f"cp{python_version.replace('.', '')}-{hashlib.sha256(pyproject).hexdigest()[:12]}"
    deps.mkdir(parents=True, exist_ok=True)
    with FileLock(str(deps) + ".lock"):
        yield _make_wheelhouse(deps, python_version)


def _make_wheelhouse(deps: Path, python_version: str) -> Path:
    pip = [sys.executable, "-m", "pip", "-q"]
    own = deps / "own"
    if own.exists():
        for old in own.iterdir():
            old.unlink()
    with tempfile.TemporaryDirectory(prefix="imageforge-box-src-") as tmp:  # the checkout is never written
        for rel in repo_files():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, Path(tmp) / rel)
        subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(own), tmp], check=True)
    [wheel] = list(own.glob("imageforge-*.whl"))
    if not (deps / "complete").exists():
        platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run([*pip, "download", "-d", str(deps), "--only-binary=:all:", "--implementation", "cp",
                        "--python-version", python_version, *platform_args, str(wheel)], check=True)
        (deps / "complete").write_text("ok\n")
    return deps


def _tar(entries: list[tuple[str, Path]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, path in entries:
            tar.add(str(path), arcname=arcname, recursive=False)
    return buf.getvalue()


# (path, type, mode, uid:gid, size, mtime_ns, link, sha256) of every entry under each tree named on the command line
# (imageforge.inplace.listing, run by the box's imageforge); of /etc only the folder itself and what is below it
LISTING = """
import json, sys
from pathlib import Path
from imageforge.inplace import listing
rows = []
for top in sys.argv[1:]:
    rows += [list(r) for r in listing(Path(top)) if not (top == "/etc" and r[0] != "/etc")]
print(json.dumps(rows))
"""


@dataclass
class Box:
    container: Any
    repo: str = BOX_REPO
    environ: dict[str, str] = field(default_factory=dict)  # every command's environment (e.g. an activated venv)

    def sh(self, command: str, *, timeout: int = 900, env: dict[str, str] | None = None,
           check: bool = False) -> tuple[int, str]:
        """``bash -c COMMAND`` in the box (stdout and stderr together), killed after ``timeout`` s; ``check``: a
        non-zero exit fails the test with the output's tail."""
        result = self.container.exec_run(["timeout", "-s", "KILL", str(timeout), "bash", "-c", command],
                                         environment={**self.environ, **(env or {})}, workdir=self.repo)
        text = result.output.decode("utf-8", "replace") if isinstance(result.output, bytes) else str(result.output)
        if check and result.exit_code != 0:
            raise AssertionError(f"box: {command} -> exit {result.exit_code}\n{text[-4000:]}")
        return int(result.exit_code), text

    def imageforge(self, args: str, *, check: bool = True, timeout: int = 900) -> tuple[int, str, float]:
        """The installed ``imageforge`` command (killed after ``timeout`` s): (exit code, its stdout alone: the
        result, seconds)."""
        t0 = time.monotonic()
        code, (out, err) = self.container.exec_run(
            ["timeout", "-s", "KILL", str(timeout), "/bin/sh", "-c", f"{BOX_VENV}/bin/imageforge {args}"],
            workdir=self.repo, environment=self.environ, demux=True)
        seconds = time.monotonic() - t0
        stdout, stderr = (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")
        if check and code != 0:
            raise AssertionError(f"box: imageforge {args} -> exit {code}\n{stdout[-3000:]}\n{stderr[-3000:]}")
        return int(code), stdout, seconds

    def listing(self, trees: list[str]) -> list[list[Any]]:
        """The listing of ``trees`` (see ``LISTING``), one row per entry, as lists."""
        _, out = self.sh(f"{BOX_VENV}/bin/python -c {shlex.quote(LISTING)} " + " ".join(map(shlex.quote, trees)),
                         check=True)
        rows: list[list[Any]] = json.loads(out)
        return rows

    def invoke(self, *args: str, timeout: int = 900) -> tuple[int, str]:
        """``invoke TASK ...`` of the copied repository, with the box's own venv's invoke."""
        return self.sh(f"{BOX_VENV}/bin/invoke " + " ".join(shlex.quote(a) for a in args), timeout=timeout)

    def read(self, path: str) -> str:
        code, out = self.sh(f"cat {shlex.quote(path)}")
        assert code == 0, out
        return out

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # best effort at teardown
            self.container.remove(force=True, v=True)


def cpu_base_ref() -> str:
    from imageforge.base import base_image_status

    status = base_image_status(REPO / "images" / "cpu")
    if not status.vllm_present:
        raise FileNotFoundError("the cpu base image is not built (invoke base --target cpu)")
    return str(status.ref)


def make_box(image: str | None = None, *, log: Any = _log) -> Box:
    """A started box of ``image`` (default: the current cpu base) with the repository, the tiny model and
    imageforge in its own venv (see the module). The image's entrypoint is not run: the box's process is
    ``sleep infinity``."""
    import docker

    t0 = time.monotonic()
    cli = docker.from_env(timeout=600)
    container = cli.containers.run(
        image or cpu_base_ref(), ["sleep", "infinity"], entrypoint=[], detach=True, init=True, shm_size="1g",
        network_mode="none", labels={TEST_LABEL: "in-place-box"},
        name=f"imageforge-box-{os.getpid()}-{int(time.time() * 1000)}")
    box = Box(container)
    try:
        entries = [(f"{BOX_REPO.lstrip('/')}/{p}", REPO / p) for p in repo_files()]
        model = model_dir()
        entries += [(f"{BOX_REPO.lstrip('/')}/{MODEL_REL}/{f.name}", f) for f in sorted(model.iterdir())]
        with wheelhouse("3.11") as wheels:
            wheel_files = [w for w in sorted(wheels.glob("*.whl")) if not w.name.startswith("imageforge-")]
            wheel_files += sorted((wheels / "own").glob("imageforge-*.whl"))
            entries += [(f"{BOX_WHEELS.lstrip('/')}/{w.name}", w) for w in wheel_files]
            assert container.put_archive("/", _tar(entries))
        cache = vllm_cache_tar(cli) if image is None else None  # the cpu target's servers only
        if cache is not None:
            assert container.put_archive("/root", cache)
        # --no-compile: what runs in the box compiles as it imports (the box writes bytecode); the rest never needs to
        code, out = box.sh(f"/usr/bin/python3 -m venv {BOX_VENV} && {BOX_VENV}/bin/pip install -q --no-compile "
                           f"--no-index --find-links {BOX_WHEELS} imageforge", timeout=600)
        assert code == 0, out
        log(f"box {container.name}: {len(entries)} files, imageforge installed in {time.monotonic() - t0:.0f}s")
    except BaseException:
        box.remove()
        raise
    return box
