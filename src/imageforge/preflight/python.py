"""Python, statically, for the target's version: parse and compile, imports resolved in the final tree, names
and call arities on the vendor's extension modules against the vendor API record (a native step's extensions
too, once ``native build`` recorded them), functions replaced at run time against their calls
(:mod:`.replacements`), dead files.

Everything is read with the standard library's :mod:`ast` (and ``compile``): no Python runs, no regex reads
Python. A guarded import (inside ``try``/``except``) is checked like any other; its finding says what is
silently off (the statements after it in the ``try`` body never run).
"""

from __future__ import annotations

import ast
import posixpath
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..patches.compiled import Compiled
from ..patches.pycheck import parse_version
from ..vendor_api import VendorApi
from ..vendor_api.calls import call_shape, check_call, describe
from .findings import Finding
from .replacements import Replacements, dotted_name
from .tree import FinalTree

#: Modules of the standard library (this interpreter's list; the target's own is the same for 3.10 imports).
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}


@dataclass(frozen=True)
class PyFile:
    path: str  # image path
    text: str
    step: str | None
    roots: tuple[str, ...]  # where its imports resolve (a script's folder first)
    changed: bool = True  # a file of the final tree's changes (vendor names: errors) or one read from the base
    imports: bool = True  # resolve its imports (False: syntax and vendor names only)


@dataclass(frozen=True)
class ImportUse:
    module: str  # absolute dotted name
    names: tuple[str, ...]  # from M import names ("*" for a star)
    line: int
    column: int
    guard: ast.Try | None
    guard_rest: tuple[int, int] | None  # lines of the try body after the import (what is silently off)


@dataclass
class Scan:
    """The findings and what the walk learnt (modules imported, for dead files)."""

    findings: list[Finding] = field(default_factory=list)
    imported: set[str] = field(default_factory=set)
    parsed: int = 0


