"""The words of every YAML problem: key paths, type names, "did you mean", and syntax errors explained.

Pure text: what :mod:`imageforge.manifest.yamldoc` (the loader) and :mod:`imageforge.manifest.yaml_schema` (the schema
check) say, ``file:line:column: key.path[3].name: message`` with expected/found and a hint. A syntax error says where
the construct started (an unclosed bracket or quote), where the parser noticed, the key path when the text shows
it, and a hint for that kind of error.
"""

from __future__ import annotations

import datetime
import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, Location

KeyPath = tuple[str | int, ...]


def format_key_path(path: Iterable[str | int]) -> str:
    """``('targets', 'cpu', 'steps', 3, 'old')`` -> ``targets.cpu.steps[3].old``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def mark_location(path: Path, mark: Any) -> Location:
    if mark is None:
        return Location(str(path))
    return Location(str(path), mark.line + 1, mark.column + 1)


def type_name(value: Any, *, json_terms: bool = False) -> str:
    """The type of a loaded value in YAML words (list, mapping) or JSON words (array, object)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, datetime.datetime):
        return "date and time"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, list | tuple):
        return "array" if json_terms else "list"
    if isinstance(value, Mapping):
        return "object" if json_terms else "mapping"
    return type(value).__name__


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    if not matches:
        return None
    return "did you mean " + " or ".join(repr(m) for m in matches) + "?"


# --------------------------------------------------------------------------- syntax errors

