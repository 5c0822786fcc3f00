"""build.schema.json's step kinds, made from the registry: ``$defs.step`` (the kind enum, one ``if kind == NAME``
branch per kind) and one ``$defs.NAME_step`` per kind, from the kind class's ``schema`` fragment.

The loader validates against :func:`manifest_schema` (the shipped file with these parts made from the kinds
registered now), so a kind is one module; the shipped file (top-level ``schema/``, read by editors and copied
into a new project) is the same text, rewritten by ``invoke schema`` and compared by
tests/unit/test_step_kinds.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..manifest.yaml_schema import load_schema
from .core import KINDS, StepKind

SCHEMA_NAME = "build.schema.json"

#: The keys every step has, whatever its kind (``$defs.step`` and the Step dataclass's own fields).
COMMON_PROPERTIES: Mapping[str, Any] = {
    "id": True,
    "kind": True,
    "why": {"$ref": "#/$defs/why"},
    "requires": {"$ref": "#/$defs/requires"},
    "required": {"type": "boolean",
                 "description": "true: the image is wrong without this step; ablate lists it and never removes it."},
}


def kind_part(kind: StepKind) -> dict[str, Any]:
    """``$defs.NAME_step``: the common keys and the kind's own, nothing else (unknown keys get "did you mean")."""
    fragment = dict(kind.schema)
    part: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "kind", *fragment.pop("required", ())],
        "properties": {**COMMON_PROPERTIES, **fragment.pop("properties")},
    }
    part.update(fragment)
    return part


def step_part(kinds: Mapping[str, StepKind]) -> dict[str, Any]:
    """``$defs.step``: an id, a kind from the registry, and the kind's own part by an ``if kind == NAME`` branch."""
    names = sorted(kinds)
    return {
        "type": "object",
        "required": ["id", "kind"],
        "properties": {"id": {"$ref": "#/$defs/step_id"}, "kind": {"enum": names}},
        "allOf": [{"if": {"properties": {"kind": {"const": name}}, "required": ["kind"]},
                   "then": {"$ref": f"#/$defs/{name}_step"}} for name in names],
    }


def with_kinds(schema: Mapping[str, Any], kinds: Mapping[str, StepKind]) -> dict[str, Any]:
    """``schema`` with its step parts made from ``kinds`` (every other ``$defs`` entry kept, in its place).

    ``$defs.step`` is replaced; every ``$defs.*_step`` is a kind's, so those are dropped and the registry's
    follow ``step``.
    """
    defs: dict[str, Any] = {}
    for name, value in schema["$defs"].items():
        if name == "step":
            defs["step"] = step_part(kinds)
            defs.update({f"{k}_step": kind_part(kinds[k]) for k in sorted(kinds)})
        elif not name.endswith("_step"):
            defs[name] = value
    return {**schema, "$defs": defs}


def manifest_schema() -> dict[str, Any]:
    """The schema build.yaml is validated against: the shipped one with the kinds registered now."""
    return with_kinds(load_schema(SCHEMA_NAME), KINDS)


def schema_text(schema: Mapping[str, Any]) -> str:
    """The shipped file's text (two-space JSON, a final newline)."""
    return json.dumps(schema, indent=2) + "\n"


def write_schema(path: Path) -> bool:
    """Rewrite the shipped file ``path`` with the registry's step parts; True when its text changed."""
    old = path.read_text(encoding="utf-8")
    new = schema_text(with_kinds(json.loads(old), KINDS))
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old
