"""Safe YAML loading with positions, plus JSON Schema validation that reports every error.

Over 600 lines: safe loading with positions, hostile-input limits and every syntax/schema message in one place.

Shared by the build manifest and the smoke suites, so both report problems the same way:
``file:line:column: key.path[3].name: message`` with expected/found and a hint.

* Only YAML's safe types are constructed; any explicit tag other than the standard ones
  (``!!python/object`` ...) is rejected before construction.
* Duplicate mapping keys are an error (PyYAML silently keeps the last one).
* Files over ``MAX_BYTES`` are refused, as are directories, binary, UTF-16 and empty files.
* Hostile documents are config errors, never a crash: nesting deeper than ``MAX_DEPTH``,
  more than ``MAX_NODES`` nodes once aliases are expanded (an alias bomb) and an alias that
  contains itself are refused before anything walks or constructs them.
* Syntax errors say where the construct started (an unclosed bracket or quote), where the
  parser noticed, the key path when the text shows it, and a hint for that kind of error.
* The raw text of every plain scalar is kept (``YamlDocument.scalars``), so messages can
  show ``0644`` as written rather than the integer 420 YAML made of it.
* Implicit dates (``2025-01-15``) load as dates and are reported by ``validate_schema``.
"""

from __future__ import annotations

import datetime
import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, ErrorCollector, Location, Problem

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64  # nesting of mappings/lists; manifests and suites use < 15
MAX_NODES = 100_000  # nodes counted with aliases expanded; the repo's largest file has ~3000
SCHEMA_PACKAGE = "imageforge"  # in a wheel the JSON Schemas are package data: imageforge/schema/*.json

KeyPath = tuple[str | int, ...]

