"""Anchored patches: exactly once, idempotent, near-matches when an anchor drifted."""

from __future__ import annotations

from imageforge.patching import apply_patch, describe, near_matches, unified_diff

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