_KEY_LINE = re.compile(
    r"""^(?P<indent> *)(?P<dash>(?:- +)*)(?P<key>"[^"]*"|'[^']*'|[^\s#'"\-\[{][^:#]*?|-[^\s:#][^:#]*?) *:(?: |$)"""
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def key_path_at(text: str, line: int, column: int) -> KeyPath:
    """Best-effort key path of the innermost key whose value holds the position (0-based line/column).

    Used for syntax errors, where no node exists: ``targets.cpu.steps[2]`` from the keys and ``- `` items
    above the position. Flow collections are not followed (the key that holds them is).
    """
    lines = text.splitlines()
    if line >= len(lines):
        line = len(lines) - 1
    out: list[str | int] = []
    current = lines[line] if line >= 0 else ""
    m = _KEY_LINE.match(current)
    threshold = column
    if m and m.end("key") <= column:
        out.append(_unquote(m.group("key")))
        threshold = _indent(current) + len(m.group("dash"))
        if m.group("dash"):
            out.append(_item_index(lines, line, _indent(current)))
            threshold = _indent(current)
    elif current.lstrip().startswith("- ") and column > _indent(current):
        out.append(_item_index(lines, line, _indent(current)))
        threshold = _indent(current)
    for index in range(line - 1, -1, -1):
        text_line = lines[index]
        if not text_line.strip() or text_line.lstrip().startswith("#"):
            continue
        indent = _indent(text_line)
        if indent >= threshold:
            continue
        m = _KEY_LINE.match(text_line)
        dash = m.group("dash") if m else ("- " if text_line.lstrip().startswith("- ") else "")
        if dash:
            key_col = indent + len(dash)
            if m and key_col < threshold:
                out.append(_unquote(m.group("key")))
            out.append(_item_index(lines, index, indent))
            threshold = indent
        elif m:
            out.append(_unquote(m.group("key")))
            threshold = indent
        if threshold == 0:
            break
    return tuple(reversed(out))


def _unquote(key: str) -> str:
    key = key.strip()
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
        return key[1:-1]
    return key


def _item_index(lines: list[str], line: int, indent: int) -> int:
    """How many ``- `` items at ``indent`` come before the one on ``line`` in the same list."""
    count = 0
    for index in range(line - 1, -1, -1):
        text_line = lines[index]
        if not text_line.strip() or text_line.lstrip().startswith("#"):
            continue
        current = _indent(text_line)
        if current < indent:
            break
        if current == indent:
            if not text_line.lstrip().startswith("-"):
                break
            count += 1
    return count


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _found_token(problem: str) -> str:
    m = re.search(r"(?:but found|but got|found) (.*)$", problem)
    token = m.group(1) if m else problem
    return {"'<stream end>'": "the end of the file", "unexpected end of stream": "the end of the file"}.get(
        token, token
    )


def syntax_error(path: Path, text: str, exc: yaml.MarkedYAMLError) -> ConfigError:
    """A ConfigError for a YAML syntax error: where it started, where it was noticed, key path, a specific hint."""
    problem = exc.problem or str(exc)
    context = exc.context or ""
    pmark = exc.problem_mark
    cmark = exc.context_mark
    lines = text.splitlines()
    noticed = f"{_found_token(problem)} at {_at(pmark)}" if pmark is not None else _found_token(problem)

    def error(message: str, mark: Any, *, expected: str | None, hint: str, found: str | None = None,
              header: Any = None) -> ConfigError:
        """``mark`` gives the key path; the file:line header is ``header`` when given (where the parser noticed)."""
        kp = key_path_at(text, mark.line, mark.column) if mark is not None else ()
        return ConfigError(
            f"invalid YAML: {message}",
            location=mark_location(path, header if header is not None else mark),
            key_path=format_key_path(kp) if kp else None,
            expected=expected,
            found=found or f"{noticed}, where the parser noticed",
            hint=hint,
        )

    if "quoted scalar" in context and cmark is not None:
        quote = text[cmark.index] if cmark.index < len(text) else '"'
        return error(
            f"the {quote} opened at {_at(cmark)} is never closed",
            cmark,
            header=pmark,
            expected=f"a closing {quote} on the same value",
            hint=f"add the closing {quote}; inside {quote}...{quote} write a {quote} as "
            + ("\\\"" if quote == '"' else "''"),
        )
    if "flow sequence" in context or "flow mapping" in context:
        opener, closer = ("[", "]") if "sequence" in context else ("{", "}")
        at = cmark if cmark is not None else pmark
        return error(
            f"the '{opener}' opened at {_at(at)} is never closed",
            at,
            header=pmark,
            expected=f"',' or '{closer}' before the next key",
            hint=f"close it with '{closer}', or write the items as a block list/mapping on their own lines",
        )
    if "\\t" in problem or "tab" in problem:
        return error(
            f"a tab character at {_at(pmark)}",
            pmark,
            expected="indentation with spaces",
            found=f"a tab at {_at(pmark)}",
            hint="YAML is indented with spaces, never tabs: replace the tab with spaces",
        )
    if pmark is not None and "expected <block end>" in problem and cmark is not None:
        row = lines[pmark.line] if pmark.line < len(lines) else ""
        key = _unquote(row.strip().split(":", 1)[0])
        first = lines[cmark.line] if cmark.line < len(lines) else ""
        above = _previous_line(lines, pmark.line)
        first_key = _unquote(first.strip().split(":", 1)[0])
        forms = [f"{cmark.column} spaces (next to '{first_key}' at line {cmark.line + 1})"]
        if above is not None and _indent(above) != cmark.column:
            forms.append(f"{_indent(above)} spaces (next to '{_unquote(above.strip().split(':', 1)[0])}' above it)")
        return error(
            f"'{key}' at line {pmark.line + 1} is indented less than the key above it",
            pmark,
            expected=" or ".join(forms),
            found=f"{_indent(row)} spaces",
            hint=f"under-indented key: align '{key}' with the keys it belongs with",
        )
    if pmark is not None and "mapping values are not allowed" in problem:
        above = _previous_line(lines, pmark.line)
        row = lines[pmark.line] if pmark.line < len(lines) else ""
        key = _unquote(row.strip().split(":", 1)[0])
        if above is not None and _indent(row) > _indent(above) and ":" in above and not above.rstrip().endswith(":"):
            parent = key_path_at(text, pmark.line, _indent(above))
            return ConfigError(
                f"invalid YAML: '{key}' at line {pmark.line + 1} is indented more than the key above it",
                location=Location(str(path), pmark.line + 1, _indent(row) + 1),
                key_path=format_key_path((*parent, key)),
                expected=f"{_indent(above)} spaces, like '{_unquote(above.strip().split(':', 1)[0])}' above it",
                found=f"{_indent(row)} spaces: YAML reads the line as the rest of the value above",
                hint=f"over-indented key: move '{key}' left to its siblings' indentation",
            )
        return error(
            f"a ': ' inside a value at {_at(pmark)}",
            pmark,
            expected="one 'key: value' per line",
            found=f"': ' at {_at(pmark)}",
            hint="quote a value that contains ': ' (e.g. why: \"a: b\"), or put the key on its own line",
        )
    where = f" ({context} at {_at(cmark)})" if context and cmark is not None else (f" ({context})" if context else "")
    return error(
        problem + where,
        pmark or cmark,
        expected=None,
        hint="check quoting and indentation around this position",
    )


def _previous_line(lines: list[str], line: int) -> str | None:
    for index in range(line - 1, -1, -1):
        if lines[index].strip() and not lines[index].lstrip().startswith("#"):
            return lines[index]
    return None