_SAFE_TAGS = {
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


def format_key_path(path: Iterable[str | int]) -> str:
    """``('targets', 'cpu', 'steps', 3, 'old')`` -> ``targets.cpu.steps[3].old``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


@dataclass(frozen=True)
class YamlDocument:
    """A loaded YAML file: plain data plus where each key path came from."""

    path: Path
    data: Any
    positions: Mapping[KeyPath, tuple[int, int]]
    raw: bytes
    scalars: Mapping[KeyPath, str] = field(default_factory=dict)  # raw text of plain (unquoted) scalars

    def written(self, key_path: Sequence[str | int]) -> str | None:
        """The text of an unquoted scalar as the file spells it (``0644``, ``true``, ``010``), else None."""
        return self.scalars.get(tuple(key_path))

    def location(self, key_path: Sequence[str | int]) -> Location:
        """Location of ``key_path``, or of its nearest ancestor that has one."""
        kp = tuple(key_path)
        while True:
            if kp in self.positions:
                line, col = self.positions[kp]
                return Location(str(self.path), line, col)
            if not kp:
                return Location(str(self.path), 1, 1)
            kp = kp[:-1]

    def problem(self, key_path: Sequence[str | int], message: str, **kw: str | None) -> Problem:
        return Problem(message, location=self.location(key_path), key_path=format_key_path(key_path), **kw)


def _mark_location(path: Path, mark: Any) -> Location:
    if mark is None:
        return Location(str(path))
    return Location(str(path), mark.line + 1, mark.column + 1)


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting deeper than MAX_DEPTH (it recurses per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # The scanner itself slows quadratically with open '[' / '{' (one pending simple key per level):
        # stop at the first bracket too many, before the composer ever sees it.
        if self.flow_level >= MAX_DEPTH:
            raise _TooDeep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


class _TooDeep(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__("too deep")
        self.mark = mark


def _explicit_tag(text: str, node: yaml.Node) -> bool:
    """True when the file writes a tag (``!!timestamp x``) at the node, not when YAML guessed it."""
    start = node.start_mark.index
    return re.match(r"(&\S+\s+)?!", text[start : start + 200]) is not None


class _Walker:
    """Records positions and raw scalar text; refuses bad tags, duplicate keys and alias bombs."""

    def __init__(self, path: Path, text: str, what: str) -> None:
        self.path = path
        self.text = text
        self.what = what
        self.positions: dict[KeyPath, tuple[int, int]] = {}
        self.scalars: dict[KeyPath, str] = {}
        self.visited = 0
        self.open: dict[int, KeyPath] = {}  # id(node) -> key path, for the collections being walked

    def walk(self, node: yaml.Node, key_path: KeyPath) -> None:
        self.visited += 1
        if len(key_path) > MAX_DEPTH:  # the C parser composes without the position loader's depth guard
            raise _TooDeep(node.start_mark)
        if self.visited > MAX_NODES:
            raise ConfigError(
                f"{self.what} expands to too many values",
                location=_mark_location(self.path, node.start_mark),
                key_path=format_key_path(key_path),
                expected=f"at most {MAX_NODES} values with aliases expanded",
                found=f"more than {MAX_NODES}: aliases that repeat aliases multiply (an alias bomb?)",
                hint="write the values out, or use each anchor where it is needed only",
            )
        self.positions[key_path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if node.tag not in _SAFE_TAGS and not (node.tag == _TIMESTAMP and not _explicit_tag(self.text, node)):
            raise ConfigError(
                f"YAML tag {node.tag!r} is not allowed",
                location=_mark_location(self.path, node.start_mark),
                key_path=format_key_path(key_path),
                expected="plain YAML values (strings, numbers, booleans, null, lists, mappings)",
                found=node.tag,
                hint="imageforge loads YAML safely; remove the '!' tag",
            )
        if isinstance(node, yaml.ScalarNode):
            if not node.style:  # plain: None from the Python parser, "" from libyaml's
                self.scalars[key_path] = node.value
            return
        if id(node) in self.open:
            raise ConfigError(
                "an alias contains itself",
                location=_mark_location(self.path, node.start_mark),
                key_path=format_key_path(key_path),
                expected="aliases to values that are complete where the alias is used",
                found=f"{format_key_path(key_path)} repeats {format_key_path(self.open[id(node)])}, without end",
                hint="YAML cannot nest a list or mapping inside itself for imageforge; write the value out",
            )
        self.open[id(node)] = key_path
        try:
            if isinstance(node, yaml.MappingNode):
                self._mapping(node, key_path)
            elif isinstance(node, yaml.SequenceNode):
                for index, item in enumerate(node.value):
                    self.walk(item, (*key_path, index))
        finally:
            del self.open[id(node)]

    def _mapping(self, node: yaml.MappingNode, key_path: KeyPath) -> None:
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(
                    "mapping keys must be plain scalars",
                    location=_mark_location(self.path, key_node.start_mark),
                    key_path=format_key_path(key_path),
                )
            key = key_node.value
            if key in seen:
                first = seen[key].start_mark
                raise ConfigError(
                    f"duplicate key {key!r}",
                    location=_mark_location(self.path, key_node.start_mark),
                    key_path=format_key_path((*key_path, key)),
                    expected="each key once per mapping",
                    found=f"{key!r} again (first at line {first.line + 1})",
                    hint="YAML would silently keep only the last value; remove one of them",
                )
            seen[key] = key_node
            child = (*key_path, key)
            self.walk(value_node, child)
            # Point a key path at the key itself: that is where a reader looks first.
            self.positions[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)


def read_source(path: Path, what: str) -> bytes:
    """Read a config file with the size/type guards every loader wants."""
    if not path.exists():
        raise ConfigError(f"{what} not found", location=Location(str(path)), hint="check the path")
    if path.is_dir():
        raise ConfigError(
            f"{what} is a directory", location=Location(str(path)), expected="a YAML file", found="a directory"
        )
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError(
            f"{what} is too large",
            location=Location(str(path)),
            expected=f"at most {MAX_BYTES // 1024} KiB",
            found=f"{size / 1024:.0f} KiB",
            hint="manifests are small; is this the right file?",
        )
    raw = path.read_bytes()
    utf16 = _utf16_kind(raw)
    if utf16 is not None:
        raise ConfigError(
            f"{what} is UTF-16 text",
            location=Location(str(path)),
            expected="UTF-8 text",
            found=utf16,
            hint=f"save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 {path.name} > {path.stem}.utf8{path.suffix})",
        )
    if b"\x00" in raw:
        raise ConfigError(
            f"{what} is a binary file", location=Location(str(path)), expected="UTF-8 YAML text", found="NUL bytes"
        )
    return raw


def _utf16_kind(raw: bytes) -> str | None:
    """Say how a file looks like UTF-16 (byte-order mark, or ASCII with every other byte NUL), else None."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        order = "little" if raw.startswith(b"\xff\xfe") else "big"
        return f"UTF-16 ({order}-endian byte-order mark)"
    head = raw[:200]
    if len(head) >= 4 and b"\x00" not in head[0::2] and set(head[1::2]) == {0}:
        return "UTF-16 (little-endian, no byte-order mark)"
    if len(head) >= 4 and b"\x00" not in head[1::2] and set(head[0::2]) == {0}:
        return "UTF-16 (big-endian, no byte-order mark)"
    return None


def _decode(path: Path, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line = raw.count(b"\n", 0, exc.start) + 1
        column = len(raw[line_start : exc.start].decode("utf-8", errors="replace")) + 1
        bad = raw[exc.start : exc.end]
        raise ConfigError(
            f"{what} is not UTF-8 text",
            location=Location(str(path), line, column),
            expected="UTF-8 text",
            found=f"byte 0x{bad[0]:02x} at line {line}, column {column} (offset {exc.start})",
            hint="save the file as UTF-8; Latin-1 or Windows-1252 editors write such bytes for accented letters",
        ) from None


def load_yaml(path: Path, *, what: str = "manifest") -> YamlDocument:
    """Load one YAML document safely, keeping positions. Raises ConfigError."""
    raw = read_source(path, what)
    text = _decode(path, raw, what)
    if not text.strip():
        raise ConfigError(
            f"{what} is empty", location=Location(str(path), 1, 1), expected="a YAML mapping", found="nothing"
        )
    loader = _Loader(text)
    walker = _Walker(path, text, what)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{what} is empty", location=Location(str(path), 1, 1), expected="a YAML mapping")
        walker.walk(node, ())
        data = loader.construct_document(node)
    except _TooDeep as exc:
        raise _too_deep(path, what, _mark_location(path, exc.mark)) from None
    except RecursionError:
        raise _too_deep(path, what, Location(str(path))) from None
    except yaml.MarkedYAMLError as exc:
        raise syntax_error(path, text, exc) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", location=Location(str(path))) from None
    finally:
        loader.dispose()
    return YamlDocument(path=path, data=data, positions=walker.positions, raw=raw, scalars=walker.scalars)


def load_yaml_c(path: Path, *, what: str = "manifest") -> YamlDocument:
    """:func:`load_yaml`'s document (data, positions, raw scalars, the same refusals) read with libyaml's C parser.

    About 10x faster on a smoke suite. Anything the C parser or the walker does not accept is read again
    with :func:`load_yaml`, whose messages say what and where; without libyaml it is :func:`load_yaml`.
    """
    c_loader = getattr(yaml, "CSafeLoader", None)
    raw = read_source(path, what)
    text = _decode(path, raw, what)
    if c_loader is None or not text.strip():
        return load_yaml(path, what=what)
    loader = c_loader(text)
    walker = _Walker(path, text, what)
    try:
        node = loader.get_single_node()
        if node is None:
            return load_yaml(path, what=what)
        walker.walk(node, ())
        data = loader.construct_document(node)
    except (yaml.YAMLError, ConfigError, _TooDeep, RecursionError):
        return load_yaml(path, what=what)
    finally:
        loader.dispose()
    return YamlDocument(path=path, data=data, positions=walker.positions, raw=raw, scalars=walker.scalars)


def _too_deep(path: Path, what: str, location: Location) -> ConfigError:
    return ConfigError(
        f"{what} is nested too deeply",
        location=location,
        expected=f"at most {MAX_DEPTH} levels of nested lists and mappings",
        found=f"more than {MAX_DEPTH} levels",
        hint="manifests and suites nest a few levels; is this a generated file?",
    )


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
            location=_mark_location(path, header if header is not None else mark),
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



# --------------------------------------------------------------------------- schema


#: The one place the schemas live in the source tree: schema/ at the top of the repository.
CHECKOUT_SCHEMAS = Path(__file__).resolve().parents[2] / "schema"


def schema_text(name: str) -> str:
    """The text of JSON Schema NAME: the wheel's package data, else the checkout's top-level ``schema/``.

    ``setup.py``'s build hook copies ``schema/*.json`` to ``imageforge/schema/`` in the wheel (no
    second copy in git); an editable install or ``PYTHONPATH=src`` reads ``schema/`` beside ``src/``.
    """
    from importlib.resources import files

    packaged = files(SCHEMA_PACKAGE).joinpath("schema").joinpath(name)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = CHECKOUT_SCHEMAS / name
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise FileNotFoundError(f"JSON Schema {name}: neither package data imageforge/schema/{name} nor {checkout}")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A JSON Schema (see :func:`schema_text`), so a checkout and an installed wheel validate alike."""
    schema: dict[str, Any] = json.loads(schema_text(name))
    return schema


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


def _short(value: Any) -> str:
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {"object": "mapping", "array": "list"}


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    if not matches:
        return None
    return "did you mean " + " or ".join(repr(m) for m in matches) + "?"


def _schema_problems(doc: YamlDocument, error: Any) -> Iterator[Problem]:
    """Turn one jsonschema error into readable problems (several for many unknown keys)."""
    path = tuple(error.absolute_path)
    validator = error.validator
    schema = error.schema
    instance = error.instance
    if validator == "additionalProperties" and isinstance(instance, dict):
        allowed = list(schema.get("properties", {}))
        for key in instance:
            if key in allowed:
                continue
            patterns = schema.get("patternProperties", {})
            if patterns:
                continue
            yield doc.problem(
                (*path, key),
                f"unknown key {key!r}",
                expected="one of " + ", ".join(repr(a) for a in allowed) if allowed else "no keys here",
                found=repr(key),
                hint=did_you_mean(key, allowed) or "remove it, or check the indentation",
            )
        return
    if validator == "required":
        missing = [k for k in schema.get("required", []) if k not in instance]
        for key in missing:
            yield doc.problem(
                path,
                f"missing required key {key!r}",
                expected=f"a {key!r} entry",
                found="keys " + ", ".join(repr(k) for k in instance) if instance else "an empty mapping",
            )
        return
    if validator == "type":
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else list(expected)
        written = doc.written(path)
        found = f"{type_name(instance)} {_short(instance)}"
        hint = None
        if "string" in names and written is not None and not isinstance(instance, str):
            # YAML turned unquoted text into a number, boolean or date: show it as the file spells it.
            if written != _short(instance):
                found = f"{type_name(instance)} {written} (YAML reads the unquoted {written} as {_short(instance)})"
            else:
                found = f"{type_name(instance)} {written}"
            hint = f"write it quoted: '{written}'"
        yield doc.problem(
            path,
            "wrong type",
            expected=" or ".join(_TYPE_WORDS.get(n, n) for n in names),
            found=found,
            hint=hint,
        )
        return
    if validator in ("enum", "const"):
        options = error.validator_value if validator == "enum" else [error.validator_value]
        hint = did_you_mean(str(instance), [str(o) for o in options]) if isinstance(instance, str) else None
        found = _short(instance)
        if isinstance(instance, datetime.date):
            found = f"a {type_name(instance)}, {_short(instance)}"
        yield doc.problem(
            path,
            "value not allowed",
            expected="one of " + ", ".join(_short(o) for o in options),
            found=found,
            hint=hint,
        )
        return
    if validator == "pattern" and "propertyNames" in error.schema_path and isinstance(instance, str):
        # jsonschema reports a bad key at its mapping; point at the key itself.
        parent = error.parent
        description = parent.schema.get("description") if parent is not None else None
        described = schema.get("description") or description
        fixed = instance.replace("_", "-").lower()
        hint = None
        if fixed != instance and re.search(error.validator_value, fixed):
            hint = f"use dashes: {fixed!r}" if "_" in instance else f"write it in lowercase: {fixed!r}"
        yield doc.problem(
            (*path, instance),
            f"key {instance!r} has the wrong form",
            expected=described or f"a key matching {error.validator_value}",
            found=repr(instance),
            hint=hint,
        )
        return
    if validator == "pattern":
        yield doc.problem(
            path,
            "value has the wrong form",
            expected=f"text matching {error.validator_value}",
            found=_short(instance),
        )
        return
    if validator == "propertyNames":
        bad = error.instance
        yield doc.problem(path, "invalid name", expected=schema.get("description") or "a valid name", found=_short(bad))
        return
    forms = [o.get("description") for o in error.validator_value] if validator in ("oneOf", "anyOf") else []
    if forms and all(forms):
        found = f"{type_name(instance)} {_short(instance)}"
        if isinstance(instance, dict):
            found = "keys " + ", ".join(repr(k) for k in instance) if instance else "an empty mapping"
        yield doc.problem(
            path,
            "not one of the accepted forms",
            expected=" or ".join(forms),
            found=found,
            hint=_mapping_hint(path, instance, error.validator_value),
        )
        return
    if validator == "oneOf" and isinstance(instance, dict):
        options = [sorted(o.get("required", [])) for o in error.validator_value if "required" in o]
        yield doc.problem(
            path,
            "exactly one form must be used",
            expected=" or ".join("{" + ", ".join(o) + "}" for o in options) if options else "one alternative",
            found="keys " + ", ".join(repr(k) for k in instance),
        )
        return
    if validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        words = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
        yield doc.problem(path, "value out of range", expected=f"{words[validator]} {error.validator_value}",
                          found=_short(instance))
        return
    if validator in ("minLength", "minItems", "minProperties"):
        yield doc.problem(path, "value is empty", expected=f"{validator} {error.validator_value}",
                          found=_short(instance))
        return
    yield doc.problem(path, error.message)


def _mapping_hint(path: KeyPath, instance: Any, branches: Sequence[Mapping[str, Any]]) -> str | None:
    """``base: images/cpu`` -> "write it as a mapping: base: {image: images/cpu} or base: {recipe: images/cpu}"."""
    if not path or isinstance(instance, dict | list) or not isinstance(path[-1], str):
        return None
    keys = [b["required"][0] for b in branches if len(b.get("required", ())) == 1]
    if not keys:
        return None
    return "write it as a mapping: " + " or ".join(f"{path[-1]}: {{{k}: {instance}}}" for k in keys)


def _plain_forms(error: Any) -> bool:
    return error.validator in ("oneOf", "anyOf") and all(o.get("description") for o in error.validator_value)


def _dates(data: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    if isinstance(data, datetime.date):
        yield path, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _dates(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _dates(value, (*path, index))


def validate_schema(doc: YamlDocument, schema_name: str, *, what: str) -> None:
    """Validate ``doc.data`` against the package's ``schema/<schema_name>``; report every error at once."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(doc.data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    collector = ErrorCollector()
    seen: set[tuple[str | None, str]] = set()
    # Where a oneOf/anyOf names its forms in words, that one message replaces the rest at that path.
    worded = {tuple(e.absolute_path) for e in errors if _plain_forms(e)}
    for error in errors:
        # if/then and allOf wrappers re-report what their branches found; keep the leaves.
        if error.validator in ("allOf", "if", "then", "$ref"):
            continue
        if tuple(error.absolute_path) in worded and not _plain_forms(error):
            continue
        for problem in _schema_problems(doc, error):
            key = (problem.key_path, problem.message)
            if key not in seen:
                seen.add(key)
                collector.add(problem)
    reported = {p.key_path for p in collector.problems}
    for date_path, value in _dates(doc.data):
        # Unquoted 2025-01-15 is a YAML date; where the schema let it through, it is still never meant.
        if format_key_path(date_path) in reported:
            continue
        written = doc.written(date_path) or _short(value)
        collector.add(doc.problem(date_path, f"a {type_name(value)} is not allowed here",
                                  expected="text, a number or a boolean", found=f"{type_name(value)} {written}",
                                  hint=f"write it quoted: '{written}'"))
    collector.raise_if_any(f"{doc.path} does not match the {what} schema")
