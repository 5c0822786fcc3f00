"""``imageforge init --from DIR``: a team's existing repository (root ``Dockerfile`` + ``computility-run.yaml``)
adopted as a build.yaml that reproduces its build, with what could not be translated said.

The Dockerfile is read with Docker's own parser (the ``dockerfile`` package), the run file with PyYAML, each RUN's
shell with ``bashlex``. Each RUN becomes a ``script`` step over the folder a COPY put where it runs (``directory``
-> ``dest``): a RUN as teams write them (``chmod +x X && bash X 2>&1 | tee LOG; echo done``) becomes ``command:
[bash, X]`` (the permission change, the log copy and the trailing echo dropped, each said; the exit code the RUN
discarded is kept: the step fails when the script does), one that is more than that stays ``[bash, -c, RUN]`` as
written and is said. ``touches:`` come from running each step in a throwaway container of the base (the caller's
``scan``: :mod:`imageforge.preflight.touches`). The run file's argv becomes ``serving`` (style argv: its command,
each flag an ``args`` entry; short names through ``flag_names``) and its env ``serving.env``; a
``vendor-api.json`` at DIR's root is named by the target.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
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


#: What a RUN may do besides running its one script, dropped when it is translated (why, for the note).
DROPPED: Mapping[str, str] = {"chmod": "the script runs through its interpreter, no execute bit needed",
                              "echo": "output only", "true": "does nothing", ":": "does nothing",
                              "set": "shell options of the RUN's own shell"}
#: Interpreters a RUN's script runs with (``bash X``), besides ``./X``.
RUNNERS = frozenset({"bash", "sh", "python3", "python"})
#: Paths a script's run may change that are not part of the image it builds (logs, caches, the kernel's).
VOLATILE = ("/tmp", "/var/tmp", "/root/.cache", "/run", "/dev", "/proc", "/sys")


@dataclass(frozen=True)
class RunTranslation:
    """A RUN's shell line as the argv it runs: ``command`` in ``workdir``, what was dropped said in ``notes``."""

    command: tuple[str, ...]
    workdir: str
    notes: tuple[str, ...] = ()


def _words(node: Any) -> list[str] | None:
    """A simple command's words (quotes removed); None when one holds an expansion (known only at run time)."""
    words = [part for part in node.parts if part.kind == "word"]
    if any(getattr(w, "parts", None) for w in words):
        return None
    return [str(w.word) for w in words]


def translate_run(text: str, workdir: str) -> RunTranslation | str:
    """The one script a RUN runs, as argv (``bashlex`` reads the shell line), or why it is more than that.

    Translated: ``&&``/``;`` lists of ``cd DIR`` (before the script: its workdir), ``chmod``, ``echo``, ``true``,
    ``set``, and one ``bash X [ARGS]`` / ``sh X`` / ``python3 X`` / ``./X`` whose redirections and ``| tee LOG``
    only copy its output. A RUN that discarded the script's exit code (``| tee`` without pipefail, a ``;`` after
    it) is said: the step keeps the exit code.
    """
    require_extra("bashlex", "preflight", "init --from")
    import bashlex
    import bashlex.errors

    try:
        trees = bashlex.parse(text)
    except (bashlex.errors.ParsingError, NotImplementedError, IndexError) as exc:
        return f"its shell line does not parse ({exc})"
    if len(trees) != 1:
        return "more than one command list"
    items = trees[0].parts if trees[0].kind == "list" else [trees[0]]
    main: list[str] | None = None
    cwd, pipefail, errexit = workdir, False, False
    notes: list[str] = []
    lost: list[str] = []

    def shown(node: Any) -> str:
        return text[node.pos[0]:node.pos[1]]

    for item in items:
        if item.kind == "operator":
            if item.op not in ("&&", ";"):
                return f"the operator {item.op!r} (only `&&` and `;`)"
            after = "a `;` after it"
            if item.op == ";" and main is not None and not errexit and after not in lost:
                lost.append(after)
            continue
        command, tee = item, None
        if item.kind == "pipeline":
            parts = [p for p in item.parts if p.kind == "command"]
            tee_words = _words(parts[1]) if len(parts) == 2 else None
            if not tee_words or tee_words[0] != "tee":
                return f"the pipeline `{shown(item)}` (only `SCRIPT | tee LOG`)"
            command, tee = parts[0], parts[1]
        if command.kind != "command":
            return f"`{shown(command)}` (a {command.kind}, not a simple command)"
        words = _words(command)
        if not words:
            return f"`{shown(command)}` (a word expanded at run time)"
        name = words[0]
        if tee is None and name in DROPPED:
            pipefail |= name == "set" and "pipefail" in words
            errexit |= name == "set" and ("errexit" in words or any(
                w.startswith("-") and not w.startswith("--") and "e" in w for w in words[1:]))
            notes.append(f"`{shown(command)}` dropped ({DROPPED[name]})")
            continue
        if tee is None and name == "cd" and len(words) == 2 and main is None:
            cwd = posixpath.normpath(posixpath.join(cwd, words[1]))
            continue
        if (name in RUNNERS and len(words) >= 2 and not words[1].startswith("-")) or name.startswith("./"):
            if main is not None:
                return f"`{shown(command)}` (a second script: one step runs one)"
            main = words
            redirects = [shown(p) for p in command.parts if p.kind == "redirect"]
            if redirects or tee is not None:
                copied = " ".join([*redirects, *([f"| {shown(tee)}"] if tee is not None else [])])
                notes.append(f"`{copied}` dropped (a copy of the script's output; the build log has it)")
            if tee is not None and not pipefail:
                lost.append("`| tee` without pipefail")
            continue
        return f"`{shown(command)}` (only one script run, with cd, chmod, echo, set around it)"
    if main is None:
        return "no script runs in it"
    if lost:
        notes.append(f"the RUN discarded {main[0] if len(main) == 1 else main[1]}'s exit code ("
                     + ", ".join(lost) + "): the step keeps it, a failing script fails the build")
    return RunTranslation(tuple(main), cwd, tuple(notes))


