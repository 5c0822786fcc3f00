"""The serving flags the image's vLLM parser knows, listed inside the image (``python3 -c TEXT``).

Standard library only, besides the vLLM it asks. vLLM's CLI parser is built (no engine, no device), each option
read (type, choices, bounds from the config dataclasses' pydantic fields, negation, aliases) and printed as one
``IMAGEFORGE-FLAGS {json}`` line; :func:`imageforge.flags.learn.parse_introspection` reads it (format 1).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

TYPE_CHECKING = False  # typing is not imported at run time
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

MARKER = "IMAGEFORGE-FLAGS "


def first(*names: tuple[str, str]) -> tuple[Any, str]:
    """The first ``module.attribute`` of ``names`` that imports, and its module name."""
    for mod, attr in names:
        try:
            return getattr(importlib.import_module(mod), attr), mod
        except (ImportError, AttributeError):
            continue
    raise SystemExit("imageforge: no vLLM parser found in " + ", ".join(m for m, _ in names))


def unwrap(t: Any, depth: int = 0) -> str | None:
    """The flag type a parser's ``type=`` callable stands for (through closures, 3 deep)."""
    if t is None:
        return None
    if t in (int, float, str):
        return str(t.__name__)
    if t is json.loads:
        return "json"
    name = getattr(t, "__qualname__", "") or getattr(t, "__name__", "")
    if "parse_dataclass" in name or "union_dict_and_str" in name or name.endswith("loads"):
        return "json"
    if "human_readable_int" in name:
        return "int"
    for cell in getattr(t, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if callable(inner) and depth < 3:
            found = unwrap(inner, depth + 1)
            if found:
                return found
    return "any"


def bounds(dest: str, group_of: dict[str, str], homes: list[ModuleType]) -> dict[str, Any]:
    """``gt``/``ge``/``lt``/``le`` of the config dataclass field behind ``dest`` (its group's class), if any."""
    title = group_of.get(dest) or ""
    for home in homes:
        for cls_name in (title, title + "Args"):
            cls = getattr(home, cls_name, None)
            fields = getattr(cls, "__pydantic_fields__", None) or {}
            info = fields.get(dest)
            if info is None:
                continue
            out = {}
            for meta in getattr(info, "metadata", ()):
                for key in ("gt", "ge", "lt", "le"):
                    value = getattr(meta, key, None)
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        out[key] = value
            return out
    return {}


def listing() -> dict[str, Any]:
    """The parser's flags, as :func:`imageforge.flags.learn.parse_introspection` reads them."""
    parser_class, _ = first(("vllm.utils.argparse_utils", "FlexibleArgumentParser"),
                            ("vllm.utils", "FlexibleArgumentParser"))
    make, cli_module = first(("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
                             ("vllm.entrypoints.openai.cli_args", "make_arg_parser"))
    parser = make(parser_class())
    vllm = importlib.import_module("vllm")
    try:
        config_module: ModuleType | None = importlib.import_module("vllm.config")
    except ImportError:
        config_module = None
    homes = [m for m in (config_module, sys.modules.get(cli_module), sys.modules.get("vllm.engine.arg_utils")) if m]
    group_of = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            group_of[action.dest] = group.title
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        main = longs[0] if longs else action.option_strings[0]
        negatable = isinstance(action, argparse.BooleanOptionalAction)
        store = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        kind = "bool" if (negatable or store) else unwrap(action.type) or "str"
        qual = getattr(action.type, "__qualname__", "") or ""
        choices = [str(c) for c in action.choices] if action.choices is not None else []
        if choices and kind == "str":
            kind = "choice"
        flags.append({
            "name": main.lstrip("-"), "type": kind, "choices": choices, "bounds": bounds(action.dest, group_of, homes),
            "negatable": negatable, "takes_value": not (negatable or store),
            "multiple": action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction),
            "nullable": "_optional_type" in qual,
            "also": ["auto"] if "or_auto" in qual else [],
            "aliases": [o for o in action.option_strings if o != main and o != "--no-" + main.lstrip("-")],
            "action": type(action).__name__,
        })
    return {"format": 1, "vllm": getattr(vllm, "__version__", "?"), "module": cli_module, "flags": flags}


if __name__ == "__main__":
    print(MARKER + json.dumps(listing()), flush=True)
