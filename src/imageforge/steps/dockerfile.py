"""What a step kind emits for a plain ``docker build``: Dockerfile instructions + the context files they read.

Every step kind (patch, overlay, symlink, script) and the two engine stages (verify, serving config)
has one emitter: a step kind's is its class's ``emit`` (``steps/<kind>.py``); the verify stage's is
registered in :data:`EMITTERS` (``submission/kinds/verify.py``).  An emitter is a pure function of
the step and an :class:`EmitContext` (where the package lives in the base image, which python runs
there, the context folder reserved for the step); it returns an :class:`Emitted`.  Emitters do
not know about each other or about the tree writer.

Only syntax Docker 20.10's classic builder accepts is emitted: no ``COPY --chmod``, no heredocs,
no ``RUN --mount``; modes are set by ``RUN``.  ``RUN`` and ``CMD`` use the JSON (exec) form, so no
shell or ``$`` substitution touches their arguments.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# Where the generated helper scripts and a step's files land during ``docker build`` (removed by the step).
STAGE_DIR = "/tmp/imageforge-submission"
HELPER_DIR = "imageforge"  # context folder of the generated helpers
APPLIER = f"{HELPER_DIR}/apply.py"
VERIFIER = f"{HELPER_DIR}/verify.py"


@dataclass(frozen=True)
class BaseFacts:
    """What the Dockerfile needs to know about the base image (read once from it, recorded in the tree)."""

    site: str  # the package's site directory (realpath), where relative step paths live
    python: str  # the interpreter of the package (verify compiles with it; the helpers run with it)
    entrypoint: tuple[str, ...] = ()
    python_version: str = ""  # e.g. "3.10.12": a changed .py must parse as this version

    def to_json(self) -> dict[str, Any]:
        return {"site": self.site, "python": self.python, "entrypoint": list(self.entrypoint),
                "python_version": self.python_version}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BaseFacts:
        return cls(str(data["site"]), str(data["python"]), tuple(str(x) for x in data.get("entrypoint") or ()),
                   str(data.get("python_version") or ""))


@dataclass(frozen=True)
class ContextFile:
    data: bytes
    mode: int = 0o644  # the mode in the tree (git keeps only the executable bit); the image's modes are set by RUN


@dataclass(frozen=True)
class EmitContext:
    base: BaseFacts
    environ: Mapping[str, str]
    step_dir: str  # context folder reserved for this step's files, e.g. "imageforge/steps/03-prefill-num-warps"
    index: int  # 1-based position in the plan
    total: int
    folder_name: str | None = None  # context folder a directory script step copies (a root folder of the tree)


@dataclass(frozen=True)
class Emitted:
    instructions: tuple[str, ...]
    files: Mapping[str, ContextFile] = field(default_factory=dict)  # context-relative path -> file
    not_replicated: tuple[str, ...] = ()  # what imageforge's engine does that this group does not (said in the tree)


Emitter = Callable[..., Emitted]
EMITTERS: dict[str, Emitter] = {}


def register(kind: str) -> Callable[[Emitter], Emitter]:
    def wrap(fn: Emitter) -> Emitter:
        EMITTERS[kind] = fn
        return fn

    return wrap


# --------------------------------------------------------------------------- instruction helpers

_SAFE_PATH = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def check_path(path: str, what: str) -> str:
    """A path that COPY takes literally (COPY substitutes ``$VAR`` and splits on blanks)."""
    if not _SAFE_PATH.match(path):
        raise ConfigError(f"{what} {path!r} cannot be written in a Dockerfile COPY literally",
                          expected="letters, digits and _@%+=:,./-", found=path)
    return path


def run(argv: Sequence[str]) -> str:
    """``RUN`` in the JSON form: the argv as is, no shell, no substitution."""
    return "RUN " + json.dumps(list(argv))


def copy(sources: Sequence[str], dest: str) -> str:
    for s in sources:
        check_path(s, "context path")
    check_path(dest, "image path")
    return "COPY " + " ".join([*sources, dest])


def env_value(value: str) -> str:
    """A double-quoted ENV/LABEL value (the builder substitutes ``$``, so it is escaped)."""
    if "\n" in value or "\r" in value:
        raise ConfigError("an ENV value with a line break cannot be written in a Dockerfile", found=repr(value))
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def comment(text: str) -> str:
    return "# " + " ".join(text.split())


def header(ctx: EmitContext, ident: str, kind: str, why: str | None) -> str:
    return comment(f"step {ctx.index}/{ctx.total} {ident} ({kind})" + (f": {why}" if why else ""))


def spec_file(ctx: EmitContext, spec: Mapping[str, Any]) -> tuple[str, ContextFile]:
    """The JSON a helper op reads, in the step's folder (sorted keys: deterministic bytes)."""
    data = (json.dumps(dict(spec), sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()
    return f"{ctx.step_dir}/step.json", ContextFile(data)


def applier_group(ctx: EmitContext, spec: Mapping[str, Any], extra: Mapping[str, ContextFile] | None = None,
                  ) -> tuple[list[str], dict[str, ContextFile]]:
    """COPY the applier + the step's folder to STAGE_DIR, RUN the applier on step.json (it removes STAGE_DIR)."""
    name, file = spec_file(ctx, spec)
    files = {name: file, **(extra or {})}
    instructions = [
        copy([APPLIER, ctx.step_dir + "/"], STAGE_DIR + "/"),
        run([ctx.base.python, f"{STAGE_DIR}/apply.py", f"{STAGE_DIR}/step.json"]),
    ]
    return instructions, files


def host_file(path: Path) -> ContextFile:
    return ContextFile(path.read_bytes(), 0o755 if os.access(path, os.X_OK) else 0o644)
