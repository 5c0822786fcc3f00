"""Does a patched or overlaid ``.py`` file still work as Python? Pure, standard library only.

:func:`check_python` is what every patch and overlay of a ``.py`` file goes through, in the build,
``check-patches``, the in-place apply and the submission's generated applier (which embeds this
module's source, as it embeds :mod:`imageforge.patches.anchored`):

1. ``compile(text, path, "exec", dont_inherit=True)``: a syntax or indentation error;
2. ``ast.parse(text, feature_version=<the base's Python>)``: syntax newer than the base's Python
   (the vendor's is 3.10; this machine's 3.11);
3. every name the step's lines *load* is bound in its scope: a parameter, a local, an enclosing
   function's name, a module global (assigned, imported, def/class, or declared ``global`` and
   assigned anywhere) or a builtin. A NameError compiles fine, so only this finds it. A module with a
   ``from X import *`` binds names nobody can list: its globals are not checked (said in the result).
   Scopes come from :mod:`symtable` (the compiler's own), matched to the AST by kind, name and line.
"""

from __future__ import annotations

import ast
import builtins
import symtable
import sys
from collections.abc import Iterable
from dataclasses import dataclass

#: Names every module has without binding them.
MODULE_NAMES = frozenset({"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__",
                          "__path__", "__builtins__", "__cached__", "__annotations__", "__dict__",
                          "__debug__", "__class__", "__qualname__", "__module__"})

_SCOPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)
_TABLE_NAMES = {ast.Lambda: "lambda", ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp",
                ast.GeneratorExp: "genexpr"}


@dataclass(frozen=True)
class PyProblem:
    """Why the file does not work: the 1-based line, the error, the lines around it."""

    path: str
    line: int
    error: str
    context: str  # the lines around ``line``, numbered, the line itself marked ">"

    def text(self) -> str:
        return f"{self.path}, line {self.line}: {self.error}\n{self.context}"


