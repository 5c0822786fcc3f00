"""Functions replaced at run time, against every call of the function they replace in the final tree.

A patch that installs its own function over a module's (``ops.reshape_and_cache = patched_reshape_and_cache``,
``setattr(ops, "reshape_and_cache", patched)``, ``sorted_moe.GROUP_BY_EXPERT = ext.group_by_expert``) changes
what every ``ops.reshape_and_cache(...)`` of the tree calls: the replacement must accept each of those calls
(vLLM passes 8 arguments to a patched function that takes 7: a TypeError on the card, at the first request).
Read with :mod:`ast`: the replacement's ``def`` (in the same file, or imported from a module of the tree) or
``lambda`` gives its parameter list, an extension's function its signature in the vendor API record, and each
call's shape is bound to it by the one arity check, :func:`imageforge.vendor_api.calls.check_call`.

Calls that see the replacement: ``M.f(...)`` through any alias of module ``M`` (errors); a bare ``f(...)`` inside
``M`` itself (a global lookup: errors); ``from M import f`` then ``f(...)`` (warnings: the name is bound when the
importing module loads, so the call sees the replacement only when the patch ran before).
"""

from __future__ import annotations

import ast
import hashlib
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..vendor_api import VendorApi
from ..vendor_api.calls import call_shape, check_call, describe, parse_signature
from .findings import Finding
from .tree import FinalTree

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Replacement:
    """``module.name`` replaced by the function ``function`` (its ``signature``) defined at ``def_path:def_line``,
    installed at ``path:line``."""

    module: str
    name: str
    path: str
    line: int
    step: str | None
    function: str
    def_path: str  # the file of its def (the vendor API record for a recorded extension function)
    def_line: int | None
    signature: str


@dataclass(frozen=True)
class CallSite:
    module: str
    name: str
    path: str
    line: int
    column: int
    shape: tuple[int, tuple[str, ...], bool, bool]  # calls.call_shape
    described: str
    early: bool  # through ``from M import f``: bound at import time


@dataclass(frozen=True)
class _Scope:
    """A file's names bound to modules and to members of modules (``from M import n``)."""

    modules: dict[str, str]
    members: dict[str, tuple[str, str]]


def signature_of(args: ast.arguments) -> str:
    """A ``def``'s or ``lambda``'s parameter list as signature text (``"(a, b=1, *, c)"``)."""
    return f"({ast.unparse(args)})"


def dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


