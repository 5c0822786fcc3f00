"""schema/ at the top of the repository is the one place the JSON Schemas live, and editors are pointed at it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imageforge.manifest import yaml_schema

REPO = Path(__file__).resolve().parents[2]
DOCS = [(REPO / "build.yaml", "build.schema.json"),
        *((p, "smoke.schema.json") for p in sorted((REPO / "smoke").glob("*.yaml")))]


@pytest.mark.parametrize(("doc", "schema"), DOCS, ids=[str(d.relative_to(REPO)) for d, _ in DOCS])
def test_first_line_names_the_schema_for_editors(doc: Path, schema: str) -> None:
    first = doc.read_text().splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), first
    target = (doc.parent / first[len(prefix):]).resolve()
    assert target == REPO / "schema" / schema and target.is_file()


def test_the_schemas_live_only_at_the_top() -> None:
    assert sorted(p.name for p in (REPO / "schema").glob("*.json")) == ["build.schema.json", "smoke.schema.json"]
    copies = list((REPO / "src").rglob("*.schema.json"))
    assert copies == [], copies  # no second copy: setup.py's build hook puts them into the wheel
    assert yaml_schema.CHECKOUT_SCHEMAS == REPO / "schema"
    for name in ("build.schema.json", "smoke.schema.json"):
        assert yaml_schema.load_schema(name) == json.loads((REPO / "schema" / name).read_text())


def test_a_missing_schema_names_both_places() -> None:
    with pytest.raises(FileNotFoundError, match=r"imageforge/schema/nope\.json nor .*schema/nope\.json"):
        yaml_schema.schema_text("nope.json")
