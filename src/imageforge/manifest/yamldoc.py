"""Safe YAML loading with positions: the one loader of the build manifest and the smoke suites.

Both report problems the same way: ``file:line:column: key.path[3].name: message`` with expected/found and a
hint (the words in :mod:`imageforge.manifest.yaml_messages`; the JSON Schema check of a loaded document in
:mod:`imageforge.manifest.yaml_schema`).

* Only YAML's safe types are constructed; any explicit tag other than the standard ones
  (``!!python/object`` ...) is rejected before construction.
* Duplicate mapping keys are an error (PyYAML silently keeps the last one).
* Files over ``MAX_BYTES`` are refused, as are directories, binary, UTF-16 and empty files.
* Hostile documents are config errors, never a crash: nesting deeper than ``MAX_DEPTH``,
  more than ``MAX_NODES`` nodes once aliases are expanded (an alias bomb) and an alias that
  contains itself are refused before anything walks or constructs them.
* Syntax errors say where the construct started (an unclosed bracket or quote), where the
  parser noticed, the key path when the text shows it, and a hint for that kind of error
  (:func:`imageforge.manifest.yaml_messages.syntax_error`).
* The raw text of every plain scalar is kept (``YamlDocument.scalars``), so messages can
  show ``0644`` as written rather than the integer 420 YAML made of it.
* Implicit dates (``2025-01-15``) load as dates and are reported by
  :func:`imageforge.manifest.yaml_schema.validate_schema`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, Location, Problem
from .yaml_messages import KeyPath, format_key_path, mark_location, syntax_error

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64  # nesting of mappings/lists; manifests and suites use < 15
MAX_NODES = 100_000  # nodes counted with aliases expanded; the repo's largest file has ~3000

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
                location=mark_location(self.path, node.start_mark),
                key_path=format_key_path(key_path),
                expected=f"at most {MAX_NODES} values with aliases expanded",
                found=f"more than {MAX_NODES}: aliases that repeat aliases multiply (an alias bomb?)",
                hint="write the values out, or use each anchor where it is needed only",
            )
        self.positions[key_path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if node.tag not in _SAFE_TAGS and not (node.tag == _TIMESTAMP and not _explicit_tag(self.text, node)):
            raise ConfigError(
                f"YAML tag {node.tag!r} is not allowed",
                location=mark_location(self.path, node.start_mark),
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
                location=mark_location(self.path, node.start_mark),
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
                    location=mark_location(self.path, key_node.start_mark),
                    key_path=format_key_path(key_path),
                )
            key = key_node.value
            if key in seen:
                first = seen[key].start_mark
                raise ConfigError(
                    f"duplicate key {key!r}",
                    location=mark_location(self.path, key_node.start_mark),
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
        raise _too_deep(path, what, mark_location(path, exc.mark)) from None
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
