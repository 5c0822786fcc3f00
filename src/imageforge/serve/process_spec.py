"""What the server as a process runs: a target's serving command rendered for this machine (in-place mode).

:func:`process_spec` renders the command exactly as the container gets it (style ``argv``: the command and every
flag; style ``config``: ``command --config FILE`` with the file rendered by
:func:`imageforge.serve.command.render_serving_config` into the run directory, never ``/etc``), then:

* every serving argument or env value equal to or under a run volume's target (``/model``) is rewritten to the
  volume's source (``${IMAGEFORGE_MODEL_DIR}`` for bi100, the tiny model's folder for cpu);
* host and port are set by the target's flag names (``serving.flag_names``), binding 127.0.0.1 unless
  ``--host-address``;
* the child's environment is the caller's (``CUDA_VISIBLE_DEVICES`` and the box's own ``PYTHONPATH`` included)
  less imageforge's own venv (its ``PYTHONPATH``/``PATH`` entries), plus the serving and run env of the target.

Pure but for the volume sources' existence check: it writes nothing (:mod:`imageforge.serve.process` does).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InfraError
from ..inplace.package import find_python, without_own
from ..manifest.resolve import Resolved, Value
from .command import render_serving_config, serving_command
from .spec import volume_binds

CONFIG_NAME = "serving.yaml"
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """Docker's ``--shm-size`` units (binary): ``1g`` -> 1073741824; ``512m``, ``64k``, plain bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ConfigError(f"run.shm_size {text!r} is not a size", expected="e.g. 1g, 512m, 16g")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def rewrite_value(value: Any, mounts: Mapping[str, str]) -> Any:
    """``value`` with each string equal to or under a mount target (``{target: source}``) rewritten to its source."""
    if isinstance(value, str):
        for target, source in sorted(mounts.items(), key=lambda item: -len(item[0])):
            bare = target.rstrip("/")
            if value in (bare, bare + "/"):
                return source
            if value.startswith(bare + "/"):
                return source.rstrip("/") + value[len(bare):]
        return value
    if isinstance(value, list | tuple):
        return type(value)(rewrite_value(v, mounts) for v in value)
    return value


def mounts(resolved: Resolved, environ: Mapping[str, str]) -> dict[str, str]:
    """``{volume target: host source}`` of the target's bind volumes (sources checked to exist, made absolute).

    A named volume (``type: volume``) is Docker's: in place there is none, so its target is left as it is (the cpu
    target's vLLM cache: the process keeps its cache under its own home)."""
    named = {v.source for v in resolved.run.volumes if v.named}
    return {spec["bind"]: source for source, spec in volume_binds(resolved, environ).items() if source not in named}


def child_environ(environ: Mapping[str, str], extra: Mapping[str, str],
                  prefixes: Sequence[str] | None = None) -> dict[str, str]:
    """The server's environment: the caller's, less imageforge's own venv, plus ``extra`` (the target's env).

    ``PYTHONPATH`` and ``PATH`` entries inside imageforge's venv or source tree are dropped (the box's own
    ``PYTHONPATH``, e.g. corex's, stays); ``VIRTUAL_ENV`` naming imageforge's venv is dropped too.
    """
    env = without_own(environ, prefixes)
    env.update(extra)
    return env


def program(command: Sequence[str], python: str, environ: Mapping[str, str]) -> list[str]:
    """``command`` with its program found for the target interpreter.

    ``python``/``python3`` -> the target interpreter; another program (``vllm``) -> the one beside the
    interpreter (its venv's ``bin/``) when there, else on the caller's PATH.
    """
    if not command:
        raise ConfigError("serving.command is empty")
    first, rest = command[0], list(command[1:])
    try:
        interpreter = find_python(python, environ).path  # never imageforge's own venv
    except InfraError:
        interpreter = python
    if first in ("python", "python3") or re.fullmatch(r"python3(\.\d+)?", first):
        return [interpreter, *rest]
    beside = Path(interpreter).parent / first
    if os.sep not in first and beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *rest]
    found = first if os.sep in first else shutil.which(first, path=environ.get("PATH"))
    if not found:
        raise InfraError(f"the serving command's program {first!r} is not on this machine",
                         found=f"not beside {interpreter} nor on PATH",
                         hint="pass --python with the interpreter of the target's venv (its bin/ holds it)")
    return [found, *rest]


@dataclass(frozen=True)
class ProcessSpec:
    """What :func:`start_process` runs: argv, environment, working directory, where it listens."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    host: str
    port: int
    config: bytes | None = None  # the rendered config file (style config), written to ``config_path``
    config_path: Path | None = None
    rewritten: Mapping[str, str] = field(default_factory=dict)  # volume target -> source

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def changed_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The child's variables that differ from ``environ`` (what server.json records)."""
        return {k: v for k, v in self.env.items() if environ.get(k) != v}


def process_resolved(resolved: Resolved, *, host: str, port: int, environ: Mapping[str, str]) -> tuple[
        Resolved, dict[str, str]]:
    """``resolved`` with host, port and the mount rewrites in its serving args and env (provenance ``in-place``)."""
    where = mounts(resolved, environ)
    values = [dataclasses.replace(v, value=rewrite_value(v.value, where)) for v in resolved.serving]
    for key, value in (("host", host), ("port", port)):
        for i, v in enumerate(values):
            if v.key == key:
                values[i] = dataclasses.replace(v, value=value, source="in-place")
                break
        else:
            values.append(Value(key, value, "in-place", None, "in-place: where the process listens"))
    env = [dataclasses.replace(v, value=rewrite_value(str(v.value), where)) for v in resolved.env]
    return dataclasses.replace(resolved, serving=tuple(values), env=tuple(env)), where


def process_spec(resolved: Resolved, *, host: str, port: int, run_directory: Path, python: str = "python3",
                 environ: Mapping[str, str] | None = None, prefixes: Sequence[str] | None = None) -> ProcessSpec:
    """The serving command of ``resolved`` as a process (see the module docstring); writes nothing."""
    environ = os.environ if environ is None else environ
    local, where = process_resolved(resolved, host=host, port=port, environ=environ)
    serving = local.target.serving
    extra = {**local.serving_env(), **{k: rewrite_value(str(v), where) for k, v in local.run.env.items()}}
    env = child_environ(environ, extra, prefixes)
    config: bytes | None = None
    config_path: Path | None = None
    if serving.style == "argv":
        argv = serving_command(local)
    else:
        config_path = run_directory / CONFIG_NAME
        config = render_serving_config(local)
        argv = serving_command(local, str(config_path))
    return ProcessSpec(tuple(program(argv, python, env)), env, run_directory, host, port, config, config_path,
                       where)
