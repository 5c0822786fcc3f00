"""No Python program longer than 20 lines lives in a string literal in src/.

A program sent into an image (``python -c``) or written into the submission tree is a real module of
:mod:`imageforge.inimage`, linted and type-checked like the rest, and read back as text. This test parses every
module under src/ and fails on a string constant of more than 20 lines that compiles as Python, as written or
once its ``%``-formatting is undone (``%%`` -> ``%``, ``%(name)d`` -> ``0``: a template of a program counts too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "imageforge"
MAX_LINES = 20
_FIELD = re.compile(r"%\(\w+\)[dsr]")


def _compiles(text: str) -> bool:
    try:
        compile(text, "<string literal>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _is_program(text: str) -> bool:
    lines = [ln for ln in text.strip("\n").splitlines() if ln.strip()]
    if len(lines) <= MAX_LINES:
        return False
    return _compiles(text) or _compiles(_FIELD.sub("0", text).replace("%%", "%"))


def programs_in_strings(source: str, filename: str) -> list[str]:
    """``file:line (N lines)`` for each string constant in ``source`` that holds a Python program of > 20 lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_program(node.value):
            found.append(f"{filename}:{node.lineno} ({len(node.value.strip().splitlines())} lines)")
    return found


def test_no_python_program_over_20_lines_in_a_string_literal() -> None:
    found = []
    files = sorted(p for p in SRC.rglob("*.py") if "starter/images" not in p.as_posix())
    assert len(files) > 50
    for path in files:
        found.extend(programs_in_strings(path.read_text(encoding="utf-8"), str(path.relative_to(SRC.parent))))
    assert found == [], "move these programs into src/imageforge/inimage/ (real modules, read as text): " + ", ".join(
        found)


def test_the_scan_finds_a_program_and_a_template_of_one_but_not_prose_or_a_short_snippet() -> None:
    body = "".join(f"x{i} = {i}\n" for i in range(21))
    template = "".join(f"print('%%s' %% x{i}, %(mtime)d)\n" for i in range(21))
    source = (f"A = {body!r}\nB = {template!r}\nC = {'word ' * 3 + chr(10) * 30!r}\n"
              f"D = {''.join(f'y{i} = {i}' + chr(10) for i in range(20))!r}\n"
              f"E = {'This is prose, not code.' + chr(10) + body!r}\n")
    assert programs_in_strings(source, "m.py") == ["m.py:1 (21 lines)", "m.py:2 (21 lines)"]
