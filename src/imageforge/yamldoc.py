"""Safe YAML loading with positions, plus JSON Schema validation that reports every error.

Shared by the build manifest and the smoke suites, so both report problems the same way:
``file:line:column: key.path[3].name: message`` with expected/found and a hint.

* Only YAML's safe types are constructed; any explicit tag other than the standard ones
  (``!!python/object`` ...) is rejected before construction.
* Duplicate mapping keys are an error (PyYAML silently keeps the last one).
* Files over ``MAX_BYTES`` are refused, as are directories, binary and empty files.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, ErrorCollector, Location, Problem

MAX_BYTES = 1024 * 1024
SCHEMA_PACKAGE = "imageforge"  # the JSON Schemas are package data: imageforge/schema/*.json

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


def _walk(path: Path, node: yaml.Node, key_path: KeyPath, positions: dict[KeyPath, tuple[int, int]]) -> None:
    positions[key_path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if node.tag not in _SAFE_TAGS:
        raise ConfigError(
            f"YAML tag {node.tag!r} is not allowed",
            location=_mark_location(path, node.start_mark),
            key_path=format_key_path(key_path),
            expected="plain YAML values (strings, numbers, booleans, null, lists, mappings)",
            found=node.tag,
            hint="imageforge loads YAML safely; remove the '!' tag",
        )
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(
                    "mapping keys must be plain scalars",
                    location=_mark_location(path, key_node.start_mark),
                    key_path=format_key_path(key_path),
                )
            key = key_node.value
            if key in seen:
                first = seen[key].start_mark
                raise ConfigError(
                    f"duplicate key {key!r}",
                    location=_mark_location(path, key_node.start_mark),
                    key_path=format_key_path((*key_path, key)),
                    expected="each key once per mapping",
                    found=f"{key!r} again (first at line {first.line + 1})",
                    hint="YAML would silently keep only the last value; remove one of them",
                )
            seen[key] = key_node
            child = (*key_path, key)
            _walk(path, value_node, child, positions)
            # Point a key path at the key itself: that is where a reader looks first.
            positions[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(path, item, (*key_path, index), positions)


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
    if b"\x00" in raw:
        raise ConfigError(
            f"{what} is a binary file", location=Location(str(path)), expected="UTF-8 YAML text", found="NUL bytes"
        )
    return raw


def load_yaml(path: Path, *, what: str = "manifest") -> YamlDocument:
    """Load one YAML document safely, keeping positions. Raises ConfigError."""
    raw = read_source(path, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} is not UTF-8 text",
            location=Location(str(path)),
            found=f"undecodable byte at offset {exc.start}",
        ) from None
    if not text.strip():
        raise ConfigError(
            f"{what} is empty", location=Location(str(path), 1, 1), expected="a YAML mapping", found="nothing"
        )
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{what} is empty", location=Location(str(path), 1, 1), expected="a YAML mapping")
        positions: dict[KeyPath, tuple[int, int]] = {}
        _walk(path, node, (), positions)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc)
        hint = "YAML is indented with spaces, never tabs" if "\\t" in problem or "tab" in problem else None
        raise ConfigError(
            f"invalid YAML: {problem}" + (f" ({exc.context})" if exc.context else ""),
            location=_mark_location(path, mark),
            hint=hint or "check quoting and indentation around this position",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", location=Location(str(path))) from None
    finally:
        loader.dispose()
    return YamlDocument(path=path, data=data, positions=positions, raw=raw)


# --------------------------------------------------------------------------- schema


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped in the package (``imageforge/schema/NAME``), so an installed wheel validates too."""
    from importlib.resources import files

    schema: dict[str, Any] = json.loads(files(SCHEMA_PACKAGE).joinpath("schema", name).read_text(encoding="utf-8"))
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
    if isinstance(value, list | tuple):
        return "array" if json_terms else "list"
    if isinstance(value, Mapping):
        return "object" if json_terms else "mapping"
    return type(value).__name__


def _short(value: Any) -> str:
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
        yield doc.problem(
            path,
            "wrong type",
            expected=" or ".join(_TYPE_WORDS.get(n, n) for n in names),
            found=f"{type_name(instance)} {_short(instance)}",
        )
        return
    if validator in ("enum", "const"):
        options = error.validator_value if validator == "enum" else [error.validator_value]
        hint = did_you_mean(str(instance), [str(o) for o in options]) if isinstance(instance, str) else None
        yield doc.problem(
            path,
            "value not allowed",
            expected="one of " + ", ".join(_short(o) for o in options),
            found=_short(instance),
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


def validate_schema(doc: YamlDocument, schema_name: str, *, what: str) -> None:
    """Validate ``doc.data`` against the package's ``schema/<schema_name>``; report every error at once."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(doc.data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    collector = ErrorCollector()
    seen: set[tuple[str | None, str]] = set()
    for error in errors:
        # if/then and allOf wrappers re-report what their branches found; keep the leaves.
        if error.validator in ("allOf", "if", "then", "$ref"):
            continue
        for problem in _schema_problems(doc, error):
            key = (problem.key_path, problem.message)
            if key not in seen:
                seen.add(key)
                collector.add(problem)
    collector.raise_if_any(f"{doc.path} does not match the {what} schema")
