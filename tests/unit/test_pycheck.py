"""imageforge.patches.pycheck: a changed .py must compile, parse as the base's Python and bind every name its
lines load."""

from __future__ import annotations

import sys

import pytest

from imageforge.patches.pycheck import check_python, context_lines, parse_version

MODULE = '''import os
from typing import Optional as Opt

LIMIT = 3


def outer(a, *rest, key=None, **kw):
    local = a + LIMIT
    def inner(b):
        return b + local + a
    squares = [i * i for i in range(local) if i != key]
    try:
        pass
    except ValueError as exc:
        print(exc)
    return inner, squares, rest, kw, os.sep, Opt


class Box:
    size = LIMIT

    def grow(self, by: int) -> int:
        return self.size + by + LIMIT


def later():
    global ADDED
    ADDED = 1
'''


def lines_of(text: str, needle: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if needle in line]


def test_a_good_file_passes_with_every_line_checked() -> None:
    assert check_python(MODULE, "m.py", python_version="3.10.12") is None


@pytest.mark.parametrize(("insert", "name"), [
    ("        return topk_weights\n", "topk_weights"),
    ("        return size\n", "size"),  # a class attribute is not visible in a method
    ("        return [j for j in range(3)] + [undefined_x]\n", "undefined_x"),
])
def test_an_unbound_name_on_the_steps_lines_fails(insert: str, name: str) -> None:
    text = MODULE.replace("    def grow(self, by: int) -> int:\n", "    def grow(self, by: int) -> int:\n" + insert)
    line = lines_of(text, insert.strip())[0]
    problem = check_python(text, "m.py", lines=[line])
    assert problem is not None and problem.line == line
    assert problem.error.startswith(f"NameError: name {name!r} is not bound in its scope")
    assert f"> {line} | {insert.rstrip()}" in problem.context
    # names on other lines are not the step's business
    assert check_python(text, "m.py", lines=[1]) is None


def test_bound_names_of_every_kind_pass() -> None:
    text = MODULE + "\n\ndef uses():\n    return ADDED, len, __file__, outer, Box\n"
    assert check_python(text, "m.py", lines=lines_of(text, "return ADDED")) is None


def test_a_star_import_leaves_globals_unchecked() -> None:
    text = "from os.path import *\n\n\ndef f():\n    return join('a', 'b'), nobody_knows\n"
    assert check_python(text, "m.py") is None


def test_syntax_and_indentation_errors_name_the_line() -> None:
    problem = check_python("def f():\n    x = 1\n        y = 2\n", "m.py")
    assert problem is not None and problem.line == 3 and problem.error.startswith("IndentationError: unexpected")
    assert problem.text().startswith("m.py, line 3: IndentationError")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* needs a 3.11 parser to compile at all")
def test_syntax_newer_than_the_bases_python_fails() -> None:
    text = "try:\n    pass\nexcept* ValueError:\n    pass\n"
    assert check_python(text, "m.py", python_version="3.11.2") is None
    problem = check_python(text, "m.py", python_version="3.10.12")
    assert problem is not None and "Python 3.10, the base image's" in problem.error


def test_helpers() -> None:
    assert parse_version("3.10.12") == (3, 10) and parse_version("") is None
    assert context_lines("a\nb\nc\nd\n", 2, around=1) == "  1 | a\n> 2 | b\n  3 | c"
