"""Anchored patches: exactly once, idempotent, near-matches when an anchor drifted."""

from __future__ import annotations

from imageforge.patches.anchored import (
    apply_patch,
    describe,
    indent_words,
    matches,
    near_matches,
    reapplies,
    unified_diff,
)

SOURCE = """import os
BLOCK = 128 if has_cap(80) else 64
NUM_WARPS = 8
def f():
    NUM_WARPS = 8
"""


def test_applies_exactly_once() -> None:
    out = apply_patch(SOURCE, "BLOCK = 128 if has_cap(80) else 64", "BLOCK = 64")
    assert out.status == "applies" and out.lines == (2,)
    assert out.result is not None and "BLOCK = 64\n" in out.result
    assert describe(out) == "applies at line 2"


def test_ambiguous_anchor() -> None:
    out = apply_patch(SOURCE, "NUM_WARPS = 8", "NUM_WARPS = 4")
    assert out.status == "ambiguous" and out.found == 2 and out.lines == (3, 5)
    assert describe(out) == "anchor found 2 times (lines 3, 5), expected 1"
    assert apply_patch(SOURCE, "NUM_WARPS = 8", "NUM_WARPS = 4", count=2).status == "applies"


def test_already_applied_is_idempotent() -> None:
    first = apply_patch(SOURCE, "BLOCK = 128 if has_cap(80) else 64", "BLOCK = 64")
    assert first.result is not None
    again = apply_patch(first.result, "BLOCK = 128 if has_cap(80) else 64", "BLOCK = 64")
    assert again.status == "already-applied" and again.ok


def test_missing_anchor_reports_near_matches() -> None:
    out = apply_patch(SOURCE, "BLOCK = 128 if has_capability(80) else 64", "BLOCK = 64")
    assert out.status == "anchor-missing" and not out.ok
    assert out.near and out.near[0].line == 2
    assert describe(out).startswith("anchor not found; closest: line 2: 'BLOCK = 128 if has_cap(80) else 64'")


def test_no_similar_line() -> None:
    out = apply_patch(SOURCE, "completely different", "x")
    assert describe(out) == "anchor not found; no similar line"
    assert near_matches("", "x") == ()


def test_unified_diff() -> None:
    after = SOURCE.replace("import os", "import sys")
    diff = unified_diff("/a.py", SOURCE, after)
    assert "-import os" in diff and "+import sys" in diff and diff.startswith("--- a/a.py")


# --------------------------------------------------------------------------- the line-anchored rule

MOE = """def experts(x):
    if T == 1:
        out = x
    else:
            out = zeros(x)
            unique = ids(x)
            for e in unique:
                out += e

    return out
"""


def test_same_indentation_at_a_line_start_applies() -> None:
    old = "            out = zeros(x)\n            unique = ids(x)\n"
    new = "            return fast(x)\n            out = zeros(x)  # unreachable\n            unique = ids(x)\n"
    out = apply_patch(MOE, old, new)
    assert out.status == "applies" and out.lines == (5,) and out.new_lines == (5, 6, 7)
    assert out.result is not None and "            return fast(x)\n" in out.result
    compile(out.result, "moe.py", "exec", dont_inherit=True)
    assert reapplies(old, new) == 0
    assert apply_patch(out.result, old, new).status == "already-applied"


def test_a_shallower_anchor_inside_a_deeper_line_is_refused_with_both_indentations() -> None:
    """8 spaces + the line matched inside the 12-space line before: the replacement broke the file."""
    old = "        unique = ids(x)\n"
    out = apply_patch(MOE, old, "        return fast(x)\n        unique = ids(x)  # unreachable\n")
    assert out.status == "inside-line" and not out.ok and out.result is None and out.found == 0
    assert out.inside[0].line == 6 and out.inside[0].column == 5
    text = describe(out)
    assert text.startswith("found inside line 6 at column 5: the line is indented 12 spaces, the anchor 8 spaces")
    assert "nearest line-start candidates: line 6: 'unique = ids(x)'" in text


def test_a_deeper_anchor_than_the_line_is_missing() -> None:
    out = apply_patch(MOE, "                unique = ids(x)\n", "                pass\n")
    assert out.status == "anchor-missing" and out.near[0].line == 6
    assert out.hint == "line 6 holds the anchor's first line indented 12 spaces, the anchor 16 spaces"
    assert describe(out).endswith("; " + out.hint)


def test_only_accepted_matches_are_counted_and_replaced() -> None:
    text = "a = 1\n    a = 1\nb = 2\n"
    out = apply_patch(text, "a = 1\n", "a = 3\n")
    assert out.status == "applies" and out.found == 1 and out.result == "a = 3\n    a = 1\nb = 2\n"
    # two single-line texts stay an in-line edit: every copy counts
    assert apply_patch(text, "a = 1", "a = 3").status == "ambiguous"


def test_an_anchor_beginning_with_a_newline_begins_at_a_line_end() -> None:
    text = "x = f(a)\ny = 2\n"
    out = apply_patch(text, "\ny = 2\n", "  # note\ny = 3\n")
    assert out.status == "applies" and out.result == "x = f(a)  # note\ny = 3\n"


def test_tabs_are_said_as_tabs() -> None:
    text = "def f():\n\tif a:\n\t\tx = 1\n"
    out = apply_patch(text, "\tx = 1\n", "\tx = 2\n")
    assert out.status == "inside-line"
    assert "the line is indented 2 tabs, the anchor 1 tab" in describe(out)
    assert indent_words("\t    ") == "1 tab and 4 spaces (mixed)" and indent_words("") == "no indentation"


def test_crlf_files_are_refused_for_a_line_anchored_patch() -> None:
    text = "def f():\r\n    x = 1\r\n"
    out = apply_patch(text, "    x = 1\n", "    x = 2\n")
    assert out.status == "crlf" and not out.ok and "CRLF" in describe(out)
    assert apply_patch(text, "x = 1", "x = 2").status == "applies", "a single-line edit keeps the line ends"


def test_new_containing_old_would_apply_again() -> None:
    old = "class A(Base):\n"
    new = "class A(Base):\n    extra: int = 0\n"
    assert reapplies(old, new) == 1
    once = apply_patch("class A(Base):\n    pass\n", old, new)
    assert once.result is not None
    assert apply_patch(once.result, old, new).status == "applies", "what validate refuses: it patches again"
    fixed = "class A(Base):  # patched\n    extra: int = 0\n"
    assert reapplies(old, fixed) == 0
    assert reapplies("NUM = 8", "NUM = 8  # kept") == 1  # single-line: anywhere
    assert reapplies("    x\n", "        x\n") == 0  # only inside a line: the rule would not match it


def test_matches_reports_rejected_offsets() -> None:
    accepted, rejected = matches("ab\n  ab\n", "ab\n", anchored=True)
    assert accepted == [0] and rejected == [5]
