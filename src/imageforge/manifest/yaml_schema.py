"""The JSON Schemas (the top-level ``schema/``, package data in a wheel) and the check that reports every error.

:func:`validate_schema` turns each jsonschema error into a problem at its key path (unknown keys with a
"did you mean", missing keys, types as the file wrote them, the forms of a oneOf in words) and reports an
implicit date (``2025-01-15``) wherever the schema let it through.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..errors import ErrorCollector, Problem
from .yaml_messages import KeyPath, did_you_mean, format_key_path, type_name
from .yamldoc import YamlDocument

SCHEMA_PACKAGE = "imageforge"  # in a wheel the JSON Schemas are package data: imageforge/schema/*.json



#: The one place the schemas live in the source tree: schema/ at the top of the repository.
CHECKOUT_SCHEMAS = Path(__file__).resolve().parents[3] / "schema"


def schema_text(name: str) -> str:
    """The text of JSON Schema NAME: the wheel's package data, else the checkout's top-level ``schema/``.

    ``setup.py``'s build hook copies ``schema/*.json`` to ``imageforge/schema/`` in the wheel (no
    second copy in git); an editable install or ``PYTHONPATH=src`` reads ``schema/`` beside ``src/``.
    """
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


def _short(value: Any) -> str:
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {"object": "mapping", "array": "list"}


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


def validate_schema(doc: YamlDocument, schema: str | Mapping[str, Any], *, what: str) -> None:
    """Validate ``doc.data`` against the package's ``schema/<schema>`` (or the schema given); report every error."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(schema) if isinstance(schema, str) else schema)
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
