"""The step kinds are defined once: the registry in steps/ (one class per kind) is what the schema and the
manifest's kind-name Literal say (issue 26 item 4).

The schema (top-level schema/build.schema.json) names the kinds in ``$defs.step``'s ``kind`` enum, sends each
kind to its ``$defs.<kind>_step`` through one ``if kind == NAME then`` branch, and lists that kind's keys there;
those keys, less the ones every step has, are the kind class's ``fields``. ``manifest.StepKindName`` lists the
same names, and every step the repository's build.yaml loads holds only its kind's fields in ``Step.spec``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from imageforge.manifest import StepKindName
from imageforge.manifest_load import load_manifest
from imageforge.steps import KINDS, StepKind, kind

REPO = Path(__file__).resolve().parents[2]
#: The keys of every step, whatever its kind (the schema's $defs.step and the Step dataclass's own fields).
COMMON = {"id", "kind", "why", "required", "requires"}


def build_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((REPO / "schema" / "build.schema.json").read_text())
    return schema


def schema_mismatches(schema: Mapping[str, Any], kinds: Mapping[str, StepKind]) -> list[str]:
    """What the schema says about the step kinds that the registry ``kinds`` does not (empty: they agree)."""
    defs = schema["$defs"]
    step = defs["step"]
    out = []
    enum = sorted(step["properties"]["kind"]["enum"])
    if enum != sorted(kinds):
        out.append(f"$defs.step kind enum {enum} != the registry {sorted(kinds)}")
    branches = {b["if"]["properties"]["kind"]["const"]: b["then"]["$ref"] for b in step["allOf"]}
    if branches != {name: f"#/$defs/{name}_step" for name in kinds}:
        out.append(f"$defs.step branches {branches}")
    for name, cls in sorted(kinds.items()):
        part = defs.get(f"{name}_step")
        if part is None:
            out.append(f"no $defs.{name}_step")
            continue
        if part.get("additionalProperties") is not False:
            out.append(f"$defs.{name}_step takes unknown keys")
        keys = set(part.get("properties", {}))
        if keys - COMMON != set(cls.fields):
            out.append(f"$defs.{name}_step keys {sorted(keys - COMMON)} != {name} fields {sorted(cls.fields)}")
        if not (COMMON - {"kind"} <= keys and {"id", "kind"} <= set(part.get("required", ()))):
            out.append(f"$defs.{name}_step lacks a key every step has")
    return out


def test_the_schema_step_kinds_are_the_registry() -> None:
    assert schema_mismatches(build_schema(), KINDS) == []


def test_the_kind_name_literal_is_the_registry() -> None:
    assert sorted(get_args(StepKindName)) == sorted(KINDS)
    assert all(isinstance(k, StepKind) and k.name == n for n, k in KINDS.items())


def test_every_loaded_step_holds_only_its_kinds_fields() -> None:
    steps = [s for t in load_manifest(REPO / "build.yaml").targets.values() for s in t.steps]
    assert {s.kind for s in steps} == set(KINDS), "the repository's build.yaml uses every kind"
    for step in steps:
        assert set(step.spec) <= set(kind(step.kind).fields), (step.id, sorted(step.spec))


def test_a_kind_missing_from_the_schema_or_a_field_out_of_step_is_found() -> None:
    schema = build_schema()
    extra = type("Download", (StepKind,), {"name": "download", "fields": ("url",)})()
    assert schema_mismatches(schema, {**KINDS, "download": extra}) == [
        f"$defs.step kind enum {sorted(KINDS)} != the registry {sorted([*KINDS, 'download'])}",
        "$defs.step branches " + str({n: f"#/$defs/{n}_step" for n in sorted(KINDS)}),
        "no $defs.download_step",
    ]
    patch = copy.deepcopy(schema)
    patch["$defs"]["patch_step"]["properties"]["encoding"] = {"type": "string"}
    (found,) = schema_mismatches(patch, KINDS)
    assert found.startswith("$defs.patch_step keys ['count', 'encoding', 'file', 'new', 'old', 'verified'] != patch")
