"""``imageforge init --from DIR``: a team's existing repository (root ``Dockerfile`` + ``computility-run.yaml``)
adopted as a build.yaml that reproduces its build, with what could not be translated said.

The Dockerfile is read with Docker's own parser (the ``dockerfile`` package), the run file with PyYAML. Each RUN
becomes a ``script`` step over the folder a COPY put where it runs (``directory`` -> ``dest``, ``command: [bash,
-c, RUN]`` as written: a RUN that discards its exit code stays so, and ``preflight`` says so); the run file's
argv becomes ``serving`` (style argv: its command, each flag an ``args`` entry; short names through
``flag_names``) and its env ``serving.env``; a ``vendor-api.json`` at DIR's root is named by the target.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, Location, require_extra

TARGET = "adopted"
RUN_FILE = "computility-run.yaml"
#: Short flags teams write and the long names they stand for (the manifest's args use long names).
SHORT_FLAGS: Mapping[str, str] = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
                                  "-q": "quantization"}


@dataclass
class Adoption:
    manifest: dict[str, Any]
    untranslated: list[str] = field(default_factory=list)

    def text(self, source: Path) -> str:
        head = [f"# Adopted by `imageforge init --from {source}`: the build of its root Dockerfile and {RUN_FILE}.",
                "# Not translated:" if self.untranslated else "# Everything was translated."]
        head += [f"#   - {line}" for line in self.untranslated]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.manifest, sort_keys=False, width=120)


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def serving_of(run: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """The run file's command and env as the manifest's ``serving`` (style argv)."""
    argv = [str(a) for a in run.get("command") or ()]
    if not argv:
        raise ConfigError(f"{RUN_FILE} has no command", key_path="command", expected="a list: the server's argv")
    # the command ends at the first flag (`python3 -m MODULE`: -m is the interpreter's, part of the command)
    first = next((i for i, a in enumerate(argv) if a.startswith("--") or a in SHORT_FLAGS), len(argv))
    args: dict[str, Any] = {}
    names: dict[str, str] = {}
    i = first
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            notes.append(f"{RUN_FILE}: the word {word!r} follows no flag")
            i += 1
            continue
        if word.startswith("--"):
            name, _, inline = word[2:].partition("=")
        elif word in SHORT_FLAGS:
            name, inline = SHORT_FLAGS[word], ""
            names[name] = word
        else:
            notes.append(f"{RUN_FILE}: the short flag {word!r} (its long name is not known here)")
            i += 1 + (i + 1 < len(argv) and not argv[i + 1].startswith("-"))
            continue
        if inline:
            args[name] = _value(inline)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and argv[i + 1] not in SHORT_FLAGS:
            args[name] = _value(argv[i + 1])
            i += 2
        else:
            args[name] = True
            i += 1
    env = {str(e["name"]): str(e.get("value", "")) for e in run.get("env") or () if isinstance(e, Mapping)}
    for key in run:
        if key not in ("command", "env"):
            notes.append(f"{RUN_FILE}: {key}: {run[key]!r} (the platform's own setting, not the image's)")
    serving: dict[str, Any] = {"config_path": f"/workspace/{RUN_FILE}", "style": "argv", "command": argv[:first]}
    if names:
        serving["flag_names"] = names
    serving["args"] = args
    if env:
        serving["env"] = env
    return serving


def steps_of(dockerfile: Path, source: Path, out: Path, notes: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The base reference (FROM) and one script step per RUN of ``dockerfile``."""
    require_extra("dockerfile", "preflight", "init --from")
    import dockerfile as parser

    try:
        commands = parser.parse_file(str(dockerfile))
    except (parser.GoParseError, OSError) as exc:
        raise ConfigError(f"the Dockerfile cannot be read: {exc}", location=Location(str(dockerfile))) from exc
    base = ""
    workdir = "/"
    copies: list[tuple[str, str]] = []  # (dest in the image, folder relative to the manifest)
    env: dict[str, str] = {}
    steps: list[dict[str, Any]] = []
    for c in commands:
        cmd = c.cmd.upper()
        where = f"Dockerfile:{c.start_line}"
        if cmd == "FROM":
            if base:
                notes.append(f"{where}: a second FROM (multi-stage builds): only the first is the base")
            else:
                base = c.value[0]
        elif cmd == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, c.value[0]))
        elif cmd == "ENV":
            env.update(dict(zip(c.value[::2], c.value[1::2], strict=False)))
        elif cmd in ("COPY", "ADD"):
            values = [v for v in c.value if not v.startswith("--")]
            if c.flags or len(values) != 2 or not (source / values[0]).is_dir():
                notes.append(f"{where}: {c.original} (only `COPY FOLDER DEST` of a folder of the repository)")
                continue
            dest = posixpath.normpath(posixpath.join(workdir, values[1]))
            rel = os.path.relpath(source / values[0], out)
            copies.append((dest, Path(rel).as_posix()))
        elif cmd == "RUN":
            text = " ".join(c.value)
            folder = next(((d, r) for d, r in reversed(copies) if workdir == d or d in text), None)
            if folder is None:
                notes.append(f"{where}: RUN {text[:80]} (no COPY'd folder of the repository where it runs)")
                continue
            step: dict[str, Any] = {"id": f"run-{len(steps) + 1}", "kind": "script",
                                    "why": f"{where} as the team wrote it",
                                    "directory": folder[1], "dest": folder[0], "workdir": workdir,
                                    "command": ["bash", "-c", text]}
            if env:
                step["env"] = dict(env)
            steps.append(step)
        elif cmd in ("CMD", "ENTRYPOINT", "EXPOSE"):
            notes.append(f"{where}: {cmd} (the server's command comes from {RUN_FILE})")
        else:
            notes.append(f"{where}: {c.original[:80]}")
    if not base:
        raise ConfigError("the Dockerfile has no FROM", location=Location(str(dockerfile)))
    return base, steps


