"""`imageforge init`: a starter project -- build.yaml (the cpu target), images/cpu (its base recipe), smoke/,
schema/ (the JSON Schemas the files' first ``yaml-language-server`` lines name, so editors check them).

The files are package data: ``build.yaml`` here, and ``images/cpu`` and ``smoke/dummy.yaml`` as links to the
repository's own (a wheel holds copies of them; the repository one copy); the schemas are the ones
:func:`imageforge.manifest.yaml_schema.schema_text` reads (the wheel's, or the checkout's top-level ``schema/``).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest.yaml_schema import schema_text

if TYPE_CHECKING:
    from importlib.abc import Traversable

#: What a starter project holds, as paths inside it (folders are copied whole).
FILES = ("build.yaml", "images/cpu", "smoke/dummy.yaml")
#: ... and the schemas its YAML files name on their first line.
SCHEMAS = ("build.schema.json", "smoke.schema.json")


def _walk(node: Traversable, rel: str) -> Iterator[tuple[str, Traversable]]:
    if node.is_dir():
        for child in sorted(node.iterdir(), key=lambda n: n.name):
            if child.name != "__pycache__":
                yield from _walk(child, f"{rel}/{child.name}")
    else:
        yield rel, node


def starter_files() -> Iterator[tuple[str, Traversable]]:
    """(path in the project, packaged file) for every file of the starter project."""
    root = files(__name__)
    for rel in FILES:
        node = root
        for part in rel.split("/"):  # joinpath one part at a time (Python 3.10's Traversable)
            node = node.joinpath(part)
        yield from _walk(node, rel)


def write_starter(dest: Path, *, force: bool = False) -> list[str]:
    """Write the starter project under ``dest``; a file already there is kept unless ``force``. One line per file."""
    lines = []
    for rel, node in starter_files():
        path = dest / rel
        if path.exists() and not force:
            lines.append(f"kept    {path}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(node.read_bytes())
        lines.append(f"wrote   {path}")
    for name in SCHEMAS:
        path = dest / "schema" / name
        if path.exists() and not force:
            lines.append(f"kept    {path}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(schema_text(name), encoding="utf-8")
        lines.append(f"wrote   {path}")
    return lines
