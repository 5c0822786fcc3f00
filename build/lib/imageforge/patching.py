"""Anchored text patches: pure functions shared by the build, `check-patches` and the submission.

A patch replaces ``old`` by ``new`` in one file and expects ``old`` exactly ``count`` times.
It is idempotent: a file that already holds ``new`` (and no ``old``) is "already applied".
Anything else fails with the closest lines, so an anchor that drifted is found in seconds.

Standard library only: the submission's build-time patch applier embeds this module's source, so the
platform's `docker build` counts anchors exactly as imageforge does. Deriving steps from an edited file
(`patch-from`) lives in :mod:`imageforge.patchfrom`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

PatchStatus = Literal["applies", "already-applied", "anchor-missing", "ambiguous"]


@dataclass(frozen=True)
class NearMatch:
    line: int  # 1-based
    text: str
    ratio: float


@dataclass(frozen=True)
class PatchOutcome:
    status: PatchStatus
    found: int
    expected: int
    result: str | None  # new file text when status == "applies"
    near: tuple[NearMatch, ...] = ()
    lines: tuple[int, ...] = ()  # 1-based lines where the anchor starts

    @property
    def ok(self) -> bool:
        return self.status in ("applies", "already-applied")


def _anchor_lines(text: str, old: str) -> tuple[int, ...]:
    out: list[int] = []
    start = 0
    while True:
        idx = text.find(old, start)
        if idx < 0:
            return tuple(out)
        out.append(text.count("\n", 0, idx) + 1)
        start = idx + max(len(old), 1)


def near_matches(text: str, old: str, limit: int = 3) -> tuple[NearMatch, ...]:
    """Lines of ``text`` most like the first non-blank line of ``old``."""
    first = next((ln.strip() for ln in old.splitlines() if ln.strip()), old.strip())
    scored: list[NearMatch] = []
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(first)
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        matcher.set_seq1(stripped)
        if matcher.real_quick_ratio() < 0.5 or matcher.quick_ratio() < 0.5:
            continue
        ratio = matcher.ratio()
        if ratio >= 0.5:
            scored.append(NearMatch(number, line.rstrip(), round(ratio, 3)))
    scored.sort(key=lambda m: (-m.ratio, m.line))
    return tuple(scored[:limit])


def apply_patch(text: str, old: str, new: str, count: int = 1) -> PatchOutcome:
    found = text.count(old)
    lines = _anchor_lines(text, old)
    if found == count:
        return PatchOutcome("applies", found, count, text.replace(old, new), lines=lines)
    if found == 0:
        if new and text.count(new) == count:
            return PatchOutcome("already-applied", 0, count, None, lines=_anchor_lines(text, new))
        return PatchOutcome("anchor-missing", 0, count, None, near=near_matches(text, old))
    return PatchOutcome("ambiguous", found, count, None, lines=lines)


def describe(outcome: PatchOutcome) -> str:
    if outcome.status == "applies":
        return f"applies at line {', '.join(map(str, outcome.lines))}"
    if outcome.status == "already-applied":
        return "already applied (new text present, anchor absent)"
    if outcome.status == "ambiguous":
        return (f"anchor found {outcome.found} times (lines {', '.join(map(str, outcome.lines))}), "
                f"expected {outcome.expected}")
    if outcome.near:
        best = "; ".join(f"line {m.line}: {m.text.strip()!r} ({m.ratio:.0%})" for m in outcome.near)
        return f"anchor not found; closest: {best}"
    return "anchor not found; no similar line"


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a{path}", f"b{path}", n=2
        )
    )