class Replacements:
    """Collects replacements and calls over the files it is shown, then matches them (:meth:`findings`)."""

    def __init__(self, tree: FinalTree, api: VendorApi | None,
                 module_ast: Callable[[str], ast.Module | None]) -> None:
        self.tree = tree
        self.api = api
        self.module_ast = module_ast
        self.found: dict[tuple[str, str, str, int], Replacement] = {}
        self._scanned: list[tuple[str, tuple[str, ...], ast.Module, _Scope]] = []
        self._seen: set[tuple[str, str]] = set()
        self._modules: dict[tuple[str, tuple[str, ...]], bool] = {}

    # ----------------------------------------------------------------- names
    def is_module(self, name: str, roots: tuple[str, ...]) -> bool:
        key = (name, roots)
        if key not in self._modules:
            self._modules[key] = ((self.api is not None and self.api.has_module(name))
                                  or self.tree.find_module(name, roots) is not None)
        return self._modules[key]

    def _scope(self, path: str, tree: ast.Module, roots: tuple[str, ...]) -> _Scope:
        modules: dict[str, str] = {}
        members: dict[str, tuple[str, str]] = {}
        here = self.tree.module_of(path, roots)
        package = (here if path.endswith("/__init__.py") else (here or "").rpartition(".")[0]) if here else ""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        modules[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        modules[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    if not package:
                        continue
                    parts = package.split(".")
                    up = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join([*up, *([base] if base else [])])
                for a in node.names:
                    if a.name == "*":
                        continue
                    full = f"{base}.{a.name}"
                    if self.is_module(full, roots):
                        modules[a.asname or a.name] = full
                    else:
                        members[a.asname or a.name] = (base, a.name)
        return _Scope(modules, members)

    def _target(self, node: ast.AST, scope: _Scope, roots: tuple[str, ...]) -> tuple[str, str] | None:
        """(module, name) that the expression ``alias.x.f`` names, when ``alias.x`` is a module."""
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if not rest or head not in scope.modules:
            return None
        module, _, name = f"{scope.modules[head]}.{rest}".rpartition(".")
        return (module, name) if self.is_module(module, roots) else None

    def _module_def(self, module: str, name: str, roots: tuple[str, ...]) -> tuple[str, FuncDef] | None:
        found = self.tree.find_module(module, roots)
        if found is None or found[0] != "source":
            return None
        source = self.module_ast(found[1])
        if source is None:
            return None
        fn = next((s for s in source.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and s.name == name), None)
        return (found[1], fn) if fn is not None else None

    def _function(self, value: ast.expr, path: str, tree: ast.Module, scope: _Scope, roots: tuple[str, ...],
                  at: int) -> tuple[str, str, int | None, str] | None:
        """(name, def path, def line, signature) of the function ``value`` is; None when not readable."""
        if isinstance(value, ast.Lambda):
            return "<lambda>", path, value.lineno, signature_of(value.args)
        if isinstance(value, ast.Name):
            defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == value.id]
            if defs:
                before = [d for d in defs if d.lineno < at]
                fn = max(before, key=lambda d: d.lineno) if before else defs[0]
                return fn.name, path, fn.lineno, signature_of(fn.args)
            return self._defined(*scope.members[value.id], roots) if value.id in scope.members else None
        target = self._target(value, scope, roots)
        return self._defined(*target, roots) if target is not None else None

    def _defined(self, module: str, name: str, roots: tuple[str, ...]) -> tuple[str, str, int | None, str] | None:
        """``module.name`` as a function: its ``def`` in the tree, else its recorded signature (an extension's:
        ``native build`` or the probe wrote it)."""
        found = self._module_def(module, name, roots)
        if found is not None:
            return found[1].name, found[0], found[1].lineno, signature_of(found[1].args)
        member = self.api.member(module, name) if self.api is not None else None
        if member is not None and member.kind == "function" and member.signature is not None \
                and parse_signature(member.signature) is not None:
            assert self.api is not None
            return f"{module}.{name}", self.api.source, None, member.signature
        return None

    # ----------------------------------------------------------------- scanning
    def scan(self, path: str, text: str, tree: ast.Module, roots: tuple[str, ...], step: str | None) -> None:
        """The replacements a file installs and the calls it makes (matched later: a call may come first); a
        file shown twice (the same path and text) is scanned once."""
        key = (path, hashlib.sha256(text.encode("utf-8", "replace")).hexdigest())
        if key in self._seen:
            return
        self._seen.add(key)
        scope = self._scope(path, tree, roots)
        self._scanned.append((path, roots, tree, scope))
        for node in ast.walk(tree):
            installs: list[tuple[ast.AST, ast.expr, int]] = []
            if isinstance(node, ast.Assign):
                installs += [(t, node.value, node.lineno) for t in node.targets if isinstance(t, ast.Attribute)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                  and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and node.args[1].value.isidentifier()):
                obj = dotted_name(node.args[0])
                if obj is not None:
                    synthetic = ast.parse(f"{obj}.{node.args[1].value}", mode="eval").body
                    installs.append((synthetic, node.args[2], node.lineno))
            for target_node, value, line in installs:
                target = self._target(target_node, scope, roots)
                if target is None:
                    continue
                fn = self._function(value, path, tree, scope, roots, line)
                if fn is None:
                    continue
                name, def_path, def_line, signature = fn
                module, attr = target
                self.found[(module, attr, path, line)] = Replacement(module, attr, path, line, step, name,
                                                                     def_path, def_line, signature)

    def targets(self) -> set[tuple[str, str]]:
        return {(r.module, r.name) for r in self.found.values()}

    def names(self) -> list[str]:
        """The replaced functions' names (what a caller's text must contain)."""
        return sorted({r.name for r in self.found.values()})

    def search_dirs(self) -> list[str]:
        """Where the callers are looked for: the package's folder and each replaced module's top-level package."""
        dirs = {posixpath.join(self.tree.site, self.tree.package)}
        for module, _ in self.targets():
            found = self.tree.find_module(module.split(".")[0])
            if found is not None and found[0] in ("source", "package"):
                dirs.add(posixpath.dirname(found[1]) if found[1].endswith("/__init__.py") else found[1])
        return sorted(dirs)

    def callers_command(self) -> list[str]:
        """The argv (grep) that lists the ``.py`` files under :meth:`search_dirs` holding a replaced function's
        name as a word; [] when nothing is replaced. Preflight runs it in the sandbox, then :meth:`add_callers`."""
        names = self.names()
        if not names:
            return []
        return ["grep", "-rlwF", "--include=*.py", *(a for n in names for a in ("-e", n)), "--",
                *self.search_dirs()]

    def add_callers(self, paths: Iterable[str]) -> int:
        """Read ``paths`` of the final tree (the package's files naming a replaced function) for their calls;
        how many were read."""
        done = 0
        for path in paths:
            data = self.tree.read(path)
            if data is None:
                continue
            text = data.decode("utf-8", "replace")
            try:
                parsed = ast.parse(text, path)
            except SyntaxError:
                continue  # py-syntax is the finding of the files preflight checks; a base file is the vendor's
            self.scan(path, text, parsed, self.tree.roots, self.tree.producer(path))
            done += 1
        return done

    def _calls_of(self, targets: set[tuple[str, str]]) -> list[CallSite]:
        out: list[CallSite] = []
        for path, roots, tree, scope in self._scanned:
            here = self.tree.module_of(path, roots)
            local = {name for module, name in targets if module == here}
            names = {name for _, name in targets}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if not ((isinstance(func, ast.Attribute) and func.attr in names)
                        or (isinstance(func, ast.Name) and (func.id in local or func.id in scope.members))):
                    continue
                target: tuple[str, str] | None = None
                early = False
                if isinstance(node.func, ast.Attribute):
                    target = self._target(node.func, scope, roots)
                elif isinstance(node.func, ast.Name):
                    if node.func.id in local and here is not None:
                        target = (here, node.func.id)
                    elif node.func.id in scope.members:
                        target, early = scope.members[node.func.id], True
                if target is None or target not in targets:
                    continue
                out.append(CallSite(target[0], target[1], path, node.lineno, node.col_offset + 1,
                                    call_shape(node), describe(node), early))
        return out

    # ----------------------------------------------------------------- matching
    def findings(self) -> list[Finding]:
        """One finding per (replacement, call it does not accept)."""
        out: list[Finding] = []
        replacements = sorted(self.found.values(), key=lambda r: (r.path, r.line))
        calls = self._calls_of(self.targets())
        seen: set[tuple[str, int | None, str, int]] = set()
        for r in replacements:
            for c in calls:
                if (c.module, c.name) != (r.module, r.name) or (r.def_path, r.def_line, c.path, c.line) in seen:
                    continue
                positional, keywords, star_args, star_kwargs = c.shape
                why = check_call(r.signature, positional, keywords, star_args=star_args, star_kwargs=star_kwargs)
                if why is None:
                    continue
                seen.add((r.def_path, r.def_line, c.path, c.line))
                when = (" (bound by `from ... import`: if the replacement is installed before that import)"
                        if c.early else "")
                defined = r.def_path if r.def_line is None else f"{r.def_path}:{r.def_line}"
                # on the replacement's def; a recorded extension function: where it is installed
                path, line = (r.def_path, r.def_line) if r.def_line is not None else (r.path, r.line)
                out.append(Finding(
                    "call-replaced",
                    f"{r.module}.{r.name} is replaced by {r.function} (installed at {r.path}:{r.line}, defined at "
                    f"{defined}), which does not accept the call at {c.path}:{c.line}: {why}{when}",
                    path, line, step=r.step,
                    expected=f"{r.function} accepting every call of {r.name}",
                    found=f"{r.function}{r.signature}; {c.path}:{c.line}:{c.column} passes {c.described}",
                    hint=self._hint(r), severity="warning" if c.early else None))
        return out

    def _hint(self, r: Replacement) -> str:
        if r.def_line is None:
            return (f"the call must fit the recorded {r.function}{r.signature} ({r.def_path}): change the call, or "
                    "the extension and its record (imageforge native build)")
        original = self._module_def(r.module, r.name, self.tree.roots)
        if original is not None:
            return (f"take the replaced function's parameters: {r.name}{signature_of(original[1].args)} "
                    f"({original[0]}:{original[1].lineno})")
        member = self.api.member(r.module, r.name) if self.api is not None else None
        if member is not None and member.signature:
            return f"take the recorded parameters: {r.name}{member.signature} ({self.api.source if self.api else ''})"
        return f"give {r.function} the parameters every caller of {r.name} passes"