def adopt(source: Path, out: Path, *, base: str | None = None) -> Adoption:
    """The manifest reproducing ``source``'s build (``base``: a local image instead of the Dockerfile's FROM)."""
    source, out = source.resolve(), out.resolve()
    notes: list[str] = []
    dockerfile, run_file = source / "Dockerfile", source / RUN_FILE
    for path in (dockerfile, run_file):
        if not path.is_file():
            raise ConfigError(f"{source} has no root {path.name}", expected=f"{path}",
                              hint="init --from reads a team repository's root Dockerfile and computility-run.yaml")
    from_ref, steps = steps_of(dockerfile, source, out, notes)
    run = yaml.safe_load(run_file.read_text(encoding="utf-8")) or {}
    if not isinstance(run, Mapping):
        raise ConfigError(f"{RUN_FILE} is not a mapping", location=Location(str(run_file)))
    target: dict[str, Any] = {
        "description": f"adopted from {source} (root Dockerfile, {RUN_FILE})",
        "base": {"image": base or from_ref},
        "package": {"import": "vllm", "distribution": "vllm", "version": "*"},
    }
    if base and base != from_ref:
        notes.append(f"Dockerfile FROM {from_ref}: the base is the local image {base} (--base)")
    record = source / "vendor-api.json"
    if record.is_file():
        target["vendor_api"] = Path(os.path.relpath(record, out)).as_posix()
    else:
        notes.append("no vendor-api.json at the repository's root: take one on the card "
                     "(imageforge probe --in-place --out vendor-api.json) for preflight's vendor checks")
    target["steps"] = steps
    target["serving"] = serving_of(run, notes)
    return Adoption({"version": 1, "default_target": TARGET, "targets": {TARGET: target}}, notes)


def write_adopted(source: Path, out: Path, *, base: str | None = None, force: bool = False) -> tuple[Path,
                                                                                                      list[str]]:
    """Write OUT/build.yaml (refusing to overwrite one unless ``force``); the lines not translated."""
    path = out / "build.yaml"
    if path.exists() and not force:
        raise ConfigError(f"{path} exists", hint="--force to overwrite it, or --dir another folder")
    adoption = adopt(source, out, base=base)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(adoption.text(source), encoding="utf-8")
    return path, adoption.untranslated


__all__: Sequence[str] = ("Adoption", "adopt", "write_adopted")
