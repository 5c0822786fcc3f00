"""Helpers shared by the integration tests (one home for each; import them from here).

* :func:`free_port` -- a free TCP port on 127.0.0.1 (imageforge.serve.container's own).
* :func:`cpu_base_refs` -- the cpu recipe's computed references: (OS image tag, vLLM base tag).
* :func:`os_image` -- the recipe's OS image, found **by its computed tag**, never by the
  ``org.imageforge.kind=os-base`` label: every image built FROM the OS image inherits that label (a user's
  ``FROM imageforge/os:...``, a dangling layer of a plain ``docker build`` of a submission tree, a test's committed
  probe), so "the newest image with the label" may hold anyone's files.
* :func:`run_in_dir` -- a command in a directory, capturing output, asserting its exit code.
* :func:`invoke` -- ``invoke ARGS`` as a user runs it from the repository (forge_fixtures.invoke).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker

from imageforge.serve.container import free_port

REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"
CPU_RECIPE = REPO / "images" / "cpu"

__all__ = ["INVOKE", "REPO", "cpu_base_refs", "free_port", "invoke", "os_image", "run_in_dir"]


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
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if expect is not None and proc.returncode != expect:
        raise AssertionError(f"{' '.join(argv)} (in {cwd}) -> {proc.returncode}, expected {expect}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def invoke(*args: str, expect: int | None = 0, timeout: float = 600, env: dict[str, str] | None = None,
           cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_in_dir([str(INVOKE), *args], cwd, expect=expect, timeout=timeout, env=env)
