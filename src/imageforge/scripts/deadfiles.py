"""The dead-file rule: which ``.py`` files of a script's folder its command runs or imports; the rest are dead.

A folder such as the organisers' ``qwen3_6_scripts/`` holds the files its ``patch_ops.sh`` copies into vLLM, the
patchers it runs (``python3 patch_model_runner.py``) and files nothing uses: the baseline's own
``patch_paged_attention_v2.py`` has a syntax error and is never run nor imported. Verify compiles a changed file
outside the interpreter's import roots only when it is live (:func:`live_files`), and lists the dead ones; the
same function answers for a submission tree's folder.

What counts as run, read from the command and the shell scripts it runs (``bash x.sh`` / ``sh x.sh`` /
``source x.sh`` of a folder file, recursively), a command at a time (``;``, ``&&``, ``||``, ``|``, newlines, the
words ``if``/``then``/``do``/... skipped; leading ``VAR=value``, ``env``, ``exec``, ``nohup``, ``time`` too):

* ``python[X.Y] [options] FILE.py ...``: that file (a ``$VAR/`` prefix is matched by the file's name);
* ``python -m NAME``: ``NAME.py`` or ``NAME/__main__.py`` in the working directory;
* ``./FILE.py`` (a ``.py`` file as the command);
* ``python - <<'EOF'`` / ``python -c CODE``: nothing runs from the folder, but what that code imports counts.

What counts as imported: the ``import`` statements of a live file (or of inline code) naming a module beside it
(``name.py`` or ``name/__init__.py`` in the importer's directory, which Python puts first on ``sys.path``), and
so on. Standard library only (bashlex was tried: it refuses ``[[ ... ]]``, which the real scripts use).
"""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
SHELLS = frozenset({"bash", "sh", "dash"})
PREFIXES = frozenset({"env", "exec", "nohup", "time", "command", "sudo"})
KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "!", "{", "}",
                      "(", ")", "case", "esac"})
SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;"})
OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def _logical_lines(text: str) -> list[tuple[str, str | None]]:
    """(line, heredoc body or None): backslash continuations joined, heredoc bodies taken off their lines."""
    out: list[tuple[str, str | None]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        i += 1
        body: str | None = None
        match = HEREDOC.search(line)
        if match:
            end = match.group(2)
            collected: list[str] = []
            while i < len(lines) and lines[i].strip() != end:
                collected.append(lines[i])
                i += 1
            i += 1
            body = "\n".join(collected) + "\n"
            line = line[:match.start()] + line[match.end():]
        out.append((line, body))
    return out


def _commands(line: str) -> list[list[str]]:
    """The simple commands of one line, as words (an unparsable line: none)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = [[]]
    redirect = False
    for token in tokens:
        if token in SEPARATORS:
            commands.append([])
        elif set(token) <= set("<>&"):
            redirect = True
        elif redirect:
            redirect = False  # the redirection's target
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _strip(words: list[str]) -> list[str]:
    while words and (words[0] in KEYWORDS or words[0] in PREFIXES or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        words = words[1:]
    return words


class _Reader:
    def __init__(self, folder: Path, cwd: str, dest: str) -> None:
        self.folder = folder
        self.dest = posixpath.normpath(dest)  # where the folder is when the command runs (absolute)
        self.cwd = cwd.strip("/")
        self.py = {p.relative_to(folder).as_posix() for p in folder.rglob("*.py") if p.is_file()}
        self.live: dict[str, str] = {}
        self.shells: set[str] = set()

    def resolve(self, word: str, cwd: str) -> str | None:
        """The folder file a word names (relative to the folder), or None."""
        if "$" in word or "`" in word:  # `$DIR/x.py`: the file of that name, if exactly one
            name = posixpath.basename(word)
            hits = sorted(p for p in self.py | self._files() if posixpath.basename(p) == name)
            return hits[0] if len(hits) == 1 else None
        rel = self.relative(posixpath.join(cwd, word))
        if rel is None:
            return None
        return rel if (self.folder / rel).is_file() else None

    def relative(self, path: str) -> str | None:
        """``path`` (relative to the folder, or absolute) as a path inside the folder, or None outside it."""
        if path.startswith("/"):
            path = posixpath.normpath(path)
            if path != self.dest and not path.startswith(self.dest.rstrip("/") + "/"):
                return None
            path = posixpath.relpath(path, self.dest)
        rel = posixpath.normpath(path)
        return None if rel.startswith("..") else rel

    def _files(self) -> set[str]:
        return {p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*.sh") if p.is_file()}

    def mark(self, rel: str, why: str) -> None:
        if rel in self.live or rel not in self.py:
            return
        self.live[rel] = why
        try:
            tree = ast.parse((self.folder / rel).read_bytes())
        except (SyntaxError, ValueError):
            return  # it is run: verify compiles it and reports the error
        self.imports(tree, posixpath.dirname(rel), rel)

    def imports(self, tree: ast.AST, directory: str, who: str) -> None:
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level <= 1:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                path = name.replace(".", "/")
                for candidate in (f"{path}.py", f"{path}/__init__.py"):
                    rel = posixpath.normpath(posixpath.join(directory, candidate))
                    if rel in self.py:
                        self.mark(rel, f"imported by {who}")
                # a package's __init__ runs when a submodule is imported
                parts = path.split("/")
                for depth in range(1, len(parts)):
                    init = posixpath.normpath(posixpath.join(directory, *parts[:depth], "__init__.py"))
                    if init in self.py:
                        self.mark(init, f"imported by {who}")

    def inline(self, code: str, cwd: str, who: str) -> None:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return
        self.imports(tree, cwd, who)

    def command(self, words: Sequence[str], cwd: str, who: str, body: str | None = None) -> None:
        words = _strip(list(words))
        if not words:
            return
        head = posixpath.basename(words[0])
        if PYTHON.fullmatch(head):
            args = list(words[1:])
            while args:
                arg = args.pop(0)
                if arg == "-m" and args:
                    module = args.pop(0).replace(".", "/")
                    for candidate in (f"{module}.py", f"{module}/__main__.py"):
                        rel = self.resolve(candidate, cwd)
                        if rel:
                            self.mark(rel, f"run by {who} (-m)")
                    return
                if arg == "-c" and args:
                    self.inline(args.pop(0), cwd, f"{who} (python -c)")
                    return
                if arg == "-":
                    if body is not None:
                        self.inline(body, cwd, f"{who} (inline python)")
                    return
                if arg in OPTIONS_WITH_VALUE and args:
                    args.pop(0)
                    continue
                if arg.startswith("-"):
                    continue
                rel = self.resolve(arg, cwd)
                if rel:
                    self.mark(rel, f"run by {who}")
                return
            if body is not None:  # `python3 <<EOF`
                self.inline(body, cwd, f"{who} (inline python)")
            return
        if head in SHELLS or head in ("source", "."):
            rest = [w for w in words[1:] if not w.startswith("-")]
            if rest:
                rel = self.resolve(rest[0], cwd)
                if rel:
                    self.script(rel, cwd)
            return
        if words[0].endswith(".py"):
            rel = self.resolve(words[0], cwd)
            if rel:
                self.mark(rel, f"run by {who}")
        elif words[0].endswith(".sh"):
            rel = self.resolve(words[0], cwd)
            if rel:
                self.script(rel, cwd)

    def script(self, rel: str, cwd: str) -> None:
        if rel in self.shells:
            return
        self.shells.add(rel)
        try:
            text = (self.folder / rel).read_text(errors="replace")
        except OSError:
            return
        for line, body in _logical_lines(text):
            for words in _commands(line):
                if words and words[0] == "cd" and len(words) > 1 and "$" not in words[1]:
                    # an absolute cd into the folder (`cd /workspace/scripts`) stays inside it; one outside it
                    # leaves relative names unresolved
                    cwd = self.relative(posixpath.join(cwd, words[1])) or OUTSIDE
                    continue
                self.command(words, cwd, rel, body)


OUTSIDE = "../outside-the-folder"


def live_files(folder: Path, command: Sequence[str], cwd: str = ".", dest: str | None = None) -> dict[str, str]:
    """The ``.py`` files of ``folder`` (paths relative to it) that ``command``, run in ``cwd`` (relative to the
    folder), runs or imports, each with why ("run by patch_ops.sh", "imported by x.py"); the rest are dead.
    ``dest``: where the folder is when the command runs (default: where it is here), for absolute paths."""
    reader = _Reader(folder, cwd, dest or str(folder.resolve()))
    reader.command(command, posixpath.normpath(cwd), "the step's command")
    return dict(sorted(reader.live.items()))


def dead_files(folder: Path, command: Sequence[str], cwd: str = ".", dest: str | None = None) -> tuple[str, ...]:
    """The ``.py`` files of ``folder`` that ``command`` neither runs nor imports (see :func:`live_files`)."""
    live = live_files(folder, command, cwd, dest)
    return tuple(sorted(p for p in (q.relative_to(folder).as_posix() for q in folder.rglob("*.py") if q.is_file())
                        if p not in live))


def live_in_image(folder: Path, dest: str, command: Sequence[str], workdir: str | None) -> Mapping[str, str]:
    """:func:`live_files` of a folder copied to ``dest`` in the image, as image paths."""
    cwd = posixpath.relpath(workdir, dest) if workdir and (workdir == dest or workdir.startswith(dest + "/")) else "."
    return {posixpath.join(dest, rel): why for rel, why in live_files(folder, command, cwd, dest).items()}
