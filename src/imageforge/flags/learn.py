"""Serving flags, reading: two ways to learn them, both ending in a :class:`~imageforge.flags.model.FlagTable`.

* **static** -- :func:`read_static` parses the source text of the files that build vLLM's parser
  (``STATIC_FILES``: ``vllm/engine/arg_utils.py`` and ``vllm/entrypoints/openai/cli_args.py`` in
  vLLM 0.6.3, where flags are plain ``parser.add_argument("--max-num-seqs", type=int, ...)`` calls)
  with :mod:`ast`; nothing is imported or run. For images whose vLLM needs the device to import
  (the vendor image on a machine without the card). Read the files *after* the steps that change the
  parser (bi100's baseline replaces ``cli_args.py`` and adds ``--reasoning-parser``).
* **introspection** -- :func:`introspection_source` is the Python program to run inside the image
  (``[*INTROSPECT_COMMAND, introspection_source()]``, network off) where vLLM imports without a device
  (cpu): :mod:`imageforge.inimage.list_flags` builds vLLM's own parser (0.32: ``make_arg_parser`` +
  ``FlexibleArgumentParser``), unwraps closure types (``_optional_type``), reads ``BooleanOptionalAction`` and
  the pydantic field metadata (``Gt(0)``, ``Le(1)``) of the config classes, and prints one JSON line;
  :func:`parse_introspection` turns that output into a FlagTable.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, Location
from ..inimage import program
from .model import FlagSpec, FlagTable, FlagType, Range

STATIC_FILES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py")
INTROSPECT_COMMAND = ("python3", "-c")
MARKER = "IMAGEFORGE-FLAGS "
FORMAT = 1


# --------------------------------------------------------------------------- static reader (0.6.3 style)

_TYPE_NAMES: Mapping[str, tuple[FlagType, bool]] = {
    "int": ("int", False),
    "float": ("float", False),
    "str": ("str", False),
    "nullable_str": ("str", True),
    "loads": ("json", False),  # json.loads
    "nullable_kvs": ("str", True),
    "human_readable_int": ("int", False),
}


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _callee_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def flags_from_source(text: str, filename: str) -> list[FlagSpec]:
    """Every ``<x>.add_argument("--flag", ...)`` call in ``text`` as a FlagSpec (positionals are skipped)."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as exc:
        raise ConfigError(
            "cannot read the vLLM parser source",
            location=Location(filename, exc.lineno, exc.offset),
            expected="Python source with parser.add_argument(...) calls",
            found=f"a syntax error: {exc.msg}",
        ) from None
    constants = _module_constants(tree)
    out: list[FlagSpec] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        options = [n for n in names if n.startswith("-")]
        if not options:
            continue
        long = [o for o in options if o.startswith("--")]
        main = long[0] if long else options[0]
        kw = {k.arg: k.value for k in node.keywords if k.arg is not None}
        out.append(_spec_from_call(main, options, kw, f"{filename}:{node.lineno}", constants))
    return sorted(out, key=lambda s: s.origin or "")


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level ``NAME = <literal>`` assignments (``choices=TOOL_PARSERS`` names one)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value)
            if value is not _NOT_LITERAL:
                out[node.targets[0].id] = value
    return out


def _spec_from_call(main: str, options: list[str], kw: Mapping[str, ast.expr], origin: str,
                    constants: Mapping[str, Any] | None = None) -> FlagSpec:
    name = main.lstrip("-")
    aliases = tuple(o for o in options if o != main)
    action = kw.get("action")
    action_text = _literal(action) if isinstance(action, ast.Constant) else _callee_name(action)
    nargs = _literal(kw.get("nargs"))
    multiple = nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1)
    if action_text in ("store_true", "store_false"):
        return FlagSpec(name, "bool", takes_value=False, aliases=aliases, origin=origin)
    if action_text == "BooleanOptionalAction":
        return FlagSpec(name, "bool", negatable=True, takes_value=False, aliases=aliases, origin=origin)
    if action_text == "StoreBoolean":  # 0.6.3: --flag [true|false]
        return FlagSpec(name, "bool", aliases=aliases, origin=origin)
    flag_type: FlagType = "str"
    nullable = False
    type_node = kw.get("type")
    if type_node is not None:
        flag_type, nullable = _TYPE_NAMES.get(_callee_name(type_node) or "", ("any", False))
    if action_text not in (None, "store", "append"):
        flag_type = "any"  # a custom action parses the text itself
    choices: tuple[str, ...] = ()
    choices_node = kw.get("choices")
    raw_choices = (constants or {}).get(choices_node.id) if isinstance(choices_node, ast.Name) else _literal(
        choices_node)
    if isinstance(raw_choices, list | tuple):
        choices = tuple(str(c) for c in raw_choices)
        if all(isinstance(c, str) for c in raw_choices):
            flag_type = "choice"
    return FlagSpec(name, flag_type, choices=choices, multiple=multiple or action_text == "append",
                    nullable=nullable, aliases=aliases, origin=origin)


def read_static(sources: Mapping[str, str], *, label: str | None = None) -> FlagTable:
    """A FlagTable from parser source files: ``{"vllm/engine/arg_utils.py": text, ...}``; later files win."""
    flags: dict[str, FlagSpec] = {}
    for filename, text in sources.items():
        for spec in flags_from_source(text, filename):
            flags[spec.name] = spec
    return FlagTable(flags, label or "the vLLM parser source (" + ", ".join(sources) + ")")


# --------------------------------------------------------------------------- introspection (0.32 style)


def introspection_source() -> str:
    """Python source to run inside the image (``python3 -c SOURCE``): prints one ``IMAGEFORGE-FLAGS {json}`` line.

    The program is :mod:`imageforge.inimage.list_flags`, read as text."""
    return program("list_flags")


_KINDS: Mapping[str, FlagType] = {k: k for k in ("int", "float", "str", "bool", "choice", "json")}


def parse_introspection(output: str) -> FlagTable:
    """The FlagTable from the output of :func:`introspection_source` (other lines, e.g. warnings, are ignored)."""
    lines = [line for line in output.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise ConfigError("the image's vLLM did not list its flags", expected=f"a line starting {MARKER.strip()!r}",
                          found=tail or "no output")
    data = json.loads(lines[-1][len(MARKER):])
    if data.get("format") != FORMAT:
        raise ConfigError("unknown flag listing format", expected=f"format {FORMAT}", found=repr(data.get("format")))
    origin = f"vLLM {data.get('vllm', '?')}'s parser"
    flags: dict[str, FlagSpec] = {}
    for item in data["flags"]:
        b = item.get("bounds") or {}
        rng = None
        if b:
            rng = Range(
                minimum=b.get("gt", b.get("ge")), maximum=b.get("lt", b.get("le")),
                min_exclusive="gt" in b, max_exclusive="lt" in b,
            )
        kind: FlagType = _KINDS.get(item["type"], "any")
        spec = FlagSpec(
            name=item["name"], type=kind, choices=tuple(item.get("choices") or ()), range=rng,
            negatable=bool(item.get("negatable")), takes_value=bool(item.get("takes_value", True)),
            multiple=bool(item.get("multiple")), nullable=bool(item.get("nullable")),
            aliases=tuple(item.get("aliases") or ()), also=tuple(item.get("also") or ()), origin=origin,
        )
        flags[spec.name] = spec
    return FlagTable(flags, f"{origin} ({len(flags)} flags)")
