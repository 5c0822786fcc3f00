"""The comparisons of ``expect.json`` items (``{path: $.x, equals: 1}``): one function per operator.

:data:`PATH_OPS` is every operator's name, in the order messages list them; :func:`compare` applies one
to a value.  ``exists`` and ``count`` look at the list of matches instead (see ``evaluate.evaluate_path``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..serve.openai_wire import short
from .expr import json_type

PATH_OPS = (
    "equals", "not_equals", "one_of", "contains", "not_contains", "matches", "full_match", "gt", "ge", "lt",
    "le", "type", "length", "min_length", "exists", "count", "valid", "parses_as",
)


def schema_errors(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(dict(schema))
    out: list[str] = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))[:5]:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        out.append(f"{where}: {short(error.message, 200)}")
    return out


def _type_ok(value: Any, name: str) -> bool:
    actual = json_type(value)
    if name == "number":
        return actual in ("number", "integer")
    return actual == name



def compare(op: str, value: Any, want: Any) -> str | None:
    """None when ``value <op> want`` holds, else why not."""
    shown = short(value)
    try:
        if op == "equals":
            return None if value == want else f"{shown} != {short(want)}"
        if op == "not_equals":
            return None if value != want else f"is {shown}"
        if op == "one_of":
            return None if value in want else f"{shown} is not one of {short(want)}"
        if op in ("contains", "not_contains"):
            if isinstance(value, str | list | tuple | Mapping):
                inside = want in value
            else:
                return f"{shown} is {json_type(value)}: cannot look inside"
            if op == "contains":
                return None if inside else f"{shown} does not contain {short(want)}"
            return None if not inside else f"{shown} contains {short(want)}"
        if op in ("matches", "full_match"):
            if not isinstance(value, str):
                return f"{shown} is {json_type(value)}, not a string"
            hit = re.search(want, value) if op == "matches" else re.fullmatch(want, value)
            return None if hit else f"{shown} does not {'match' if op == 'matches' else 'fully match'} /{want}/"
        if op in ("gt", "ge", "lt", "le"):
            ok = {"gt": value > want, "ge": value >= want, "lt": value < want, "le": value <= want}[op]
            sign = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[op]
            return None if ok else f"{shown} {sign} {short(want)} is false"
        if op == "type":
            return None if _type_ok(value, want) else f"{shown} is {json_type(value)}, expected {want}"
        if op in ("length", "min_length"):
            if not isinstance(value, str | list | tuple | Mapping):
                return f"{shown} is {json_type(value)}: has no length"
            n = len(value)
            if op == "length":
                return None if n == want else f"length {n}, expected {want}"
            return None if n >= want else f"length {n}, expected at least {want}"
        if op == "valid":
            errors = schema_errors(value, want)
            return None if not errors else "does not validate: " + "; ".join(errors)
        if op == "parses_as":
            if not isinstance(value, str):
                return f"{shown} is {json_type(value)}, not a JSON string"
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                return f"{shown} is not valid JSON ({exc})"
            errors = schema_errors(parsed, want)
            return None if not errors else f"{shown} parses but does not validate: " + "; ".join(errors)
    except TypeError as exc:
        return f"cannot compare {shown} with {short(want)}: {exc}"
    raise ValueError(f"unknown comparison {op}")  # pragma: no cover - the loader refuses it