def parse(file: PyFile, version: str) -> tuple[ast.Module | None, Finding | None]:
    """The AST with the target's grammar, then ``compile`` by this machine's Python; a finding when either fails
    (its message says so: the target's interpreter, where present, has the last word: :meth:`PythonChecks.compiled`)."""
    feature = parse_version(version) or (3, 10)
    try:
        tree = ast.parse(file.text, file.path, feature_version=feature)
        compile(file.text, file.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return None, Finding("py-syntax", f"{exc.msg} (Python {feature[0]}.{feature[1]}'s grammar, checked by this "
                             f"machine's Python {here}: no target interpreter ran)", file.path, exc.lineno,
                             exc.offset, step=file.step, found=(exc.text or "").strip() or None, hint=SYNTAX_HINT)
    return tree, None


SYNTAX_HINT = "a script under `set -e` stops at the first such file; the rest is never applied"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _guard(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[ast.Try | None, tuple[int, int] | None]:
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Try) and child in parent.body and parent.handlers:
            index = parent.body.index(child)
            rest = parent.body[index + 1:]
            span = (rest[0].lineno, max(getattr(n, "end_lineno", n.lineno) or n.lineno for n in rest)) if rest else None
            return parent, span
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            return None, None
        child, parent = parent, parents.get(parent)
    return None, None


def package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def imports(tree: ast.Module, module: str | None, is_package: bool) -> Iterator[ImportUse]:
    """Every import of the file, absolute names; relative ones against the file's package."""
    parents = _parents(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            guard, rest = _guard(node, parents)
            for alias in node.names:
                yield ImportUse(alias.name, (), node.lineno, node.col_offset + 1, guard, rest)
        elif isinstance(node, ast.ImportFrom):
            guard, rest = _guard(node, parents)
            base = node.module or ""
            if node.level:
                if module is None:
                    continue
                pkg = package_of(module, is_package).split(".") if module else []
                up = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                base = ".".join([*up, *([base] if base else [])])
            yield ImportUse(base, tuple(a.name for a in node.names), node.lineno, node.col_offset + 1, guard, rest)


def top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names bound at a module's top level (defs, classes, assignments, imports, also inside top-level
    if/try/with/for blocks), and whether the module is open-ended (``__getattr__`` or a star import)."""
    names: set[str] = set()
    open_ended = False

    def bind(target: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def visit(body: list[ast.stmt]) -> None:
        nonlocal open_ended
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
                open_ended |= stmt.name == "__getattr__"
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    bind(t)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                bind(stmt.target)
            elif isinstance(stmt, ast.Import):
                names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                for a in stmt.names:
                    if a.name == "*":
                        open_ended = True
                    else:
                        names.add(a.asname or a.name)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                bind(stmt.target)
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        bind(item.optional_vars)
                visit(stmt.body)
            elif isinstance(stmt, ast.If):
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
                for h in stmt.handlers:
                    if h.name:
                        names.add(h.name)
                    visit(h.body)
                visit(stmt.orelse)
                visit(stmt.finalbody)
    visit(tree.body)
    return names, open_ended


class PythonChecks:
    """The Python checks over a final tree (see the module's docstring)."""

    def __init__(self, tree: FinalTree, api: VendorApi | None) -> None:
        self.tree = tree
        self.api = api
        self.scan = Scan()
        self._asts: dict[str, ast.Module | None] = {}
        self._vendor_seen: set[tuple[str, int]] = set()
        self.latent: list[str] = []  # "path:line module.name ..." of each absent name or misfit call, warning level
        self.compiled_files: list[PyFile] = []  # every file checked, in order (what the target's python compiles)
        #: functions installed at run time over a module's (``mod.f = g``), against every call of ``f``
        self.replacements = Replacements(tree, api, self.module_ast)

    # ----------------------------------------------------------------- reading modules of the tree
    def module_ast(self, path: str) -> ast.Module | None:
        if path not in self._asts:
            data = self.tree.read(path)
            try:
                self._asts[path] = None if data is None else ast.parse(data.decode("utf-8", "replace"), path)
            except SyntaxError:
                self._asts[path] = None
        return self._asts[path]

    def external(self, top: str) -> bool:
        """A top-level module found outside the tree's files: the standard library or the record's list."""
        if top in STDLIB:
            return True
        return self.api is not None and top in self.api.top_levels()

    # ----------------------------------------------------------------- one file
    def check(self, file: PyFile) -> None:
        tree, problem = parse(file, self.tree.python_version)
        self.scan.parsed += 1
        self.compiled_files.append(file)
        if problem is not None:
            self.scan.findings.append(problem)
            return
        assert tree is not None
        self.replacements.scan(file.path, file.text, tree, file.roots, file.step)
        module = self.tree.module_of(file.path, file.roots)
        is_package = file.path.endswith("/__init__.py")
        for use in imports(tree, module, is_package) if file.imports else ():
            self.check_import(file, use)
        if self.api is not None:
            self.check_vendor(file, tree, chain=())

    def _import_finding(self, file: PyFile, use: ImportUse, message: str, *, expected: str, found: str,
                        hint: str, check: str = "py-import") -> None:
        if use.guard is not None:
            rest = use.guard_rest
            lines = (f"line {rest[0]}" if rest and rest[0] == rest[1] else f"lines {rest[0]}-{rest[1]}") if rest else ""
            off = (f"{lines} after it in the try block never run{'s' if lines.startswith('line ') else ''}"
                   if rest else "the try block's except branch runs instead")
            message += f" (guarded by try/except at line {use.guard.lineno}: silently off, {off})"
        self.scan.findings.append(Finding(check, message, file.path, use.line, use.column, step=file.step,
                                          expected=expected, found=found, hint=hint))

    def check_import(self, file: PyFile, use: ImportUse) -> None:
        if not use.module:
            return
        top = use.module.split(".")[0]
        self.scan.imported.add(use.module)
        self.scan.imported.update(f"{use.module}.{n}" for n in use.names if n != "*")
        found = self.tree.find_module(use.module, file.roots)
        if found is None:
            if self.tree.find_module(top, file.roots) is None and self.external(top):
                if self.api is not None and self.api.has_module(use.module):
                    for name in use.names:
                        if name != "*" and self.api.lookup(use.module, name) == "absent":
                            self._import_finding(
                                file, use, f"{use.module} has no {name!r} in the vendor API record",
                                expected=f"a name of {use.module} ({self.api.source})", found=name,
                                hint=_near(self.api, use.module, name), check="vendor-name")
                return
            where = ("the final tree, the base's installed packages or the vendor API record"
                     if self.api is not None else "the final tree or the base's installed packages")
            tried = ", ".join(r.rstrip("/") + "/" + use.module.replace(".", "/") for r in file.roots[:2])
            self._import_finding(file, use, f"no module named {use.module!r}", expected=f"a module in {where}",
                                 found=f"nothing at {tried}[.py|/]",
                                 hint="ship it (a COPY of the folder that holds it) or remove the import")
            return
        kind, path = found
        for name in use.names:
            if name == "*":
                continue
            if self.tree.find_module(f"{use.module}.{name}", file.roots) is not None:
                continue
            if kind != "source":
                continue  # a namespace folder or an extension: names not readable here
            if not (top == self.tree.package or self._in_changes(path) or self._shipped(path)):
                continue  # other packages: the module's existence only
            source = self.module_ast(path)
            if source is None:
                continue
            names, open_ended = top_level_names(source)
            if name in names:
                continue
            if open_ended:
                self._import_finding(file, use, f"{name!r} of {use.module} cannot be told statically",
                                     expected=f"{name} bound at the top level of {path}",
                                     found="a module __getattr__ or star import", hint="reported, not failed",
                                     check="py-import-unknown")
                continue
            self._import_finding(file, use, f"cannot import name {name!r} from {use.module!r}",
                                 expected=f"{name} defined at the top level of {path} or a submodule",
                                 found=f"not in {path}" + (f" (written by step {self.tree.producer(path)})"
                                                          if self.tree.producer(path) else ""),
                                 hint=_close(name, names))

    def _in_changes(self, path: str) -> bool:
        return path in self.tree.files

    def _shipped(self, path: str) -> bool:
        return any(path.startswith(f.dest.rstrip("/") + "/") for f in self.tree.folders)

    # ----------------------------------------------------------------- vendor names
    def _aliases(self, tree: ast.AST) -> tuple[dict[str, str], dict[str, tuple[str, str]], dict[str, str]]:
        """Names bound to record modules, to record members (``from M import n``), to package modules."""
        assert self.api is not None
        modules: dict[str, str] = {}
        members: dict[str, tuple[str, str]] = {}
        package: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and self.api.has_module(a.name):
                        modules[a.asname] = a.name
                    elif a.asname and a.name.split(".")[0] == self.tree.package:
                        package[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if self.api.has_module(full):
                        modules[a.asname or a.name] = full
                    elif self.api.has_module(node.module):
                        members[a.asname or a.name] = (node.module, a.name)
                    elif node.module.split(".")[0] == self.tree.package:
                        package[a.asname or a.name] = full
        return modules, members, package

    _dotted = staticmethod(dotted_name)

    def _vendor_target(self, dotted: str, modules: dict[str, str]) -> tuple[str, str] | None:
        """(record module, name) that ``a.b.c`` refers to, through the aliases or the full dotted name."""
        assert self.api is not None
        head, _, rest = dotted.partition(".")
        if not rest:
            return None
        full = f"{modules[head]}.{rest}" if head in modules else dotted
        mod, _, name = full.rpartition(".")
        return (mod, name) if self.api.has_module(mod) else None

    def check_vendor(self, file: PyFile, tree: ast.AST, *, chain: tuple[str, ...],
                     severity: str | None = None) -> None:
        """Names and arities on record modules; calls into the package followed one level (the chain)."""
        assert self.api is not None
        modules, members, package = self._aliases(self._module_scope(file, tree))
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            target: tuple[str, str] | None = None
            call: ast.Call | None = None
            if isinstance(node, ast.Attribute):
                dotted = self._dotted(node)
                target = self._vendor_target(dotted, modules) if dotted else None
                call = calls.get(id(node))
            elif isinstance(node, ast.Name) and node.id in members and isinstance(node.ctx, ast.Load):
                target = members[node.id]
                call = calls.get(id(node))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                dotted = self._dotted(node.args[0])
                if dotted is not None:
                    mod = modules.get(dotted, dotted)
                    target = (mod, node.args[1].value) if self.api.has_module(mod) else None
            if target is None:
                continue
            self._vendor_use(file, node, target, call, chain, severity)
        if not chain:
            self._follow_package_calls(file, tree, package)

    def _module_scope(self, file: PyFile, tree: ast.AST) -> ast.AST:
        """Aliases come from the whole module (a function's body alone misses the module's imports)."""
        if isinstance(tree, ast.Module):
            return tree
        whole = self.module_ast(file.path)
        if whole is None:
            return tree
        return ast.Module(body=[*whole.body, tree], type_ignores=[])  # type: ignore[list-item]

    def _vendor_use(self, file: PyFile, node: ast.AST, target: tuple[str, str], call: ast.Call | None,
                    chain: tuple[str, ...], severity: str | None) -> None:
        assert self.api is not None
        mod, name = target
        key = (file.path, getattr(node, "lineno", 0))
        line, col = getattr(node, "lineno", None), getattr(node, "col_offset", 0) + 1
        via = (" (reached from " + " -> ".join(chain) + ")") if chain else ""
        level = severity or ("error" if file.changed or chain else "warning")
        if self.api.lookup(mod, name) == "absent":
            if key in self._vendor_seen:
                return
            self._vendor_seen.add(key)
            if level == "warning":  # the vendor's own code, nothing changed reaches it: one warning lists them all
                self.latent.append(f"{file.path}:{line} {mod}.{name}" + (f" ({_near(self.api, mod, name)})"
                                                                         if self.api.close_names(mod, name) else ""))
                return
            self.scan.findings.append(Finding(
                "vendor-name", f"{mod} has no {name!r}{via}", file.path, line, col, step=file.step,
                expected=f"a name of {mod} in the vendor API record ({self.api.source})", found=name,
                hint=_near(self.api, mod, name), severity=level))  # type: ignore[arg-type]
            return
        member = self.api.member(mod, name)
        if call is None or member is None or member.kind not in ("function", "class"):
            return
        positional, keywords, star_args, star_kwargs = call_shape(call)
        why = check_call(member.signature, positional, keywords, star_args=star_args, star_kwargs=star_kwargs,
                         bound_method=member.kind == "class" and (member.signature or "").startswith("(self"))
        if why is not None and level == "warning":
            if key not in self._vendor_seen:
                self._vendor_seen.add(key)
                self.latent.append(f"{file.path}:{call.lineno} {mod}.{name}() {why}")
        elif why is not None:
            self.scan.findings.append(Finding(
                "vendor-arity", f"{mod}.{name}() {why}{via}", file.path, call.lineno, call.col_offset + 1,
                step=file.step, expected=f"{name}{member.signature}", found=describe(call),
                hint="the recorded signature comes from the card (imageforge probe); match the call to it",
                severity=level))  # type: ignore[arg-type]

    def _follow_package_calls(self, file: PyFile, tree: ast.AST, package: dict[str, str]) -> None:
        """A changed file's call ``ops.f(...)`` into a package module: f's body is checked as part of the chain."""
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in package):
                continue
            mod = package[node.func.value.id]
            found = self.tree.find_module(mod, file.roots)
            if found is None or found[0] != "source":
                continue
            source = self.module_ast(found[1])
            if source is None:
                continue
            fn = next((s for s in source.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and s.name == node.func.attr), None)
            if fn is None:
                continue
            callee = PyFile(found[1], "", self.tree.producer(found[1]), file.roots, changed=found[1] in self.tree.files)
            link = f"{posixpath.basename(file.path)}:{node.lineno} {node.func.value.id}.{node.func.attr}"
            self._asts.setdefault(found[1], source)
            self.check_vendor(callee, fn, chain=(link,))

    def compiled(self, result: Compiled | None) -> str:
        """What the target's interpreter said of every checked file (:attr:`compiled_files`, compiled in one call;
        None: no interpreter ran); says which was used.

        Its syntax errors replace this machine's check when it is of the grammar's version (the target's own
        compiler has the last word); when it is another (a base whose Python is not the card's, whose version the
        vendor API record gives), both stand: the interpreter's errors, and the grammar's findings."""
        files = self.compiled_files
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        grammar = f"the target's {self.tree.python_version} grammar checked by this machine's Python {here}"
        if result is None:
            return f"{len(files)} .py: {grammar} (no target interpreter ran)"
        same = parse_version(result.python) == parse_version(self.tree.python_version)
        paths = {f.path for f in files}
        local = {f.path for f in self.scan.findings if f.check == "py-syntax" and f.path in paths}
        if same:
            self.scan.findings = [f for f in self.scan.findings if not (f.check == "py-syntax" and f.path in paths)]
        for index, message, line, column, text in result.errors:
            file = files[index]
            if not same and file.path in local:
                continue  # the grammar's finding stands for it
            self.scan.findings.append(Finding(
                "py-syntax", f"{message} (compiled by the target's Python {result.python}, {result.executable})",
                file.path, line, column, step=file.step, found=text or None, hint=SYNTAX_HINT))
        said = f"{len(files)} .py compiled by the target's Python {result.python} ({result.executable})"
        return said if same else f"{said}; {grammar} too (the vendor API record's Python is not the base's)"

    def package_words(self) -> list[str]:
        """The grep argv listing the package's ``.py`` files (every one under its import roots) that name a record
        module as a word (its top-level name, or its last part for the package's own and torch's): the only ones
        that can use a vendor name. [] without a record or a package folder."""
        if self.api is None:
            return []
        found = self.tree.find_module(self.tree.package)
        if found is None or found[0] not in ("source", "package"):
            return []
        folder = posixpath.dirname(found[1]) if found[1].endswith("/__init__.py") else found[1]
        words: set[str] = set()
        for module in self.api.modules:
            parts = module.split(".")
            words.add(parts[-1] if parts[0] in (self.tree.package, "torch") else parts[0])
        return ["grep", "-rlwF", "--include=*.py", *(a for w in sorted(words) for a in ("-e", w)), "--", folder]

    def latent_in(self, paths: Iterable[str]) -> int:
        """The vendor's own references in the package's unchanged modules ``paths`` (the whole tree's, as
        :meth:`package_words` lists them, and the ones read): absent names and misfit calls that nothing changed
        reaches, ONE warning listing them (file:line each). How many files were read."""
        assert self.api is not None
        read = 0
        for path in dict.fromkeys(paths):
            if path in self.tree.files or self._shipped(path):
                continue  # changed code: checked as such (errors)
            source = self.module_ast(path)
            if source is not None:
                read += 1
                self.check_vendor(PyFile(path, "", None, self.tree.roots, changed=False), source, chain=(),
                                  severity="warning")
        if self.latent:
            self.scan.findings.append(Finding(
                "vendor-latent", f"{len(self.latent)} use(s) of the vendor's API that the record does not have or "
                "that do not fit it, in the package's own code no changed code reaches (each fails only when it runs)",
                posixpath.join(self.tree.site, self.tree.package), expected=f"names of the vendor API record "
                f"({self.api.source})", found="\n".join(sorted(self.latent)),
                hint="harmless until a change calls one: preflight then names the chain as an error"))
        return read


def _near(api: VendorApi, module: str, name: str) -> str:
    near = api.close_names(module, name)
    return ("the record has: " + ", ".join(near) if near else f"see {module} in {api.source}")


def _close(name: str, names: set[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, sorted(names), n=3)
    return ("did you mean " + " or ".join(repr(n) for n in near) + "?") if near else \
        "ship the module that defines it, or import it from where it lives"


def dead_files(tree: FinalTree, imported: set[str], run_texts: list[str], live: set[str]) -> list[Finding]:
    """Added .py files of the tree that nothing imports and no script names, and shipped .py files of a step's folder
    that its command neither runs nor imports (``live``: the dead-file rule, :mod:`imageforge.scripts.deadfiles`)."""
    out: list[Finding] = []
    candidates: list[tuple[str, str | None, str | None]] = []
    for f in tree.files.values():
        if f.added and f.path.endswith(".py"):
            candidates.append((f.path, tree.module_of(f.path), f.step))
    for folder in tree.folders:
        for rel in folder.files():
            path = f"{folder.dest.rstrip('/')}/{rel}"
            if rel.endswith(".py") and path not in live:
                candidates.append((path, tree.module_of(path, (folder.dest,)), folder.step))
    for path, module, step in candidates:
        name = posixpath.basename(path)
        if module and (module in imported or any(m.startswith(module + ".") for m in imported)):
            continue
        if any(name in text for text in run_texts):
            continue
        if name == "__init__.py":
            continue
        out.append(Finding("dead-file", "nothing imports this file and no step runs it", path, step=step,
                           hint="remove it from what is shipped, or import/run it where it is meant to apply"))
    return out
