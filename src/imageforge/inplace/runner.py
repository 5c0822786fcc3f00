"""How a script step runs: exec in the build's container, or a local process for ``apply --in-place``.

The step kind (:class:`imageforge.steps.script.Script`) runs itself through ``ApplyContext.runner``: one
definition of the step, two places. :class:`LocalRunner` copies a ``source`` script to a scratch folder
under the journal (removed after), or a ``directory`` to ``ROOT/dest``, and runs it in its own process
group with the caller's environment, the step's ``env`` and ``IMAGEFORGE_ROOT``; an interrupt ends the
group (TERM, then KILL) before the step rolls back.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..manifest.model import Step
from ..scripts.run import script_directory
from ..steps.script import ScriptSpec

Log = Callable[[str], None]


def in_root(root: Path, image_path: str) -> Path:
    """The host path of an image path under ``root``."""
    return root / posixpath.normpath(image_path).lstrip("/")


class LocalRunner:
    """A script step as a local process under ``root`` (``/``: the machine itself)."""

    def __init__(self, root: Path, scratch: Path, environ: Mapping[str, str], grace_s: float = 5.0) -> None:
        self.root = root
        self.scratch = scratch
        self.environ = dict(environ)
        self.grace_s = grace_s

    def run_step(self, step: Step, environ: Mapping[str, str], *,
                 echo: Log | None = None) -> tuple[int | None, list[str]]:
        spec = ScriptSpec.of(step)
        cleanup: Path | None = None
        if spec.directory is not None:
            _, copy_to, command = spec.folder()
            source = script_directory(step, environ)
            dest = in_root(self.root, copy_to)
            shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True, copy_function=shutil.copy)
            argv = list(command)
            cwd = in_root(self.root, spec.workdir or copy_to)
        else:
            cleanup = self.scratch / step.id
            cleanup.mkdir(parents=True, exist_ok=True)
            script = cleanup / posixpath.basename(str(spec.source))
            shutil.copyfile(step.source, script)
            os.chmod(script, 0o755)
            argv = [str(script), *spec.args]
            cwd = in_root(self.root, spec.workdir) if spec.workdir else self.root
        env = {**self.environ, **spec.env, "IMAGEFORGE_ROOT": str(self.root)}
        user = spec.user
        extra: dict[str, Any] = {}
        if user not in (None, "root", "0", "0:0") and os.geteuid() == 0:
            extra["user"] = str(user).split(":")[0]
        try:
            return self._run(argv, env, cwd, echo, extra)
        finally:
            if cleanup is not None:
                shutil.rmtree(cleanup, ignore_errors=True)
                with contextlib.suppress(OSError):
                    self.scratch.rmdir()

    def _run(self, argv: list[str], env: Mapping[str, str], cwd: Path, echo: Log | None,
             extra: Mapping[str, Any]) -> tuple[int | None, list[str]]:
        lines: list[str] = []
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **extra)
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append(line)
                if echo is not None:
                    echo(line)
            return proc.wait(), lines
        except BaseException:
            self._end(proc)
            raise

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        """TERM the script's process group, KILL it after the grace."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=self.grace_s)
                return
            except subprocess.TimeoutExpired:
                continue