@dataclass(frozen=True)
class Touches:
    """What running the adopted steps in a throwaway container of the base changed (the caller's scan):
    ``changed`` step id -> (path, docker diff kind: 0 changed, 1 added, 2 deleted); ``site`` the package's site
    directory there; ``failed`` step id -> why its script failed; ``skipped`` why nothing was scanned."""

    changed: Mapping[str, Sequence[tuple[str, int]]] = field(default_factory=dict)
    site: str = ""
    failed: Mapping[str, str] = field(default_factory=dict)
    skipped: str = ""


def touches_of(changes: Sequence[tuple[str, int]], site: str, dest: str | None) -> list[str]:
    """The ``touches:`` of one script's changes: every file it changed, added or removed, a folder it added as
    one entry; not its own copied folder (``dest``), nor logs and caches (:data:`VOLATILE`); under the site
    directory relative to it."""
    keep: dict[str, int] = {}
    for path, change in changes:
        if dest and (path == dest or path.startswith(dest.rstrip("/") + "/") or dest.startswith(path + "/")):
            continue
        if any(path == v or path.startswith(v + "/") for v in VOLATILE):
            continue
        keep[path] = change
    out: list[str] = []
    for path, change in keep.items():
        if posixpath.dirname(path) in keep and keep[posixpath.dirname(path)] == 1:
            continue  # inside a folder it added: that folder is the entry
        if change == 0 and any(other.startswith(path + "/") for other in keep):
            continue  # a folder changed by what changed in it
        out.append(path[len(site.rstrip("/")) + 1:] if site and path.startswith(site.rstrip("/") + "/") else path)
    return sorted(out)


#: Runs the steps of the build.yaml written at the path given, in a throwaway container of its base.
TouchScan = Callable[[Path], Touches]


@dataclass
class Adoption:
    manifest: dict[str, Any]
    untranslated: list[str] = field(default_factory=list)

    def steps(self) -> list[dict[str, Any]]:
        return [s for t in self.manifest["targets"].values() for s in t.get("steps", ())]

    def add_touches(self, scan: Touches) -> None:
        """Each script step's ``touches:`` from the scan, or why it has none (said with the untranslated)."""
        if scan.skipped:
            self.untranslated.append(f"touches: could not be scanned ({scan.skipped}); add each step's `touches:` "
                                     "by hand for apply --in-place")
            return
        for step in self.steps():
            sid = step["id"]
            if sid in scan.failed:
                self.untranslated.append(f"{step['why'].split(' ')[0]}: the script failed in the base "
                                         f"({scan.failed[sid]}): its touches are what it changed before that")
            if sid not in scan.changed:
                self.untranslated.append(f"{step['why'].split(' ')[0]}: touches: not scanned (a script before "
                                         "it failed)")
                continue
            step["touches"] = touches_of(scan.changed[sid], scan.site, step.get("dest"))

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
            argv, runs_in = (list(c.value), workdir) if c.json else (["bash", "-c", text], workdir)
            said: list[str] = []
            if not c.json:
                translated = translate_run(text, workdir)
                if isinstance(translated, str):
                    said.append(f"{where}: RUN kept as written (`bash -c`): {translated}")
                else:
                    argv, runs_in = list(translated.command), translated.workdir
                    said += [f"{where}: {note}" for note in translated.notes]
            folder = next(((d, r) for d, r in reversed(copies) if runs_in == d or d in text), None)
            if folder is None:
                notes.append(f"{where}: RUN {text[:80]} (no COPY'd folder of the repository where it runs)")
                continue
            notes += said
            step: dict[str, Any] = {"id": f"run-{len(steps) + 1}", "kind": "script",
                                    "why": f"{where} as the team wrote it",
                                    "directory": folder[1], "dest": folder[0], "workdir": runs_in,
                                    "command": argv}
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


def write_adopted(source: Path, out: Path, *, base: str | None = None, force: bool = False,
                  scan: TouchScan | None = None) -> tuple[Path, list[str]]:
    """Write OUT/build.yaml (refusing to overwrite one unless ``force``); the lines not translated. With ``scan``,
    the steps run on the base once the file is written, and it is written again with their ``touches:``."""
    path = out / "build.yaml"
    if path.exists() and not force:
        raise ConfigError(f"{path} exists", hint="--force to overwrite it, or --dir another folder")
    adoption = adopt(source, out, base=base)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(adoption.text(source), encoding="utf-8")
    if scan is not None and adoption.steps():
        adoption.add_touches(scan(path))
        path.write_text(adoption.text(source), encoding="utf-8")
    return path, adoption.untranslated


__all__: Sequence[str] = ("Adoption", "RunTranslation", "Touches", "adopt", "touches_of", "translate_run",
                          "write_adopted")
