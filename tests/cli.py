"""The one way the tests run the `imageforge` command: :func:`imageforge`.

In this process by default, through invoke's ``Program`` over the command's collection (or the one a test passes:
the repository's ``tasks.py``), the environment and the working directory given for the call and restored after,
stdout and stderr captured apart: a process costs ~1-2 s of interpreter and imports, more under coverage.
``process=True`` runs ``python -m invoke ARGS`` in a child process instead, where a separate process is the point
(a signal sent to it, a subprocess timeout, a fresh interpreter's state). Either way the result is a
``CompletedProcess`` with the exit code, and ``expect`` checks that code.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from imageforge.cli import commands

REPO = Path(__file__).resolve().parents[1]


def merged_environ(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment with ``env`` over it (a None value: that variable unset)."""
    merged: dict[str, str | None] = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return {k: v for k, v in merged.items() if v is not None}


def without_imageforge_settings(env: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """``env`` with every ``IMAGEFORGE_*`` variable of this process unset (the tool's defaults, as a user has)."""
    return {**{k: None for k in os.environ if k.startswith("IMAGEFORGE_")}, **(env or {})}


@contextlib.contextmanager
def _environment(env: Mapping[str, str], cwd: Path) -> Iterator[None]:
    """``os.environ`` exactly ``env`` and the working directory ``cwd`` for the block, both as before after it."""
    saved, here = dict(os.environ), Path.cwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)


def imageforge(*args: str, expect: int | None = None, env: Mapping[str, str | None] | None = None,
               cwd: Path = REPO, process: bool = False, timeout: float = 600,
               namespace: Any = None) -> subprocess.CompletedProcess[str]:
    """``imageforge ARGS`` (see the module's docstring), its exit code checked against ``expect`` (None: not)."""
    if process:
        proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=merged_environ(env))
    else:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with _environment(merged_environ(env), cwd), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                commands.program(namespace).run(["imageforge", *args], exit=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        proc = subprocess.CompletedProcess(["imageforge", *args], code, out.getvalue(), err.getvalue())
    if expect is not None and proc.returncode != expect:
        raise AssertionError(f"imageforge {' '.join(args)} (in {cwd}) -> {proc.returncode}, expected {expect}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc
