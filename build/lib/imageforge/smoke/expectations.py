"""Evaluating a check's expectations that read the response: JSONPath items, regular expressions, and the
difference between a streamed and a plain answer."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..serving_client import short
from .expr import ExprError, json_type, render
from .operators import compare
from .results import Exchange
from .suite import PathExpectation, RegexExpectation


def evaluate_path(pe: PathExpectation, body: Any, names: Mapping[str, Any],
                  findall: Callable[[str, Any], list[Any]]) -> str | None:
    """None when the JSONPath expectation holds, else a message."""
    import jsonpath

    try:
        matches = findall(pe.path, body) if body is not None else []
    except jsonpath.JSONPathError as exc:
        return f"{pe.path}: {str(exc).splitlines()[0]}"
    try:
        want = render(pe.value, names) if pe.op not in ("valid", "parses_as") else pe.value
    except ExprError as exc:
        return f"{pe.path}: cannot render the expected value: {exc}"
    if pe.op == "exists":
        found = bool(matches)
        return None if found == bool(want) else f"{pe.path}: {'missing' if want else 'present'}" + (
            f" (found {short(matches[0])})" if matches else "")
    if pe.op == "count":
        return None if len(matches) == want else f"{pe.path}: {len(matches)} matches, expected {want}"
    if not matches:
        return f"{pe.path}: no match in the response"
    values = matches if pe.each else [matches[0] if len(matches) == 1 else matches]
    for value in values:
        problem = compare(pe.op, value, want)
        if problem:
            return f"{pe.path}: {problem}"
    return None



def evaluate_regex(rx: RegexExpectation, ex: Exchange) -> str | None:
    import jsonpath

    texts: list[Any]
    if rx.path is None:
        texts = [ex.text]
        where = "the response"
    else:
        matches = jsonpath.findall(rx.path, ex.body) if ex.body is not None else []
        if not matches:
            return f"{rx.path}: no match in the response (for /{rx.pattern}/)"
        texts = matches
        where = rx.path
    for text in texts:
        if not isinstance(text, str):
            return f"{where}: {short(text)} is {json_type(text)}, not a string (for /{rx.pattern}/)"
        hit = re.fullmatch(rx.pattern, text, re.S) if rx.full else re.search(rx.pattern, text)
        if rx.negate and hit:
            return f"{where}: /{rx.pattern}/ found in {short(text)}"
        if not rx.negate and not hit:
            return f"{where}: {short(text)} does not {'fully ' if rx.full else ''}match /{rx.pattern}/"
    return None


def describe_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    if len(a) != len(b):
        return f"{len(a)} choices streamed, {len(b)} without streaming"
    for x, y in zip(a, b, strict=True):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"choice {x.get('index')} {key}: streamed {short(x.get(key))}, plain {short(y.get(key))}"
    return "differs"  # pragma: no cover

