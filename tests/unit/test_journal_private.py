"""The in-place journal changes only through its own methods: no module outside ``inplace/journal.py`` reads or
writes its data (``_data``, ``_paths``, or the former public ``data`` / ``paths`` on a journal)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "imageforge"
HOME = SRC / "inplace" / "journal.py"
PRIVATE = {"_data", "_paths"}


def _names(node: ast.expr) -> str:
    """The dotted text of a Name/Attribute chain (``self.journal`` -> "self.journal")."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_names(node.value)}.{node.attr}"
    return ""


def touches(source: str, filename: str) -> list[str]:
    """``file:line attribute`` for every access to a journal's data in ``source``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = _names(node.value).lower()
        if node.attr in PRIVATE or (node.attr in ("data", "paths") and "journal" in owner):
            out.append((node.lineno, f"{filename}:{node.lineno} {_names(node)}"))
    return [text for _, text in sorted(out)]


def test_no_module_outside_the_journal_touches_its_data() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py")) if path != HOME
             for hit in touches(path.read_text(), str(path.relative_to(SRC)))]
    assert found == [], "change the journal through inplace/journal.py's methods:\n" + "\n".join(found)


def test_the_check_finds_a_direct_change() -> None:
    bad = "def f(journal, self):\n    journal.data['applied'] = []\n    self.journal.paths[k]\n    j._data\n"
    assert touches(bad, "x.py") == ["x.py:2 journal.data", "x.py:3 self.journal.paths", "x.py:4 j._data"]
    assert touches("def f(journal):\n    journal.applied()\n    report.data\n", "y.py") == []
