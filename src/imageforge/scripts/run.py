"""Script steps' host side and execution: a directory step's host folder, a folder as tar entries, and the exec
in a running container (the script kind, :func:`imageforge.steps.script.exec_script`, puts its files there and runs
it through :func:`exec_argv`). ``build`` commits what it leaves; ``check-patches`` runs it in a throwaway container
and checks the later steps against the result.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..docker_engine import client
from ..docker_engine.containers import FIXED_MTIME, file_entry, symlink_entry
from ..errors import InfraError
from ..manifest.model import Step

Log = Callable[[str], None]


SCRIPT_SCRATCH = "/tmp/imageforge-step"
IDLE_LOOP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def directory_entries(root: Path, dest: str) -> tuple[list[tarfile.TarInfo], dict[str, bytes]]:
    """Tar entries that put the host directory ``root`` at ``dest`` (modes kept, owner root, fixed mtime)."""
    entries = [_dir_entry(dest)]
    payloads: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        inside = posixpath.join(dest, path.relative_to(root).as_posix())
        if path.is_symlink():
            entries.append(symlink_entry(inside, os.readlink(path)))
        elif path.is_dir():
            entries.append(_dir_entry(inside))
        elif path.is_file():
            data = path.read_bytes()
            entries.append(file_entry(inside, data, mode=path.stat().st_mode & 0o777))
            payloads[entries[-1].name] = data
    return entries, payloads


def _dir_entry(path: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = FIXED_MTIME
    return info


def script_directory(step: Step, environ: Mapping[str, str]) -> Path:
    """The host directory of a directory script step; InfraError (exit 5) when unset or not there."""
    directory = step.directory(environ)
    if directory is None:
        raise InfraError(
            f"script step {step.id!r} copies a directory from ${step.directory_env}, which is not set",
            location=step.where("directory"), key_path=f"{step.key_path}.directory",
            hint=step.load_hint or f"export {step.directory_env}=<directory>",
        )
    if not directory.is_dir():
        raise InfraError(
            f"script step {step.id!r}: {directory} is not a directory",
            location=step.where("directory"), key_path=f"{step.key_path}.directory",
            hint=step.load_hint or "give the directory that holds the step's files",
        )
    return directory


def exec_argv(container: Any, argv: list[str], env: Mapping[str, str], user: str, workdir: str | None,
              echo: Log | None = None) -> tuple[int | None, list[str]]:
    """Exec ``argv`` in a running ``container`` as ``user`` in ``workdir``; (exit code, output lines as they came).

    What a script step runs (:func:`imageforge.steps.script.exec_script` puts its files there first).
    """
    api = client().api
    options: dict[str, Any] = {"environment": dict(env), "user": user}
    if workdir:
        options["workdir"] = workdir
    exec_id = api.exec_create(container.id, argv, **options)["Id"]
    lines: list[str] = []
    pending = ""
    for chunk in api.exec_start(exec_id, stream=True):
        pending += chunk.decode(errors="replace")
        *done, pending = pending.split("\n")
        for line in done:
            lines.append(line)
            if echo is not None:
                echo(line)
    if pending:
        lines.append(pending)
        if echo is not None:
            echo(pending)
    code = api.exec_inspect(exec_id).get("ExitCode")
    return code, lines