def parse_version(version: str) -> tuple[int, int] | None:
    """``"3.10.12"`` -> ``(3, 10)``; None when it is not such a string."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def context_lines(text: str, line: int, around: int = 2) -> str:
    lines = text.splitlines()
    lo, hi = max(1, line - around), min(len(lines), line + around)
    width = len(str(hi))
    return "\n".join(f"{'>' if n == line else ' '} {n:>{width}} | {lines[n - 1]}" for n in range(lo, hi + 1))


def _syntax(text: str, path: str, exc: SyntaxError, why: str = "") -> PyProblem:
    line = int(exc.lineno or 1)
    name = type(exc).__name__
    message = f"{name}: {exc.msg}" + (f" ({why})" if why else "")
    return PyProblem(path, line, message, context_lines(text, line))


def _module_bound(top: symtable.SymbolTable) -> tuple[set[str], bool]:
    """Names bound at module level (incl. ``global`` + assigned in any function) and whether a star import is there."""
    bound: set[str] = set()
    star = False
    stack = [top]
    while stack:
        table = stack.pop()
        for sym in table.get_symbols():
            name = sym.get_name()
            if name == "*":
                star = True
                continue
            binds = sym.is_assigned() or sym.is_imported()
            if (table is top and (binds or sym.is_namespace())) or (table is not top and sym.is_declared_global()
                                                                    and binds):
                bound.add(name)
        stack.extend(table.get_children())
    return bound, star


class _Loads(ast.NodeVisitor):
    """(name, line, column, scope table) of every loaded ``Name`` on the wanted lines."""

    def __init__(self, top: symtable.SymbolTable, lines: set[int] | None) -> None:
        self.lines = lines
        self.stack: list[symtable.SymbolTable | None] = [top]
        self.used: set[int] = set()
        self.found: list[tuple[str, int, int, symtable.SymbolTable]] = []

    def _child(self, node: ast.AST) -> symtable.SymbolTable | None:
        table = self.stack[-1]
        if table is None:
            return None
        name = _TABLE_NAMES.get(type(node)) or getattr(node, "name", "")
        line = getattr(node, "lineno", 0)
        for child in table.get_children():
            if id(child) in self.used:
                continue
            if child.get_name() == name and child.get_lineno() == line:
                self.used.add(id(child))
                return child
        return None  # unknown scope layout (a newer Python's annotation scopes): not checked

    def _scoped(self, node: ast.AST) -> None:
        # decorators, defaults, bases and annotations belong to the enclosing scope
        inner: list[ast.AST] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            outer: list[ast.AST] = [*node.decorator_list, *node.args.defaults,
                                    *(d for d in node.args.kw_defaults if d is not None)]
            outer += [a.annotation for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                                             node.args.vararg, node.args.kwarg) if a is not None and a.annotation]
            if node.returns is not None:
                outer.append(node.returns)
            inner = list(node.body)
        elif isinstance(node, ast.ClassDef):
            outer = [*node.decorator_list, *node.bases, *node.keywords]
            inner = list(node.body)
        elif isinstance(node, ast.Lambda):
            outer = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            inner = [node.body]
        else:  # a comprehension: its first iterable is evaluated outside
            gens = node.generators  # type: ignore[attr-defined]
            outer = [gens[0].iter]
            inner = [gens[0].target, *gens[0].ifs]
            for g in gens[1:]:
                inner += [g.target, g.iter, *g.ifs]
            inner += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]  # type: ignore[attr-defined]
        for n in outer:
            self.visit(n)
        self.stack.append(self._child(node))
        for n in inner:
            self.visit(n)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scoped
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scoped

    def visit_Name(self, node: ast.Name) -> None:
        table = self.stack[-1]
        if (isinstance(node.ctx, ast.Load) and table is not None
                and (self.lines is None or node.lineno in self.lines)):
            self.found.append((node.id, node.lineno, node.col_offset, table))


def unbound_names(tree: ast.AST, top: symtable.SymbolTable, lines: set[int] | None) -> list[tuple[str, int]]:
    """(name, line) of each name loaded on ``lines`` (every line when None) that nothing binds."""
    module, star = _module_bound(top)
    star = star or any(isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
                       for node in ast.walk(tree))
    known = module | MODULE_NAMES | set(dir(builtins))
    walker = _Loads(top, lines)
    walker.visit(tree)
    out: list[tuple[str, int]] = []
    for name, line, _col, table in walker.found:
        try:
            sym = table.lookup(name)
        except KeyError:
            continue
        if table is not top and (sym.is_local() or sym.is_parameter() or sym.is_free()):
            continue
        if table is top and (sym.is_assigned() or sym.is_imported() or sym.is_namespace()):
            continue
        if table.get_type() == "class" and (sym.is_assigned() or sym.is_namespace() or sym.is_imported()):
            continue
        if name in known or star:
            continue
        out.append((name, line))
    return out


def check_python(text: str, path: str, *, python_version: str = "", lines: Iterable[int] | None = None,
                 ) -> PyProblem | None:
    """The first problem of ``text`` as a Python file, or None. ``lines``: the step's lines (1-based;
    None = the whole file) whose loaded names must be bound."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return _syntax(text, path, exc)
    except ValueError as exc:  # a NUL byte
        return PyProblem(path, 1, f"ValueError: {exc}", context_lines(text, 1))
    wanted = parse_version(python_version)
    feature = None if wanted is None else min(wanted, (sys.version_info[0], sys.version_info[1]))
    try:
        code_tree = ast.parse(text, path, feature_version=feature)
    except SyntaxError as exc:
        assert feature is not None
        return _syntax(text, path, exc, f"Python {feature[0]}.{feature[1]}, the base image's")
    wanted_lines = None if lines is None else set(lines)
    if wanted_lines is not None and not wanted_lines:
        return None  # no step lines: compile and parse only (what verify checks)
    try:
        top = symtable.symtable(text, path, "exec")
    except SyntaxError as exc:  # pragma: no cover - compile() above accepted it
        return _syntax(text, path, exc)
    missing = unbound_names(code_tree, top, wanted_lines)
    if missing:
        name, line = missing[0]
        more = f" (and {', '.join(sorted({n for n, _ in missing[1:]} - {name}))})" if len(missing) > 1 else ""
        more = "" if more == " ()" else more
        return PyProblem(path, line, f"NameError: name {name!r} is not bound in its scope{more} "
                         f"(not a parameter, local, enclosing, module or builtin name)", context_lines(text, line))
    return None
