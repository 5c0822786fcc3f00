"""``script``: a host script (``source`` + ``args``) or a host folder (``directory`` copied to ``dest`` + ``command``)
run in the image, with ``env``, ``user`` and ``workdir``. Its apply runs in a started container: the build's
step container (committed afterwards) or check-patches' throwaway sandbox.

The Dockerfile face is a plain ``RUN`` in the step's working directory, with the step's env, as the engine's
exec does:

* ``source``: the script is copied to the engine's scratch folder (mode 0755), run with its args,
  and the scratch folder is removed (the engine removes it too);
* ``directory``: the folder is copied to ``dest`` (kept, like the engine's copy), its entries get the
  engine's modes/owner/mtime (the applier's ``tree`` op: git keeps only the executable bit and the
  platform's checkout picks directory modes by umask), then ``command`` runs in ``workdir``.

A failing script fails the build with its exit code and a line naming the step.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..docker_engine import client
from ..docker_engine.containers import file_entry, tar_of
from ..errors import BuildError, ConfigError, InfraError
from ..manifest.model import Step, StepSpec, frozen_map, normalise_image_path, resolve_image_path
from ..scripts.deadfiles import live_in_image
from ..scripts.run import SCRIPT_SCRATCH, Log, exec_argv, script_directory
from ..scripts.run import directory_entries as directory_tar
from .core import ApplyContext, Changes, LoadedSpec, SpecChecks, StepKind, StepProblem, register
from .dockerfile import ContextFile, EmitContext, Emitted, applier_group, copy, header, host_file, run
from .fs import ImageFS


def _shell(step: Step, argv: Sequence[str], env: Mapping[str, str], workdir: str | None, cleanup: str | None) -> str:
    command = " ".join(shlex.quote(a) for a in argv)
    if env:
        command = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + command
    if workdir:
        command = f"cd {shlex.quote(workdir)} && {command}"
    text = f"{command}; rc=$?"
    if cleanup:
        text += f"; rm -rf {shlex.quote(cleanup)}"
    message = f"imageforge: script step {step.id} exited with code"
    text += f'; if [ $rc -ne 0 ]; then echo "{message} $rc" >&2; fi; exit $rc'
    return text


def directory_entries(root: Path) -> list[list[Any]]:
    """(relative path, type, mode) of the folder as the engine writes it (imageforge.build.directory_entries)."""
    out: list[list[Any]] = [["", "d", 0o755]]
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out.append([rel, "l", 0o777])
        elif path.is_dir():
            out.append([rel, "d", 0o755])
        elif path.is_file():
            out.append([rel, "f", path.stat().st_mode & 0o777])
    return out


def folder_files(root: Path, into: str) -> dict[str, ContextFile]:
    files: dict[str, ContextFile] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise ConfigError(f"{path} is a symbolic link: the submission tree holds regular files only",
                              hint="git keeps links, but the platform's checkout may not; copy the file instead")
        if path.is_file():
            files[f"{into}/{path.relative_to(root).as_posix()}"] = host_file(path)
    return files


@dataclass(frozen=True)
class ScriptSpec(StepSpec):
    """A script step's fields: a host script ``source`` run with ``args``, or a host ``directory`` copied to ``dest``
    where ``command`` runs; ``env``, ``user``, ``workdir`` (a directory's defaults to its ``dest``).

    ``load_hint`` and ``touches`` are Step fields, not these: no layer changes with them.
    """

    source: str | None = None
    args: tuple[str, ...] = ()
    directory: str | None = None  # a path relative to the manifest (normalised) or a whole ${VAR}
    dest: str | None = None
    command: tuple[str, ...] | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: frozen_map({}))
    user: str | None = None  # None: root

    @property
    def host_file(self) -> str | None:
        return self.source

    @property
    def host_directory(self) -> str | None:
        return self.directory

    def folder(self) -> tuple[str, str, tuple[str, ...]]:
        """(directory, dest, command) of a directory step (the schema's oneOf: all three or none)."""
        if self.directory is None or self.dest is None or self.command is None:
            raise ConfigError(f"a directory script step needs directory, dest and command, found {self.definition()}")
        return self.directory, self.dest, self.command


def exec_script(container: Any, step: Step, environ: Mapping[str, str], *,
                echo: Log | None = None) -> tuple[int | None, list[str]]:
    """Put a script step's files into a running ``container`` and exec it; (exit code, output lines).

    A ``source`` script goes to a scratch directory and runs with its ``args``; a ``directory`` is
    copied to ``dest`` and ``command`` runs there (``workdir``, default ``dest``).
    """
    spec = ScriptSpec.of(step)
    if spec.directory is not None:
        _, dest, command = spec.folder()
        entries, payloads = directory_tar(script_directory(step, environ), dest)
        argv = list(command)
    else:
        name = posixpath.basename(str(spec.source))
        data = step.source.read_bytes()
        entries = [file_entry(f"{SCRIPT_SCRATCH}/{name}", data, mode=0o755)]
        payloads = {entries[0].name: data}
        argv = [f"{SCRIPT_SCRATCH}/{name}", *spec.args]
    if not container.put_archive("/", tar_of(entries, payloads)):
        raise BuildError(f"the daemon refused to write the files of step {step.id}")
    return exec_argv(container, argv, dict(spec.env), spec.user or "root", spec.workdir, echo)


@register
class Script(StepKind):
    name = "script"
    spec_type = ScriptSpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": [],
        "properties": {
            "source": {"type": "string", "minLength": 1,
                       "description": "Script file under overlays/ (relative to the manifest), copied to a scratch "
                                      "directory and run (its shebang decides the interpreter). Exactly one of "
                                      "source or directory."},
            "args": {"type": "array", "items": {"type": "string"}},
            "env": {"$ref": "#/$defs/env"},
            "user": {"type": "string", "description": "User to run the script as (default: root)."},
            "directory": {"type": "string", "minLength": 1,
                          "description": "A host directory copied into the image at `dest` (kept there, like a "
                                         "Dockerfile COPY): a path relative to the manifest, or a whole '${VAR}' "
                                         "read from the environment at plan/build time. Its files' sha256 enter the "
                                         "cache key. Needs `command`."},
            "load_hint": {"type": "string", "description": "How a user gets the directory when its ${VAR} is unset "
                                                           "(printed with the exit-5 error)."},
            "touches": {"type": "array", "items": {"type": "string", "minLength": 1},
                        "description": "What the script may change, for `apply --in-place`: paths (absolute, or "
                                       "relative to the package's site directory; a wildcard in the last component "
                                       "matches names there; `{purelib}/`, `{platlib}/`, `{scripts}/` start a path "
                                       "in the target interpreter's install scheme, where pip writes) copied before "
                                       "it runs and diffed after. Not part of the layer's cache key."},
            "dest": {"type": "string", "pattern": "^/",
                     "description": "Absolute path in the image that receives `directory`."},
            "workdir": {"type": "string", "pattern": "^/",
                        "description": "Working directory of the script's process (default: `dest` for a directory, "
                                       "the image's WORKDIR otherwise)."},
            "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                        "description": "argv run in `workdir` for a directory step, e.g. [bash, patch_ops.sh]."},
        },
        "oneOf": [
            {"required": ["source"], "not": {"anyOf": [{"required": ["directory"]}, {"required": ["command"]},
                                                       {"required": ["dest"]}, {"required": ["load_hint"]}]}},
            {"required": ["directory", "dest", "command"],
             "not": {"anyOf": [{"required": ["source"]}, {"required": ["args"]}]}},
        ],
    }
    runs_process = True

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        spec["args"] = tuple(raw.get("args", ()))
        spec["env"] = checks.env("env", raw.get("env"))
        spec.pop("load_hint", None)  # a hint's wording is not part of the layer
        spec.pop("touches", None)  # what apply --in-place snapshots: not part of the layer
        if "command" in raw:
            spec["command"] = tuple(raw["command"])
        for key in ("dest", "workdir"):
            if key in raw:
                norm = normalise_image_path(raw[key])
                if norm is None:
                    checks.problem(key, "path escapes its root", expected="an absolute path without '..'",
                                   found=repr(raw[key]))
                else:
                    spec[key] = norm
        directory_env: str | None = None
        directory_path: Path | None = None
        if "directory" in raw:
            directory_env, directory_path = checks.directory("directory", raw["directory"])
            spec["directory"] = raw["directory"] if directory_env else posixpath.normpath(raw["directory"])
            spec.setdefault("workdir", spec.get("dest"))  # a directory's script runs in its copy
        loaded = super().load(raw, spec, checks)
        return LoadedSpec(loaded.spec, directory_env, directory_path)

    def row_path(self, step: Step, site: str) -> str:
        spec = ScriptSpec.of(step)
        return spec.dest or spec.source or ""

    def describe(self, step: Step) -> list[str]:
        spec = ScriptSpec.of(step)
        what = spec.source or spec.command or spec.directory
        return [f"script {what} {' '.join(spec.args)}".rstrip() + ": its files are whatever it writes (not declared)"]

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        """What the script declares it may change (``touches:``; relative paths under the site directory)."""
        return tuple(resolve_image_path(p, site) for p in step.touches)

    def preflight(self, step: Step, environ: Mapping[str, str]) -> None:
        if ScriptSpec.of(step).directory is not None:
            script_directory(step, environ)  # an unset ${VAR} or a missing folder: exit 5 before Docker

    def context_folder(self, step: Step, environ: Mapping[str, str]) -> Path | None:
        return step.directory(environ) if ScriptSpec.of(step).directory is not None else None

    def live_files(self, step: Step, environ: Mapping[str, str]) -> Mapping[str, str]:
        """A directory step's folder files its command runs or imports, at ``dest`` (the dead-file rule)."""
        spec = ScriptSpec.of(step)
        folder = self.context_folder(step, environ)
        if folder is None or not folder.is_dir():
            return {}
        _, dest, command = spec.folder()
        return live_in_image(folder, dest, command, spec.workdir)

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        """Run the step in ``ctx.container`` (started) or through ``ctx.runner``; what it changed stays there."""
        if ctx.container is None and ctx.runner is None:
            raise BuildError(f"script step {step.id!r} needs a running container to apply in")
        path = self.row_path(step, ctx.site)
        if ctx.runner is not None:
            code, lines = ctx.runner.run_step(step, ctx.environ, echo=ctx.echo)
        else:
            code, lines = exec_script(ctx.container, step, ctx.environ, echo=ctx.echo)
        if code != 0:
            # ENOSPC inside the step is the host's disk, not the script: infrastructure (exit 5)
            full = any("no space left on device" in line.lower() for line in lines[-30:])
            error = (InfraError if full else BuildError)(
                f"script step {step.id!r} exited with code {code}"
                + (": out of disk space (free some: invoke clean)" if full else ""),
                location=step.location, key_path=step.key_path,
                hint=f"run it by hand: docker run --rm -it {ctx.image[:19]} sh" if ctx.image else None,
                log_tail=lines[-30:],
            )
            tail = tuple(lines[-20:])
            raise StepProblem("script failed", path,
                              f"exit code {code}" + (f": {tail[-1].strip()[:100]}" if tail else ""), error,
                              log_tail=tail, exit_code=code)
        # a directory step's copy stays, like a Dockerfile COPY; a source script's scratch folder goes
        if ScriptSpec.of(step).source is not None and ctx.runner is None:
            api = client().api
            cleanup = api.exec_create(ctx.container.id, ["rm", "-rf", SCRIPT_SCRATCH], user="root")["Id"]
            api.exec_start(cleanup)
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
        return Changes("ran", path, f"exit 0: {last[:100]}", (lines[-1].strip() if lines else "no output")[:120])

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        """A plain ``RUN`` in the step's working directory, with the step's env, as the engine's exec does."""
        s = ScriptSpec.of(step)
        user = s.user or "root"
        if user not in ("root", "0", "0:0"):
            raise ConfigError(f"script step {step.id!r} runs as {user!r}; the Dockerfile emitter runs scripts as "
                              "root only", key_path=f"{step.key_path}.user",
                              hint="drop `user` or extend steps/script.py")
        env = dict(s.env)
        head = header(ctx, step.id, step.kind, step.why)
        if s.directory is not None:
            _, dest, command = s.folder()
            directory = step.directory(ctx.environ)
            if directory is None or not directory.is_dir():
                raise InfraError(f"script step {step.id!r}: its directory is not there "
                                 f"(${step.directory_env} unset or not a folder)",
                                 key_path=f"{step.key_path}.directory", hint=step.load_hint)
            folder = ctx.folder_name or f"{ctx.step_dir}/{directory.name}"
            dest = posixpath.normpath(dest)
            tree_spec = {"op": "tree", "step": step.id, "dest": dest, "entries": directory_entries(directory)}
            group, files = applier_group(ctx, tree_spec)
            files.update(folder_files(directory, folder))
            workdir = s.workdir or dest
            instructions = [head, copy([folder + "/"], dest + "/"), *group,
                            run(["/bin/sh", "-c", _shell(step, list(command), env, workdir, None)])]
            return Emitted(tuple(instructions), files)
        name = posixpath.basename(str(s.source))
        scratch = f"{SCRIPT_SCRATCH}/{name}"
        argv = [scratch, *s.args]
        shell = f"chmod 0755 {shlex.quote(scratch)} && " + _shell(step, argv, env, s.workdir, SCRIPT_SCRATCH)
        files = {f"{ctx.step_dir}/{name}": ContextFile(step.source.read_bytes(),
                                                       0o755 if os.access(step.source, os.X_OK) else 0o644)}
        instructions = [head, copy([f"{ctx.step_dir}/{name}"], scratch), run(["/bin/sh", "-c", shell])]
        return Emitted(tuple(instructions), files)
