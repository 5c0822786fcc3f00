"""`patch-from`: turn an original and an edited text into the fewest anchored ``patch`` steps.

One step per changed region (neighbours merge when their context would overlap), whose anchors are
grown, line by line, until each occurs exactly once; :func:`render_steps_yaml` prints them as manifest
YAML. Pure functions over :mod:`imageforge.patches.anchored` (which stays standard-library only).
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import BuildError
from .anchored import apply_patch

#: Lines of context an anchor may grow beyond the smallest unique one to make the step idempotent.
SOFT_CONTEXT = 6
STEP_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


# --------------------------------------------------------------------------- deriving patch steps


def _lines(text: str) -> list[str]:
    """Lines with their "\\n" kept (only "\\n" splits; joining gives ``text`` back)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def occurrences(text: str, needle: str) -> int:
    """Occurrences of ``needle`` in ``text``, overlapping ones included."""
    if not needle:
        return len(text) + 1
    count, start = 0, 0
    while True:
        idx = text.find(needle, start)
        if idx < 0:
            return count
        count += 1
        start = idx + 1


@dataclass
class _Hunk:
    a1: int  # original lines [a1, a2) become edited lines [b1, b2)
    a2: int
    b1: int
    b2: int


def _hunks(a: Sequence[str], b: Sequence[str]) -> list[_Hunk]:

    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [_Hunk(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def derive_patch_steps(original: str, edited: str, *, file: str, id_prefix: str = "edit",
                       why: str | None = None, taken: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The fewest anchored ``patch`` steps that turn ``original`` into ``edited``, in order.

    One step per changed region of lines.  Each anchor starts as the changed lines (plus one
    line of context for a pure insertion) and grows a line at a time, alternately above and
    below, until it occurs exactly once in the text it will be applied to (earlier steps
    already applied).  It keeps growing, up to SOFT_CONTEXT more lines, until the step is
    also idempotent: in the edited text ``old`` no longer occurs and ``new`` occurs once (a
    rebuild on a patched file then reports "already applied"); where that is out of reach
    (an append at the end of the file) the smallest unique anchor is used.  When a region's
    context would reach the next region the two merge.
    Applying the steps with :func:`imageforge.patches.anchored.apply_patch` yields ``edited`` exactly.
    """
    if not original and edited:
        raise BuildError("the original file is empty: a patch needs an anchor", hint="use an overlay step")
    a, b = _lines(original), _lines(edited)
    hunks = _hunks(a, b)
    steps: list[dict[str, Any]] = []
    current_b: list[str] = []  # edited lines before the aligned point
    done_a = 0  # original lines [0, done_a) are already replaced by current_b
    k = 0
    while k < len(hunks):
        h = _Hunk(hunks[k].a1, hunks[k].a2, hunks[k].b1, hunks[k].b2)
        k += 1
        # context above comes from the text as it is now (edited lines up to the aligned point, then original)
        up = 0  # lines of context above
        down = 0  # lines of context below (original == edited there)
        first_ok: tuple[_Hunk, int, int, int, str, str] | None = None  # the smallest unique anchor
        grown = 0  # lines added since first_ok, looking for an idempotent anchor
        while True:
            head = current_b + a[done_a:h.a1]  # the current text before the hunk
            next_a1 = hunks[k].a1 if k < len(hunks) else len(a)
            room_down = next_a1 - h.a2
            above = head[len(head) - up:] if up else []
            below = a[h.a2:h.a2 + down]
            old = "".join(above + a[h.a1:h.a2] + below)
            new = "".join(above + b[h.b1:h.b2] + below)
            current = "".join(head + a[h.a1:])
            hard_ok = bool(old) and occurrences(current, old) == 1
            if hard_ok and first_ok is None:
                first_ok = (h, k, up, down, old, new)
            if hard_ok and bool(new) and occurrences(edited, new) == 1 and occurrences(edited, old) == 0:
                break
            can_up = up < len(head)
            can_down = down < room_down or k < len(hunks)
            if first_ok is not None and (grown >= SOFT_CONTEXT or not (can_up or can_down)):
                h, k, up, down, old, new = first_ok  # idempotence out of reach: the smallest unique anchor
                break
            if not (can_up or can_down):  # pragma: no cover - the whole text is always a unique anchor
                raise AssertionError("no unique anchor")
            if first_ok is not None:
                grown += 1
            if can_up and (up <= down or not can_down):
                up += 1
            elif down < room_down:
                down += 1
            else:  # the context reaches the next changed region: merge it
                nxt = hunks[k]
                k += 1
                h = _Hunk(h.a1, nxt.a2, h.b1, nxt.b2)
                down = 0
        steps.append({"old": old, "new": new})
        # the aligned point moves past the hunk and its context below
        current_b = current_b + a[done_a:h.a1] + b[h.b1:h.b2] + a[h.a2:h.a2 + down]
        done_a = h.a2 + down
    out: list[dict[str, Any]] = []
    used = set(taken)
    for i, s in enumerate(steps, 1):
        ident = _unique_id(f"{id_prefix}-{i}" if len(steps) > 1 else id_prefix, used)
        used.add(ident)
        step: dict[str, Any] = {"id": ident, "kind": "patch"}
        step["why"] = why or f"patch-from: change {i} of {len(steps)} in {posixpath.basename(file)}"
        step["file"] = file
        step["old"] = s["old"]
        step["new"] = s["new"]
        out.append(step)
    return out


def _unique_id(base: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9_.-]+", "-", base.lower()).strip("-._") or "edit"
    base = base[:56]
    if not base[0].isalnum():  # pragma: no cover - strip above leaves an alnum first
        base = "p" + base
    ident, n = base, 2
    while ident in used:
        ident = f"{base}-{n}"
        n += 1
    assert STEP_ID.match(ident), ident
    return ident


def apply_steps(text: str, steps: Sequence[Mapping[str, Any]]) -> str:
    """Apply patch steps in order; raise BuildError when one does not apply (for tests and checks)."""
    for step in steps:
        outcome = apply_patch(text, step["old"], step["new"], int(step.get("count", 1)))
        if outcome.status != "applies" or outcome.result is None:
            raise BuildError(f"patch {step.get('id')} does not apply: {outcome.status}")
        text = outcome.result
    return text


class _BlockDumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # "|" / "|-" only: a "|+" scalar would swallow the blank lines that follow it once pasted.
    if "\n" in value and not value.endswith("\n\n") and value.strip("\n"):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _str_presenter)


def render_steps_yaml(steps: Sequence[Mapping[str, Any]], *, header: Sequence[str] = (), indent: int = 6) -> str:
    """Steps as a YAML list, indented to paste under ``targets.<T>.steps`` (block scalars for code)."""
    body = yaml.dump([dict(s) for s in steps], Dumper=_BlockDumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=1 << 16)
    body = body.removesuffix("...\n")
    pad = " " * indent
    lines = [f"{pad}# {h}" if h else f"{pad}#" for h in header]
    lines += [(pad + ln) if ln else ln for ln in body.splitlines()]
    return "\n".join(lines) + "\n"
