"""Anchored text patches: pure functions shared by the build, `check-patches` and the submission.

A patch replaces ``old`` by ``new`` in one file and expects ``old`` exactly ``count`` times.
It is idempotent: a file that already holds ``new`` (and no ``old``) is "already applied".
Anything else fails with the closest lines, so an anchor that drifted is found in seconds.

The one matching rule (:func:`matches`), which the build, ``check-patches``, the in-place apply,
``patch-from``'s output and the submission's generated applier all use:

* **Line-anchored**: when ``old`` or ``new`` holds a newline, a match of ``old`` counts only where it
  begins at a line start (offset 0, or right after a ``"\\n"``). Its leading spaces are then the
  line's whole indentation: ``8 spaces + x`` never matches inside a line indented 12 spaces (the
  replacement would give the first line 12 spaces and the next ones 8, and break the file). Two
  single-line texts (no newline in either) are an in-line edit and match anywhere.
* An ``old`` that **begins with "\\n"** begins at the end of a line: that newline is its anchor, so
  it matches after any line's text and its second line starts at a line start by construction.
* Only accepted matches are counted and replaced (by their offsets, never ``str.replace``, which
  would also replace rejected copies); "already applied" counts ``new`` by the same rule.
* A match found only inside a deeper line is ``inside-line``: the line, the column and both
  indentations are said, with the nearest line-start candidates.
* A file with CRLF line ends is refused for a line-anchored patch (``crlf``): the anchors are LF text
  and guessing would be silent.
* :func:`reapplies` says whether ``new`` still holds ``old`` where the rule would match it (then the
  patch would apply again on a patched file); the manifest check refuses such a step.

Standard library only: the submission's build-time patch applier embeds this module's source, so the
platform's `docker build` counts anchors exactly as imageforge does. Deriving steps from an edited file
(`patch-from`) lives in :mod:`imageforge.patches.from_text`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

PatchStatus = Literal["applies", "already-applied", "anchor-missing", "ambiguous", "inside-line", "crlf"]


@dataclass(frozen=True)
class NearMatch:
    line: int  # 1-based
    text: str
    ratio: float


@dataclass(frozen=True)
class InsideLine:
    """A match of ``old`` that the rule rejects: it begins inside line ``line`` (1-based) at ``column`` (1-based)."""

    line: int
    column: int
    line_indent: str
    anchor_indent: str


@dataclass(frozen=True)
class PatchOutcome:
    status: PatchStatus
    found: int
    expected: int
    result: str | None  # new file text when status == "applies"
    near: tuple[NearMatch, ...] = ()
    lines: tuple[int, ...] = ()  # 1-based lines where the anchor starts
    inside: tuple[InsideLine, ...] = ()  # rejected matches (inside a line), when status == "inside-line"
    new_lines: tuple[int, ...] = ()  # 1-based lines of ``result`` that ``new`` wrote (their names are checked)
    hint: str = ""  # anchor-missing: a line that holds the anchor's first line at another indentation

    @property
    def ok(self) -> bool:
        return self.status in ("applies", "already-applied")


def line_anchored(old: str, new: str) -> bool:
    """Whether a match of ``old`` must begin at a line start: unless both texts are single-line."""
    return "\n" in old or "\n" in new


def _starts_line(text: str, idx: int, old: str) -> bool:
    return idx == 0 or text[idx - 1] == "\n" or old.startswith("\n")


def matches(text: str, old: str, anchored: bool) -> tuple[list[int], list[int]]:
    """Offsets of the accepted (non-overlapping, left to right) and of the rejected matches of ``old``."""
    accepted: list[int] = []
    rejected: list[int] = []
    if not old:
        return accepted, rejected
    start = 0
    while True:
        idx = text.find(old, start)
        if idx < 0:
            return accepted, rejected
        if not anchored or _starts_line(text, idx, old):
            accepted.append(idx)
            start = idx + len(old)
        else:
            rejected.append(idx)
            start = idx + 1


def _line_of(text: str, idx: int) -> int:
    return text.count("\n", 0, idx) + 1


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_words(ws: str) -> str:
    """``"12 spaces"``, ``"1 tab"``, ``"1 tab and 4 spaces"``, ``"no indentation"``."""
    if not ws:
        return "no indentation"
    tabs, spaces = ws.count("\t"), ws.count(" ")
    parts = []
    if tabs:
        parts.append(f"{tabs} tab{'s' if tabs != 1 else ''}")
    if spaces:
        parts.append(f"{spaces} space{'s' if spaces != 1 else ''}")
    return " and ".join(parts) + (" (mixed)" if tabs and spaces else "")


def _inside(text: str, idx: int, old: str) -> InsideLine:
    begin = text.rfind("\n", 0, idx) + 1
    end = text.find("\n", idx)
    line = text[begin:] if end < 0 else text[begin:end]
    first = old.split("\n", 1)[0]
    return InsideLine(_line_of(text, idx), idx - begin + 1, _indent(line), _indent(first))


def reapplies(old: str, new: str) -> int:
    """How many times ``old`` occurs in ``new`` where the rule would match it (0: the patch applies once).

    ``new`` is read as inserted at a line start (where a line-anchored ``old`` was): a copy of ``old``
    at the start of ``new`` or right after one of its newlines would be patched again by a re-run.
    """
    return len(matches(new, old, line_anchored(old, new))[0])


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


def _replace_at(text: str, offsets: list[int], old: str, new: str) -> tuple[str, tuple[int, ...]]:
    """The text with ``old`` replaced at exactly ``offsets``, and the lines ``new`` occupies in it."""
    parts: list[str] = []
    written: list[int] = []
    last = 0
    line = 1
    body = new[:-1] if new.endswith("\n") else new
    for idx in offsets:
        parts.append(text[last:idx])
        line += text.count("\n", last, idx)
        parts.append(new)
        written.extend(range(line, line + body.count("\n") + 1))
        line += new.count("\n")
        last = idx + len(old)
    parts.append(text[last:])
    return "".join(parts), tuple(written)


def _indent_hint(near: tuple[NearMatch, ...], old: str) -> str:
    """"line N holds the anchor's first line indented 16 spaces, the anchor 12 spaces" (or "")."""
    first = next((ln for ln in old.split("\n") if ln.strip()), "")
    for m in near:
        if m.text.strip() == first.strip() and _indent(m.text) != _indent(first):
            return (f"line {m.line} holds the anchor's first line indented {indent_words(_indent(m.text))}, "
                    f"the anchor {indent_words(_indent(first))}")
    return ""


def apply_patch(text: str, old: str, new: str, count: int = 1) -> PatchOutcome:
    anchored = line_anchored(old, new)
    if anchored and "\r\n" in text:
        return PatchOutcome("crlf", 0, count, None)
    accepted, rejected = matches(text, old, anchored)
    lines = tuple(_line_of(text, i) for i in accepted)
    found = len(accepted)
    if found == count:
        result, written = _replace_at(text, accepted, old, new)
        return PatchOutcome("applies", found, count, result, lines=lines, new_lines=written)
    if found == 0:
        done = matches(text, new, anchored)[0] if new else []
        if new and len(done) == count:
            return PatchOutcome("already-applied", 0, count, None, lines=tuple(_line_of(text, i) for i in done))
        if rejected:
            return PatchOutcome("inside-line", 0, count, None, near=near_matches(text, old),
                                lines=tuple(_line_of(text, i) for i in rejected),
                                inside=tuple(_inside(text, i, old) for i in rejected))
        near = near_matches(text, old)
        return PatchOutcome("anchor-missing", 0, count, None, near=near, hint=_indent_hint(near, old))
    return PatchOutcome("ambiguous", found, count, None, lines=lines)


def describe(outcome: PatchOutcome) -> str:
    if outcome.status == "applies":
        return f"applies at line {', '.join(map(str, outcome.lines))}"
    if outcome.status == "already-applied":
        return "already applied (new text present, anchor absent)"
    if outcome.status == "ambiguous":
        return (f"anchor found {outcome.found} times (lines {', '.join(map(str, outcome.lines))}), "
                f"expected {outcome.expected}")
    if outcome.status == "crlf":
        return ("the file has CRLF line ends: a multi-line patch is LF text and is matched at line starts; "
                "refused rather than guessed (convert the file, or use an overlay step)")
    near = ""
    if outcome.near:
        near = "; ".join(f"line {m.line}: {m.text.strip()!r} ({m.ratio:.0%})" for m in outcome.near)
    if outcome.status == "inside-line":
        first = outcome.inside[0]
        return (f"found inside line {first.line} at column {first.column}: the line is indented "
                f"{indent_words(first.line_indent)}, the anchor {indent_words(first.anchor_indent)} "
                f"(a multi-line anchor must begin at a line start)"
                + (f"; nearest line-start candidates: {near}" if near else ""))
    if near:
        return f"anchor not found; closest: {near}" + (f"; {outcome.hint}" if outcome.hint else "")
    return "anchor not found; no similar line"


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a{path}", f"b{path}", n=2
        )
    )
