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
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import pytest

from imageforge.errors import ConfigError
from imageforge.manifest import StepKindName
from imageforge.manifest_load import load_manifest
from imageforge.steps import KINDS, StepKind, kind
from tests.unit.conftest import MINIMAL

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


def test_a_kinds_defaults_are_its_own_and_fill_the_loaded_spec(write_manifest: Callable[..., Path]) -> None:
    assert dict(kind("patch").defaults) == {"count": 1, "verified": True}
    assert dict(kind("symlink").defaults) == {"replace": False, "replace_directory": False}
    assert set(kind("overlay").defaults) == set() and set(kind("script").defaults) == set()
    for name, cls in KINDS.items():
        assert set(cls.defaults) <= set(cls.fields), name
    twice = MINIMAL.replace('        new: "A = 2"\n', '        new: "A = 2"\n        count: 2\n')
    manifest = write_manifest(twice, "two.yaml")
    fix = load_manifest(write_manifest(MINIMAL)).targets["t"].steps[1]
    assert (fix.spec["count"], fix.spec["verified"]) == (1, True)
    assert load_manifest(manifest).targets["t"].steps[1].spec["count"] == 2
    # a Step made in code may leave an optional field out: the kind's default is what it reads
    bare = replace(fix, spec={k: v for k, v in fix.spec.items() if k not in ("count", "verified")})
    assert kind("patch").value(bare, "count") == 1 and kind("patch").value(fix, "verified") is True
    with pytest.raises(KeyError):
        kind("patch").value(bare, "old-or-new")


def test_a_kinds_load_reports_at_its_own_keys(write_manifest: Callable[[str], Path]) -> None:
    same = MINIMAL.replace('new: "A = 2"', 'new: "A = 1"')
    with pytest.raises(ConfigError) as info:
        load_manifest(write_manifest(same))
    assert (info.value.key_path, info.value.message) == ("targets.t.steps[1].new", "patch does not change anything")
    new_line = same.splitlines().index('        new: "A = 1"') + 1
    assert info.value.location is not None and (info.value.location.line, info.value.location.column) == (new_line, 9)
