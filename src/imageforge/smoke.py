"""Smoke suites: checks as data, run against an OpenAI-compatible server, with reports.

A suite is a YAML file (``schema/smoke.schema.json``, strict; errors name file:line like the
manifest's).  Each check is a request (method, endpoint, body, stream, repeat, concurrency,
timeout) and expectations (status, JSON Schema of the body, JSONPath comparisons, regular
expressions, relations between fields, stream == non-stream, /metrics counters growing by a
computed amount, healthy afterwards).  Checks carry tags (``dummy-ok``, ``real-weights``)
chosen with ``--tags``; ``serial`` checks run alone, the rest concurrently.

Expressions (relations, metric deltas, ``${...}`` templates) are a small, safe subset of
Python: literals, names, ``a.b`` field access on mappings, ``a[i]``, arithmetic, comparisons,
``and``/``or``/``not``, ``x if c else y``, comprehensions and a few functions (``len``,
``sum``, ``min``, ``max``, ``json``, ``valid``, ``fullmatch`` ...).  Names: ``request``
(the body sent), ``response`` (the body received; for streams the assembled answer, with
``chunks``), ``responses`` (all of a repeated request), ``status``, ``non_stream``, the
suite's variables, and, as a fallback, the top-level fields of the response body -- so
``usage.completion_tokens <= request.max_tokens`` reads naturally.

Reports: a live table (check, status, latency), a closing line ``N passed, N failed``
(``, N skipped``), ``smoke.json`` and ``smoke-junit.xml`` under ``.imageforge/runs/<run id>/``,
and for each failure the request, the response and the server's last log lines.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import datetime as _dt
import json
import math
import os
import re
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .errors import ConfigError, ErrorCollector, Location, SmokeError
from .yamldoc import YamlDocument, format_key_path, load_yaml, type_name, validate_schema

Log = Callable[[str], None]

SCHEMA_NAME = "smoke.schema.json"
DEFAULT_TIMEOUT = 60.0
DEFAULT_CONCURRENCY = 4
DEFAULT_TAGS = ("dummy-ok",)
MAX_SEQUENCE = 1_000_000  # longest list/string an expression may build
TRUNCATE = 2000  # characters of a body kept in reports
METRICS_SETTLE = 5.0  # seconds to wait for /metrics counters to catch up
LOG_TAIL = 50

PATH_OPS = (
    "equals", "not_equals", "one_of", "contains", "not_contains", "matches", "full_match", "gt", "ge", "lt",
    "le", "type", "length", "min_length", "exists", "count", "valid", "parses_as",
)


# =========================================================================== expressions


class ExprError(Exception):
    """An expression could not be parsed (load time) or evaluated (run time)."""


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}
_CMP_TEXT = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
             ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def _json_loads(text: Any) -> Any:
    if not isinstance(text, str):
        raise ExprError(f"json() needs a string, got {type(text).__name__}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ExprError(f"json(): not valid JSON ({exc}): {_short(text)}") from None


def _valid(instance: Any, schema: Any) -> bool:
    from jsonschema import Draft202012Validator

    return bool(Draft202012Validator(schema).is_valid(instance))


def _get(obj: Any, key: Any, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    if isinstance(obj, list | tuple) and isinstance(key, int):
        return obj[key] if -len(obj) <= key < len(obj) else default
    return default


def _concat(items: Iterable[Any]) -> str:
    return "".join("" if item is None else str(item) for item in items)


FUNCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    "len": len,
    "sum": sum,
    "min": min,
    "max": max,
    "abs": abs,
    "all": all,
    "any": any,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "round": round,
    "sorted": sorted,
    "list": list,
    "set": set,
    "unique": lambda items: len(set(map(_canonical, items))) == len(list(items)),
    "keys": lambda mapping: list(mapping),
    "values": lambda mapping: list(mapping.values()),
    "get": _get,
    "json": _json_loads,
    "valid": _valid,
    "concat": _concat,
    "fullmatch": lambda pattern, text: re.fullmatch(pattern, text) is not None,
    "search": lambda pattern, text: re.search(pattern, text) is not None,
    "count": lambda items, value: list(items).count(value),
})

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.Compare, ast.Call, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Attribute, ast.Subscript,
    ast.Slice, ast.List, ast.Tuple, ast.Dict, ast.ListComp, ast.GeneratorExp, ast.DictComp,
    ast.comprehension, ast.IfExp, *_BINOPS, *_CMPOPS,
)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Expr:
    """A parsed, checked expression (see the module doc for the language)."""

    text: str
    tree: ast.Expression = field(repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> Expr:
        source = text.strip()
        if not source:
            raise ExprError("empty expression")
        try:
            tree = ast.parse(source, mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"syntax error: {exc.msg} (column {exc.offset})") from None
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise ExprError(f"{type(node).__name__} is not allowed in expressions")
            if isinstance(node, ast.Name) and node.id.startswith("_"):
                raise ExprError(f"names may not start with '_': {node.id}")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                raise ExprError(f"fields may not start with '_' in a.b form: {node.attr} (use a['{node.attr}'])")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                    name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                    raise ExprError(f"unknown function {name!r}; known: {', '.join(sorted(FUNCTIONS))}")
                if node.keywords:
                    raise ExprError(f"{node.func.id}(): keyword arguments are not supported")
            if isinstance(node, ast.Constant) and not isinstance(node.value, str | int | float | bool | type(None)):
                raise ExprError(f"constant {node.value!r} is not allowed")
            if isinstance(node, ast.comprehension) and node.is_async:
                raise ExprError("async comprehensions are not allowed")
        return cls(source, tree)

    def evaluate(self, names: Mapping[str, Any]) -> Any:
        return _Evaluator(names).eval(self.tree.body)

    def explain(self, names: Mapping[str, Any]) -> str:
        """Why a comparison is false: its sides' values (``17 <= 16``)."""
        body = self.tree.body
        if isinstance(body, ast.Compare) and len(body.ops) == 1:
            ev = _Evaluator(names)
            try:
                left = ev.eval(body.left)
                right = ev.eval(body.comparators[0])
            except ExprError:
                return "false"
            return f"{_short(left)} {_CMP_TEXT[type(body.ops[0])]} {_short(right)} is false"
        return "false"


class _Evaluator:
    def __init__(self, names: Mapping[str, Any]) -> None:
        self.scopes: list[Mapping[str, Any]] = [names]

    def lookup(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in ("None", "True", "False"):
            return {"None": None, "True": True, "False": False}[name]
        if name in ("null", "true", "false"):
            return {"null": None, "true": True, "false": False}[name]
        raise ExprError(f"unknown name {name!r}")

    def eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            value = self.eval(node.value)
            if isinstance(value, Mapping):
                if node.attr in value:
                    return value[node.attr]
                raise ExprError(f"{ast.unparse(node.value)} has no field {node.attr!r}"
                                + (f" (fields: {', '.join(map(str, list(value)[:12]))})" if value else ""))
            raise ExprError(f"{ast.unparse(node.value)} is {_type_name(value)}, not a mapping: "
                            f"cannot read .{node.attr}")
        if isinstance(node, ast.Subscript):
            value = self.eval(node.value)
            index = self._slice(node.slice)
            try:
                return value[index]
            except (KeyError, IndexError, TypeError) as exc:
                raise ExprError(f"{ast.unparse(node)}: {type(exc).__name__} {exc} "
                                f"(on {_type_name(value)} {_short(value, 60)})") from None
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                result: Any = True
                for item in node.values:
                    result = self.eval(item)
                    if not result:
                        return result
                return result
            result = False
            for item in node.values:
                result = self.eval(item)
                if result:
                    return result
            return result
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            try:
                return -operand if isinstance(node.op, ast.USub) else +operand
            except TypeError as exc:
                raise ExprError(f"{ast.unparse(node)}: {exc}") from None
        if isinstance(node, ast.BinOp):
            left = self.eval(node.left)
            right = self.eval(node.right)
            if isinstance(node.op, ast.Mult):
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                        raise ExprError(f"{ast.unparse(node)}: result longer than {MAX_SEQUENCE}")
            try:
                return _BINOPS[type(node.op)](left, right)
            except (TypeError, ZeroDivisionError) as exc:
                raise ExprError(f"{ast.unparse(node)}: {exc}") from None
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self.eval(comparator)
                try:
                    ok = _CMPOPS[type(op)](left, right)
                except TypeError as exc:
                    raise ExprError(f"{ast.unparse(node)}: cannot compare {_short(left, 40)} "
                                    f"{_CMP_TEXT[type(op)]} {_short(right, 40)} ({exc})") from None
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            args = [self.eval(a) for a in node.args]
            try:
                return FUNCTIONS[node.func.id](*args)
            except ExprError:
                raise
            except Exception as exc:
                raise ExprError(f"{ast.unparse(node)}: {type(exc).__name__}: {exc}") from None
        if isinstance(node, ast.List | ast.Tuple):
            return [self.eval(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            out: dict[Any, Any] = {}
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    raise ExprError("** in dict literals is not supported")
                out[self.eval(k)] = self.eval(v)
            return out
        if isinstance(node, ast.ListComp | ast.GeneratorExp):
            return [self.eval(node.elt) for _ in self._comprehend(node.generators)]
        if isinstance(node, ast.DictComp):
            return {self.eval(node.key): self.eval(node.value) for _ in self._comprehend(node.generators)}
        raise ExprError(f"{type(node).__name__} is not allowed")  # pragma: no cover - parse() refuses it

    def _slice(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        return self.eval(node)

    def _comprehend(self, generators: Sequence[ast.comprehension], depth: int = 0) -> Iterator[None]:
        if depth == len(generators):
            yield None
            return
        gen = generators[depth]
        iterable = self.eval(gen.iter)
        if isinstance(iterable, Mapping):
            iterable = list(iterable)
        if not isinstance(iterable, list | tuple | str | set):
            raise ExprError(f"cannot iterate over {_type_name(iterable)} in {ast.unparse(gen)}")
        for item in iterable:
            scope: dict[str, Any] = {}
            self._bind(gen.target, item, scope)
            self.scopes.append(scope)
            try:
                if all(self.eval(cond) for cond in gen.ifs):
                    yield from self._comprehend(generators, depth + 1)
            finally:
                self.scopes.pop()

    def _bind(self, target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items = list(value)
            if len(items) != len(target.elts):
                raise ExprError(f"cannot unpack {len(items)} values into {ast.unparse(target)}")
            for t, v in zip(target.elts, items, strict=True):
                self._bind(t, v, scope)
        else:
            raise ExprError(f"cannot assign to {ast.unparse(target)}")


def _type_name(value: Any) -> str:
    return type_name(value, json_terms=True)


@lru_cache(maxsize=4096)
def parse_expr(text: str) -> Expr:
    return Expr.parse(text)


# --------------------------------------------------------------------------- templates

_TEMPLATE_START = "${"


def template_parts(text: str) -> list[str | Expr]:
    """Split ``"a ${x + 1} b"`` into ``["a ", Expr("x + 1"), " b"]``; ``$${`` is a literal ``${``."""
    parts: list[str | Expr] = []
    buf = ""
    i = 0
    while i < len(text):
        if text.startswith("$${", i):
            buf += "${"
            i += 3
            continue
        if text.startswith(_TEMPLATE_START, i):
            depth = 1
            j = i + 2
            quote: str | None = None
            while j < len(text) and depth:
                ch = text[j]
                if quote:
                    if ch == "\\":
                        j += 1
                    elif ch == quote:
                        quote = None
                elif ch in "'\"":
                    quote = ch
                elif ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                j += 1
            if depth:
                raise ExprError(f"unclosed ${{ at character {i + 1}")
            if buf:
                parts.append(buf)
                buf = ""
            parts.append(parse_expr(text[i + 2 : j - 1]))
            i = j
            continue
        buf += text[i]
        i += 1
    if buf or not parts:
        parts.append(buf)
    return parts


def check_templates(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(key path, message) for every template in ``value`` that does not parse."""
    if isinstance(value, str):
        if "${" in value:
            try:
                template_parts(value)
            except ExprError as exc:
                yield path, str(exc)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from check_templates(v, (*path, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from check_templates(v, (*path, i))


def render(value: Any, names: Mapping[str, Any]) -> Any:
    """A copy of ``value`` with every ``${...}`` evaluated; a string that is one template keeps the type."""
    if isinstance(value, str):
        if "${" not in value:
            return value
        parts = template_parts(value)
        if len(parts) == 1 and isinstance(parts[0], Expr):
            return parts[0].evaluate(names)
        out = ""
        for part in parts:
            if isinstance(part, Expr):
                result = part.evaluate(names)
                out += result if isinstance(result, str) else json.dumps(result)
            else:
                out += part
        return out
    if isinstance(value, Mapping):
        return {str(render(k, names)): render(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, names) for v in value]
    return value


# =========================================================================== the suite model


@dataclass(frozen=True)
class Request:
    endpoint: str
    method: str = "GET"
    body: Any = None
    raw_body: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    stream: bool = False
    repeat: int = 1
    concurrency: int = 1
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class PathExpectation:
    path: str
    op: str
    value: Any
    each: bool
    location: Location

    def describe(self) -> str:
        return f"{self.path} {self.op} {_short(self.value, 80)}" + (" (each)" if self.each else "")


@dataclass(frozen=True)
class RegexExpectation:
    pattern: str
    path: str | None
    full: bool
    negate: bool
    location: Location


@dataclass(frozen=True)
class Relation:
    expr: Expr
    location: Location


@dataclass(frozen=True)
class MetricExpectation:
    name: str
    labels: Mapping[str, str]
    delta: Expr | None
    min_delta: Expr | None
    location: Location


@dataclass(frozen=True)
class Expectations:
    status: tuple[int, ...] = (200,)
    schema: Mapping[str, Any] | None = None
    chunk_schema: Mapping[str, Any] | None = None
    paths: tuple[PathExpectation, ...] = ()
    regex: tuple[RegexExpectation, ...] = ()
    relations: tuple[Relation, ...] = ()
    stream_equals_non_stream: bool = False
    metrics: tuple[MetricExpectation, ...] = ()
    healthy_after: bool = False


@dataclass(frozen=True)
class Check:
    id: str
    request: Request
    expect: Expectations
    tags: tuple[str, ...]
    location: Location
    description: str | None = None
    serial: bool = False
    skip: str | None = None
    reference: Request | None = None

    def selected(self, tags: Iterable[str]) -> bool:
        wanted = set(tags)
        return not wanted or bool(wanted & set(self.tags))


@dataclass(frozen=True)
class SetupStep:
    id: str
    request: Request
    bind: Mapping[str, str]
    all_matches: bool
    location: Location


@dataclass(frozen=True)
class Suite:
    path: Path
    name: str
    description: str | None
    vars: Mapping[str, Any]
    setup: tuple[SetupStep, ...]
    checks: tuple[Check, ...]
    concurrency: int
    schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))

    def select(self, tags: Iterable[str]) -> tuple[Check, ...]:
        tags = tuple(tags)
        return tuple(c for c in self.checks if c.selected(tags))


# --------------------------------------------------------------------------- loading


class _SuiteLoader:
    def __init__(self, doc: YamlDocument, errors: ErrorCollector) -> None:
        self.doc = doc
        self.errors = errors
        data = doc.data
        self.defaults: Mapping[str, Any] = data.get("defaults", {})
        self.schemas: dict[str, Mapping[str, Any]] = dict(data.get("schemas", {}))

    def problem(self, kp: Sequence[str | int], message: str, **kw: str | None) -> None:
        self.errors.add(self.doc.problem(tuple(kp), message, **kw))

    def named_schema(self, kp: tuple[str | int, ...], value: Any) -> Mapping[str, Any] | None:
        from jsonschema import Draft202012Validator, SchemaError

        if isinstance(value, str):
            if value not in self.schemas:
                from .yamldoc import did_you_mean

                self.problem(kp, f"unknown schema name {value!r}",
                             expected="a JSON Schema mapping or one of the suite's schemas: "
                             + (", ".join(repr(s) for s in self.schemas) or "none defined"),
                             hint=did_you_mean(value, self.schemas))
                return None
            return self.schemas[value]
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            self.problem(kp, f"not a valid JSON Schema: {exc.message}",
                         found=format_key_path(tuple(exc.absolute_path)) or None)
            return None
        return MappingProxyType(dict(value))

    def expression(self, kp: tuple[str | int, ...], text: str) -> Expr | None:
        try:
            return parse_expr(text)
        except ExprError as exc:
            self.problem(kp, f"invalid expression: {exc}", found=text)
            return None

    def templates(self, kp: tuple[str | int, ...], value: Any) -> None:
        for sub, message in check_templates(value):
            self.problem((*kp, *sub), f"invalid ${{...}} template: {message}")

    def request(self, kp: tuple[str | int, ...], raw: Mapping[str, Any]) -> Request:
        body = raw.get("body")
        self.templates((*kp, "body"), body)
        self.templates((*kp, "endpoint"), raw["endpoint"])
        headers = {**self.defaults.get("headers", {}), **raw.get("headers", {})}
        method = raw.get("method") or ("POST" if "body" in raw or "raw_body" in raw else "GET")
        if "body" in raw and "raw_body" in raw:
            self.problem((*kp, "raw_body"), "a request has either body or raw_body, not both",
                         hint="raw_body sends text as is (e.g. malformed JSON); body sends JSON")
        if raw.get("stream") and not isinstance(body, Mapping):
            self.problem((*kp, "stream"), "stream: true needs a JSON object body",
                         found=_type_name(body), hint="streaming sets body.stream: true")
        return Request(
            endpoint=raw["endpoint"],
            method=method,
            body=copy.deepcopy(body),
            raw_body=raw.get("raw_body"),
            headers=MappingProxyType(headers),
            stream=bool(raw.get("stream", False)),
            repeat=int(raw.get("repeat", 1)),
            concurrency=int(raw.get("concurrency", 1)),
            timeout=float(raw.get("timeout", self.defaults.get("timeout", DEFAULT_TIMEOUT))),
        )

    def path_expectation(self, kp: tuple[str | int, ...], raw: Mapping[str, Any]) -> PathExpectation | None:
        import jsonpath

        ops = [k for k in raw if k in PATH_OPS]
        if len(ops) != 1:
            self.problem(kp, "a json expectation needs exactly one comparison",
                         expected="path plus one of " + ", ".join(PATH_OPS),
                         found=", ".join(ops) if ops else "none")
            return None
        op = ops[0]
        try:
            jsonpath.compile(raw["path"])
        except jsonpath.JSONPathError as exc:
            self.problem((*kp, "path"), f"invalid JSONPath: {str(exc).splitlines()[0]}", found=raw["path"])
            return None
        value = raw[op]
        if op in ("matches", "full_match"):
            try:
                re.compile(value)
            except re.error as exc:
                self.problem((*kp, op), f"invalid regular expression: {exc}", found=value)
                return None
        if op in ("valid", "parses_as"):
            value = self.named_schema((*kp, op), value)
            if value is None:
                return None
        else:
            self.templates((*kp, op), value)
        return PathExpectation(raw["path"], op, value, bool(raw.get("each", False)), self.doc.location(kp))

    def expectations(self, kp: tuple[str | int, ...], raw: Mapping[str, Any], request: Request,
                     serial: bool) -> Expectations:
        status = raw.get("status", 200)
        statuses = tuple(status) if isinstance(status, list) else (int(status),)
        schema = self.named_schema((*kp, "schema"), raw["schema"]) if "schema" in raw else None
        chunk_schema = self.named_schema((*kp, "chunk_schema"), raw["chunk_schema"]) if "chunk_schema" in raw else None
        if chunk_schema is not None and not request.stream:
            self.problem((*kp, "chunk_schema"), "chunk_schema needs request.stream: true")
        paths = [self.path_expectation((*kp, "json", i), item) for i, item in enumerate(raw.get("json", []))]
        regexes: list[RegexExpectation] = []
        for i, item in enumerate(raw.get("regex", [])):
            rkp = (*kp, "regex", i)
            try:
                re.compile(item["pattern"])
            except re.error as exc:
                self.problem((*rkp, "pattern"), f"invalid regular expression: {exc}", found=item["pattern"])
                continue
            if "path" in item:
                import jsonpath

                try:
                    jsonpath.compile(item["path"])
                except jsonpath.JSONPathError as exc:
                    self.problem((*rkp, "path"), f"invalid JSONPath: {str(exc).splitlines()[0]}")
                    continue
            regexes.append(RegexExpectation(item["pattern"], item.get("path"), bool(item.get("full", False)),
                                            bool(item.get("negate", False)), self.doc.location(rkp)))
        relations: list[Relation] = []
        for i, text in enumerate(raw.get("relations", [])):
            expr = self.expression((*kp, "relations", i), text)
            if expr is not None:
                relations.append(Relation(expr, self.doc.location((*kp, "relations", i))))
        metrics: list[MetricExpectation] = []
        for i, item in enumerate(raw.get("metrics", [])):
            mkp = (*kp, "metrics", i)
            if not serial:
                self.problem(mkp, "metrics expectations need serial: true on the check",
                             hint="counters only grow by a known amount when nothing else runs")
            exprs: dict[str, Expr | None] = {}
            for key in ("delta", "min_delta"):
                if key in item:
                    value = item[key]
                    exprs[key] = self.expression((*mkp, key), str(value)) if not isinstance(value, bool) else None
            if not exprs:
                self.problem(mkp, "a metric expectation needs delta or min_delta")
                continue
            metrics.append(MetricExpectation(item["name"], MappingProxyType(dict(item.get("labels", {}))),
                                             exprs.get("delta"), exprs.get("min_delta"), self.doc.location(mkp)))
        sens = bool(raw.get("stream_equals_non_stream", False))
        if sens and not request.stream:
            self.problem((*kp, "stream_equals_non_stream"), "stream_equals_non_stream needs request.stream: true")
        return Expectations(
            status=statuses,
            schema=schema,
            chunk_schema=chunk_schema,
            paths=tuple(p for p in paths if p is not None),
            regex=tuple(regexes),
            relations=tuple(relations),
            stream_equals_non_stream=sens,
            metrics=tuple(metrics),
            healthy_after=bool(raw.get("healthy_after", False)),
        )

    def check(self, index: int, raw: Mapping[str, Any]) -> Check:
        kp: tuple[str | int, ...] = ("checks", index)
        request = self.request((*kp, "request"), raw["request"])
        serial = bool(raw.get("serial", False))
        expect = self.expectations((*kp, "expect"), raw["expect"], request, serial)
        tags = tuple(raw.get("tags", self.defaults.get("tags", DEFAULT_TAGS)))
        if not tags:
            self.problem((*kp, "tags"), "a check needs at least one tag", expected="e.g. [dummy-ok]")
        return Check(
            id=raw["id"],
            request=request,
            expect=expect,
            tags=tags,
            location=self.doc.location((*kp, "id")),
            description=raw.get("description"),
            serial=serial,
            skip=raw.get("skip"),
            reference=self.request((*kp, "reference"), raw["reference"]) if "reference" in raw else None,
        )

    def setup_step(self, index: int, raw: Mapping[str, Any]) -> SetupStep:
        import jsonpath

        kp: tuple[str | int, ...] = ("setup", index)
        for name, path in raw["bind"].items():
            try:
                jsonpath.compile(path)
            except jsonpath.JSONPathError as exc:
                self.problem((*kp, "bind", name), f"invalid JSONPath: {str(exc).splitlines()[0]}", found=path)
        return SetupStep(raw["id"], self.request((*kp, "request"), raw["request"]),
                         MappingProxyType(dict(raw["bind"])), bool(raw.get("all", False)),
                         self.doc.location((*kp, "id")))


def load_suite(path: Path | str, *, _seen: tuple[Path, ...] = ()) -> Suite:
    """Load and check a suite (and its includes). Raises ConfigError listing every problem."""
    path = Path(path)
    resolved = path.resolve()
    if resolved in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, resolved))
        raise ConfigError("smoke suites include each other in a cycle", location=Location(str(path)), found=chain)
    doc = load_yaml(path, what="smoke suite")
    if not isinstance(doc.data, dict):
        raise ConfigError("a smoke suite must be a mapping", location=doc.location(()),
                          expected="keys version, checks (and name, defaults, vars, setup ...)",
                          found=_type_name(doc.data))
    validate_schema(doc, SCHEMA_NAME, what="smoke suite")
    data = doc.data
    errors = ErrorCollector()
    loader = _SuiteLoader(doc, errors)

    included: list[Suite] = []
    for i, inc in enumerate(data.get("include", [])):
        target = (path.parent / inc)
        if not target.is_file():
            errors.add(doc.problem(("include", i), "included suite does not exist", expected=f"a file at {target}",
                                   hint="include paths are relative to the including suite"))
            continue
        included.append(load_suite(target, _seen=(*_seen, resolved)))
    for sub in included:
        for name, schema in sub.schemas.items():
            loader.schemas.setdefault(name, schema)

    vars_: dict[str, Any] = {}
    for sub in included:
        vars_.update(sub.vars)
    for name, value in data.get("vars", {}).items():
        loader.templates(("vars", name), value)
        vars_[name] = value

    setup: list[SetupStep] = [s for sub in included for s in sub.setup]
    seen_setup = {s.id for s in setup}
    for i, raw in enumerate(data.get("setup", [])):
        step = loader.setup_step(i, raw)
        if step.id in seen_setup:
            continue  # the same setup step from an included suite
        seen_setup.add(step.id)
        setup.append(step)

    checks: list[Check] = [c for sub in included for c in sub.checks]
    first: dict[str, Location] = {c.id: c.location for c in checks}
    for i, raw in enumerate(data.get("checks", [])):
        check = loader.check(i, raw)
        if check.id in first:
            errors.add(doc.problem(("checks", i, "id"), f"duplicate check id {check.id!r}",
                                   found=f"first defined at {first[check.id]}", hint="check ids must be unique"))
            continue
        first[check.id] = check.location
        checks.append(check)
    errors.raise_if_any(f"{path} has problems")
    concurrency = int(data.get("defaults", {}).get("concurrency", 0)) or (
        max((s.concurrency for s in included), default=DEFAULT_CONCURRENCY))
    suite = Suite(
        path=path,
        name=str(data.get("name") or path.stem),
        description=data.get("description"),
        vars=MappingProxyType(vars_),
        setup=tuple(setup),
        checks=tuple(checks),
        concurrency=concurrency,
        schemas=MappingProxyType(dict(loader.schemas)),
    )
    return suite


# =========================================================================== HTTP exchanges


@dataclass
class Exchange:
    """One request and what came back (or why nothing did)."""

    method: str
    url: str
    request_body: Any
    raw_body: str | None
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    text: str = ""
    body: Any = None  # parsed JSON, the assembled stream, or None
    chunks: list[Any] | None = None
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        sent = self.raw_body if self.raw_body is not None else self.request_body
        return {
            "method": self.method,
            "url": self.url,
            "body": _truncate_json(sent),
            "status": self.status,
            "seconds": round(self.seconds, 4),
            "error": self.error,
            "response": _truncate(self.text),
        }


def _truncate(text: str, limit: int = TRUNCATE) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def _truncate_json(value: Any) -> Any:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= TRUNCATE:
        return value
    return _truncate(text)


def parse_sse(text: str) -> tuple[list[Any], bool, list[str]]:
    """Server-sent events -> (JSON payloads, saw [DONE], problems)."""
    chunks: list[Any] = []
    problems: list[str] = []
    done = False
    data_lines: list[str] = []

    def flush() -> None:
        nonlocal done
        if not data_lines:
            return
        payload = "\n".join(data_lines)
        data_lines.clear()
        if payload.strip() == "[DONE]":
            if done:
                problems.append("[DONE] sent twice")
            done = True
            return
        if done:
            problems.append("data after [DONE]")
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            problems.append(f"event data is not JSON: {_short(payload)}")

    for line in text.splitlines():
        if not line.strip():
            flush()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data_lines.append(value[1:] if value.startswith(" ") else value)
    flush()
    return chunks, done, problems


def assemble_stream(chunks: Sequence[Any], done: bool) -> dict[str, Any]:
    """Chat/completion chunks -> one answer shaped like the non-stream one (plus ``chunks``)."""
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    finish_chunks = 0
    first: Mapping[str, Any] = chunks[0] if chunks and isinstance(chunks[0], Mapping) else {}
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            continue
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            slot = choices.setdefault(index, {"index": index, "finish_reason": None, "_chat": False, "_text": None,
                                              "_content": None, "_reasoning": None, "_role": None, "_tools": {}})
            if choice.get("finish_reason") is not None:
                slot["finish_reason"] = choice["finish_reason"]
                finish_chunks += 1
            if "text" in choice:
                slot["_text"] = (slot["_text"] or "") + (choice.get("text") or "")
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                slot["_chat"] = True
                if delta.get("role"):
                    slot["_role"] = delta["role"]
                if delta.get("content"):
                    slot["_content"] = (slot["_content"] or "") + delta["content"]
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if reasoning:
                    slot["_reasoning"] = (slot["_reasoning"] or "") + reasoning
                for call in delta.get("tool_calls") or []:
                    ti = int(call.get("index", 0))
                    tool = slot["_tools"].setdefault(ti, {"id": None, "type": "function",
                                                          "function": {"name": None, "arguments": ""}})
                    if call.get("id"):
                        tool["id"] = call["id"]
                    fn = call.get("function") or {}
                    if fn.get("name"):
                        tool["function"]["name"] = fn["name"]
                    if fn.get("arguments"):
                        tool["function"]["arguments"] += fn["arguments"]
    out_choices: list[dict[str, Any]] = []
    for index in sorted(choices):
        slot = choices[index]
        item: dict[str, Any] = {"index": index, "finish_reason": slot["finish_reason"]}
        if slot["_chat"]:
            message: dict[str, Any] = {"role": slot["_role"], "content": slot["_content"],
                                       "reasoning": slot["_reasoning"]}
            tools = [slot["_tools"][k] for k in sorted(slot["_tools"])]
            message["tool_calls"] = tools
            item["message"] = message
        else:
            item["text"] = slot["_text"] or ""
        out_choices.append(item)
    return {
        "id": first.get("id"),
        "object": first.get("object"),
        "model": first.get("model"),
        "choices": out_choices,
        "usage": usage,
        "chunks": list(chunks),
        "done": done,
        "finish_reason_chunks": finish_chunks,
    }


def comparable_choices(body: Any) -> list[dict[str, Any]]:
    """What stream == non-stream compares: per choice text/content, reasoning, tool calls, finish."""
    out: list[dict[str, Any]] = []
    choices = body.get("choices") if isinstance(body, Mapping) else None
    for choice in choices or []:
        item: dict[str, Any] = {"index": choice.get("index"), "finish_reason": choice.get("finish_reason")}
        message = choice.get("message")
        if isinstance(message, Mapping):
            item["content"] = message.get("content") or ""
            item["reasoning"] = message.get("reasoning") or message.get("reasoning_content") or ""
            item["tool_calls"] = [
                {"name": (t.get("function") or {}).get("name"), "arguments": (t.get("function") or {}).get("arguments")}
                for t in message.get("tool_calls") or []
            ]
        else:
            item["text"] = choice.get("text") or ""
        out.append(item)
    return out


# --------------------------------------------------------------------------- metrics

_METRIC_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (name, labels, value) rows."""
    rows: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = {lm["key"]: lm["value"] for lm in _LABEL.finditer(m["labels"] or "")}
        rows.append((m["name"], labels, value))
    return rows


def metric_value(rows: Sequence[tuple[str, Mapping[str, str], float]], name: str,
                 labels: Mapping[str, str] | None = None) -> float | None:
    """Sum of the series called ``name`` whose labels include ``labels`` (None: no such series)."""
    total: float | None = None
    for row_name, row_labels, value in rows:
        if row_name != name:
            continue
        if labels and any(row_labels.get(k) != v for k, v in labels.items()):
            continue
        total = (total or 0.0) + value
    return total


# =========================================================================== results


PASS, FAIL, SKIP = "passed", "failed", "skipped"


@dataclass
class CheckResult:
    check: Check
    status: str = "pending"
    seconds: float = 0.0
    latency: float | None = None  # median request latency
    failures: list[str] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    message: str = ""

    @property
    def id(self) -> str:
        return self.check.id

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.check.id,
            "status": self.status,
            "tags": list(self.check.tags),
            "serial": self.check.serial,
            "description": self.check.description,
            "location": str(self.check.location),
            "seconds": round(self.seconds, 4),
            "latency_ms": None if self.latency is None else round(self.latency * 1000, 1),
            "message": self.message,
            "failures": list(self.failures),
            "exchanges": [e.to_json() for e in self.exchanges[:4]],
        }


@dataclass
class SmokeReport:
    run_id: str
    suite: Suite
    url: str
    tags: tuple[str, ...]
    results: list[CheckResult]
    started: float
    seconds: float
    run_dir: Path
    target: str | None = None
    profile: str | None = None
    log_tail: list[str] = field(default_factory=list)
    server_problem: str | None = None
    startup_seconds: float | None = None
    json_path: Path | None = None
    junit_path: Path | None = None

    @property
    def passed(self) -> int:
        return sum(1 for r in self.results if r.status == PASS)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.status == FAIL)

    @property
    def skipped(self) -> int:
        return sum(1 for r in self.results if r.status == SKIP)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def summary_line(self) -> str:
        return summary_line(self.passed, self.failed, self.skipped)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite.name,
            "suite_path": str(self.suite.path),
            "url": self.url,
            "target": self.target,
            "profile": self.profile,
            "tags": list(self.tags),
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "startup_seconds": None if self.startup_seconds is None else round(self.startup_seconds, 3),
            "server_problem": self.server_problem,
            "summary": self.summary_line(),
            "checks": [r.to_json() for r in self.results],
            "log_tail": list(self.log_tail),
        }


def summary_line(passed: int, failed: int, skipped: int = 0) -> str:
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    return line


_ACCESS_LOG = re.compile(r'^(?:\(APIServer pid=\d+\) )?INFO:\s+\S+:\d+ - "')


def interesting_lines(lines: Sequence[str], n: int = LOG_TAIL) -> list[str]:
    """The last ``n`` log lines without uvicorn's access lines (they bury the traceback)."""
    return [line for line in lines if not _ACCESS_LOG.match(line)][-n:]


def failure_text(result: CheckResult, log_tail: Sequence[str] = ()) -> str:
    """Request, response and the server's last log lines of a failed check."""
    lines = [f"{result.check.id} ({result.check.location})"]
    if result.check.description:
        lines.append(f"  {result.check.description}")
    lines.extend(f"  - {f}" for f in result.failures)
    shown = [e for e in result.exchanges if e.error or e.status not in result.check.expect.status] or \
        result.exchanges[:1]
    for ex in shown[:2]:
        sent = ex.raw_body if ex.raw_body is not None else ex.request_body
        lines.append(f"  request:  {ex.method} {ex.url}")
        if sent is not None:
            body = sent if isinstance(sent, str) else json.dumps(sent, ensure_ascii=False)
            lines.append("    " + _truncate(body, 800))
        if ex.error:
            lines.append(f"  response: none ({ex.error})")
        else:
            lines.append(f"  response: HTTP {ex.status} after {ex.seconds * 1000:.0f} ms")
            lines.append("    " + _truncate(ex.text.strip(), 1200).replace("\n", "\n    "))
    if log_tail:
        lines.append(f"  server log (last {len(log_tail)} lines):")
        lines.extend("    | " + line for line in log_tail)
    return "\n".join(lines)


def write_reports(report: SmokeReport) -> tuple[Path, Path]:
    """``smoke.json`` and ``smoke-junit.xml`` in the run directory."""
    from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite

    report.run_dir.mkdir(parents=True, exist_ok=True)
    json_path = report.run_dir / "smoke.json"
    json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False, default=str) + "\n")
    suite = TestSuite(report.suite.name)
    suite.timestamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    suite.hostname = report.url
    for result in report.results:
        case = TestCase(result.check.id, classname=f"smoke.{report.suite.name}", time=round(result.seconds, 4))
        if result.status == FAIL:
            failure = Failure(_xml_safe("; ".join(result.failures)[:500]) or "failed")
            failure.text = _xml_safe(failure_text(result, report.log_tail))
            case.result = [failure]
        elif result.status == SKIP:
            case.result = [Skipped(_xml_safe(result.message or "skipped"))]
        case.system_out = _xml_safe(json.dumps([e.to_json() for e in result.exchanges[:2]], ensure_ascii=False))
        suite.add_testcase(case)
    suite.update_statistics()  # type: ignore[no-untyped-call]
    xml = JUnitXml()
    xml.add_testsuite(suite)
    junit_path = report.run_dir / "smoke-junit.xml"
    xml.write(str(junit_path), pretty=True)
    report.json_path, report.junit_path = json_path, junit_path
    return json_path, junit_path


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot carry control characters (random weights produce them)."""
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# =========================================================================== the runner


@dataclass(frozen=True)
class ServerHooks:
    """What the runner may ask about the server besides HTTP (a container, when it owns one)."""

    alive: Callable[[], str | None] | None = None  # None when fine, else why the server is gone
    log_tail: Callable[[int], list[str]] | None = None


class Runner:
    def __init__(self, suite: Suite, url: str, *, tags: Sequence[str], vars: Mapping[str, Any] | None = None,
                 hooks: ServerHooks | None = None, echo: Log = print, concurrency: int | None = None,
                 transport: Any = None) -> None:
        import httpx

        self.suite = suite
        self.url = url.rstrip("/")
        self.tags = tuple(tags)
        self.provided = dict(vars or {})
        self.hooks = hooks or ServerHooks()
        self.echo = echo
        self.concurrency = concurrency or suite.concurrency
        self.http = httpx.Client(base_url=self.url, transport=transport,
                                 limits=httpx.Limits(max_connections=128, max_keepalive_connections=32))
        self.names: dict[str, Any] = {}
        self.setup_problems: list[str] = []
        self.server_down: str | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    # -- HTTP ------------------------------------------------------------------

    def send(self, method: str, endpoint: str, *, body: Any = None, raw_body: str | None = None,
             headers: Mapping[str, str] | None = None, stream: bool = False,
             timeout: float = DEFAULT_TIMEOUT) -> Exchange:
        import httpx

        ex = Exchange(method, self.url + endpoint, body, raw_body)
        hdrs = dict(headers or {})
        kwargs: dict[str, Any] = {"headers": hdrs, "timeout": httpx.Timeout(timeout)}
        if raw_body is not None:
            kwargs["content"] = raw_body.encode()
            hdrs.setdefault("content-type", "application/json")
        elif body is not None:
            kwargs["json"] = body
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            with self.http.stream(method, endpoint, **kwargs) as response:
                parts: list[bytes] = []
                for part in response.iter_bytes():
                    parts.append(part)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("total time exceeded")
                ex.status = response.status_code
                ex.headers = dict(response.headers)
                ex.text = b"".join(parts).decode("utf-8", "replace")
        except httpx.TimeoutException as exc:
            ex.seconds = time.monotonic() - t0
            ex.error = f"timed out after {ex.seconds:.2f}s (the check's timeout is {timeout:g}s; {type(exc).__name__})"
            return ex
        except httpx.HTTPError as exc:
            ex.seconds = time.monotonic() - t0
            ex.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ex
        ex.seconds = time.monotonic() - t0
        content_type = ex.headers.get("content-type", "")
        if stream and ex.status == 200 and "text/event-stream" in content_type:
            chunks, done, problems = parse_sse(ex.text)
            ex.chunks = chunks
            ex.body = assemble_stream(chunks, done)
            if problems:
                ex.body["stream_problems"] = problems
        else:
            try:
                ex.body = json.loads(ex.text) if ex.text.strip() else None
            except ValueError:
                ex.body = None
        return ex

    def render_request(self, request: Request) -> tuple[str, Any]:
        names = self.names
        endpoint = str(render(request.endpoint, names))
        body = render(request.body, names) if request.body is not None else None
        if request.stream and isinstance(body, dict):
            body["stream"] = True
        return endpoint, body

    # -- setup ------------------------------------------------------------------

    def prepare(self) -> None:
        """Setup requests bind variables; suite vars fill in the rest; the runner's vars win.

        Suite vars are rendered as soon as what they refer to is known, so setup requests can
        use plain vars and later vars can use what setup bound.
        """
        import jsonpath

        self.names = {**self.provided}
        pending = {k: v for k, v in self.suite.vars.items() if k not in self.names}
        self._fill(pending)
        for step in self.suite.setup:
            try:
                endpoint, body = self.render_request(step.request)
            except ExprError as exc:
                self.setup_problems.append(f"setup {step.id}: {exc}")
                continue
            ex = self.send(step.request.method, endpoint, body=body, raw_body=step.request.raw_body,
                           headers=step.request.headers, timeout=step.request.timeout)
            if ex.error or ex.status != 200 or ex.body is None:
                why = ex.error or f"HTTP {ex.status}: {_short(ex.text, 200)}"
                self.setup_problems.append(f"setup {step.id} ({step.request.method} {endpoint}) failed: {why}")
                continue
            for name, path in step.bind.items():
                if name in self.provided:
                    continue
                matches = jsonpath.findall(path, ex.body)
                if step.all_matches:
                    self.names[name] = matches
                elif len(matches) == 1:
                    self.names[name] = matches[0]
                else:
                    self.setup_problems.append(f"setup {step.id}: {path} matched {len(matches)} values, "
                                               f"expected exactly 1 (to bind {name})")
            self._fill(pending)
        for name, value in pending.items():
            try:
                render(value, self.names)
            except ExprError as exc:
                self.setup_problems.append(f"variable {name}: {exc}")

    def _fill(self, pending: dict[str, Any]) -> None:
        """Render every pending var whose names are known (repeatedly: vars may use each other)."""
        progressed = True
        while progressed and pending:
            progressed = False
            for name, value in list(pending.items()):
                try:
                    self.names[name] = render(value, self.names)
                except ExprError:
                    continue
                del pending[name]
                progressed = True

    # -- liveness ---------------------------------------------------------------

    def check_server(self) -> str | None:
        """None when the server still answers; else why not (and remember it)."""
        if self.server_down:
            return self.server_down
        reason: str | None = None
        if self.hooks.alive is not None:
            reason = self.hooks.alive()
        if reason is None:
            ex = self.send("GET", "/health", timeout=5)
            if ex.error:
                reason = f"GET /health: {ex.error}"
            elif ex.status != 200:
                reason = f"GET /health -> HTTP {ex.status}"
            if reason and self.hooks.alive is not None:
                time.sleep(0.5)  # a container that just died may still read as running
                reason = self.hooks.alive() or reason
        if reason:
            with self._lock:
                self.server_down = self.server_down or reason
        return reason

    # -- one check ----------------------------------------------------------------

    def run_check(self, check: Check) -> CheckResult:
        result = CheckResult(check)
        t0 = time.monotonic()
        try:
            self._run_check(check, result)
        except Exception as exc:  # a bug in an expectation must not kill the suite
            result.fail(f"internal error while checking: {type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - t0
        if result.status == "pending":
            result.status = FAIL if result.failures else PASS
        if result.status == FAIL and not result.message:
            result.message = result.failures[0] if result.failures else "failed"
        lat = sorted(e.seconds for e in result.exchanges if e.status is not None)
        result.latency = lat[len(lat) // 2] if lat else None
        return result

    def _run_check(self, check: Check, result: CheckResult) -> None:
        if check.skip:
            result.status, result.message = SKIP, check.skip
            return
        if self.server_down:
            result.fail(f"not run: the server is down ({self.server_down})")
            return
        req = check.request
        try:
            endpoint, body = self.render_request(req)
        except ExprError as exc:
            extra = ("; " + "; ".join(self.setup_problems)) if self.setup_problems else ""
            result.fail(f"cannot render the request: {exc}{extra}")
            return
        expect = check.expect
        before: list[tuple[str, dict[str, str], float]] | None = None
        if expect.metrics:
            before = self.scrape_metrics(result)
            if before is None:
                return

        def one(_: int) -> Exchange:
            return self.send(req.method, endpoint, body=body, raw_body=req.raw_body, headers=req.headers,
                             stream=req.stream, timeout=req.timeout)

        if req.repeat == 1:
            exchanges = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=min(req.concurrency, req.repeat)) as pool:
                exchanges = list(pool.map(one, range(req.repeat)))
        result.exchanges = list(exchanges)
        transport = [e for e in exchanges if e.error]
        if transport:
            for e in transport[:3]:
                result.fail(f"{req.method} {endpoint}: {e.error}")
            if len(transport) > 3:
                result.fail(f"... and {len(transport) - 3} more requests failed the same way")
            if any("timed out" not in (e.error or "") for e in transport):
                down = self.check_server()
                if down:
                    result.fail(f"the server is down: {down}")
            return

        non_stream: Exchange | None = None
        if expect.stream_equals_non_stream and isinstance(body, dict):
            plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            non_stream = self.send(req.method, endpoint, body=plain, headers=req.headers, timeout=req.timeout)
            result.exchanges.append(non_stream)
            if non_stream.error or non_stream.status != 200:
                result.fail(f"the non-stream request failed: {non_stream.error or f'HTTP {non_stream.status}'}")
                non_stream = None

        reference: tuple[Any, Any] = (None, None)
        if check.reference is not None:
            try:
                ref_endpoint, ref_body = self.render_request(check.reference)
            except ExprError as exc:
                result.fail(f"cannot render the reference request: {exc}")
                return
            ref = self.send(check.reference.method, ref_endpoint, body=ref_body, raw_body=check.reference.raw_body,
                            headers=check.reference.headers, stream=check.reference.stream,
                            timeout=check.reference.timeout)
            result.exchanges.append(ref)
            if ref.error or ref.status != 200:
                result.fail(f"the reference request {check.reference.method} {ref_endpoint} failed: "
                            f"{ref.error or f'HTTP {ref.status}: {_short(ref.text.strip(), 200)}'}")
                return
            reference = (ref_body, ref.body)

        bodies = [e.body for e in exchanges]
        for i, ex in enumerate(exchanges):
            prefix = f"[{i + 1}/{len(exchanges)}] " if len(exchanges) > 1 else ""
            for message in self.evaluate(check, ex, body, bodies, non_stream, reference):
                result.fail(prefix + message)
            if result.failures and len(exchanges) > 1:
                break

        if any(e.status is not None and e.status >= 500 for e in result.exchanges):
            down = self.check_server()
            if down:
                result.fail(f"the server is down: {down}")
                return
        if before is not None:
            self.check_metrics(check, result, before, body, bodies, exchanges)
        if expect.healthy_after:
            health = self.send("GET", "/health", timeout=10)
            if health.error or health.status != 200:
                result.fail(f"the server is not healthy after the check: {health.error or f'HTTP {health.status}'}")

    def namespace(self, request_body: Any, ex: Exchange, bodies: Sequence[Any],
                  non_stream: Exchange | None, reference: tuple[Any, Any] = (None, None)) -> Mapping[str, Any]:
        special = {
            "request": request_body,
            "response": ex.body,
            "responses": list(bodies),
            "status": ex.status,
            "headers": ex.headers,
            "text": ex.text,
            "chunks": ex.chunks or [],
            "non_stream": non_stream.body if non_stream is not None else None,
            "reference_request": reference[0],
            "reference": reference[1],
            "vars": self.names,
        }
        layers: list[dict[str, Any]] = [special, self.names]
        if isinstance(ex.body, dict):
            layers.append(ex.body)
        return ChainMap(*layers)

    def evaluate(self, check: Check, ex: Exchange, request_body: Any, bodies: Sequence[Any],
                 non_stream: Exchange | None, reference: tuple[Any, Any] = (None, None)) -> list[str]:
        """Every expectation that does not hold for ``ex`` (empty: all hold)."""
        import jsonpath

        expect = check.expect
        out: list[str] = []
        if ex.status not in expect.status:
            want = " or ".join(map(str, expect.status))
            detail = ""
            if isinstance(ex.body, Mapping) and isinstance(ex.body.get("error"), Mapping):
                detail = f": {_short(ex.body['error'].get('message', ''), 200)}"
            elif ex.text:
                detail = f": {_short(ex.text.strip(), 200)}"
            out.append(f"status {ex.status}, expected {want}{detail}")
            return out
        if check.request.stream and ex.status == 200:
            if ex.chunks is None:
                out.append(f"expected a stream (text/event-stream), got {ex.headers.get('content-type')}")
                return out
            problems = ex.body.get("stream_problems") if isinstance(ex.body, Mapping) else None
            if problems:
                out.extend(f"stream: {p}" for p in problems)
        elif ex.body is None and (expect.schema or expect.paths or expect.relations):
            out.append(f"the body is not JSON: {_short(ex.text.strip(), 200)}")
            return out
        if expect.schema is not None:
            out.extend(f"schema: {m}" for m in schema_errors(ex.body, expect.schema))
        if expect.chunk_schema is not None and ex.chunks is not None:
            for i, chunk in enumerate(ex.chunks):
                errors = schema_errors(chunk, expect.chunk_schema)
                if errors:
                    out.append(f"chunk {i}: {errors[0]}")
                    break
        names = self.namespace(request_body, ex, bodies, non_stream, reference)
        for pe in expect.paths:
            message = evaluate_path(pe, ex.body, names, jsonpath.findall)
            if message:
                out.append(message)
        for rx in expect.regex:
            message = evaluate_regex(rx, ex)
            if message:
                out.append(message)
        for rel in expect.relations:
            try:
                value = rel.expr.evaluate(names)
            except ExprError as exc:
                out.append(f"relation `{rel.expr.text}` could not be evaluated: {exc}")
                continue
            if not value:
                out.append(f"relation `{rel.expr.text}` does not hold: {rel.expr.explain(names)}")
        if expect.stream_equals_non_stream and non_stream is not None:
            streamed = comparable_choices(ex.body)
            plain = comparable_choices(non_stream.body)
            if streamed != plain:
                out.append("stream != non-stream: " + describe_difference(streamed, plain))
        return out

    # -- metrics ------------------------------------------------------------------

    def scrape_metrics(self, result: CheckResult) -> list[tuple[str, dict[str, str], float]] | None:
        ex = self.send("GET", "/metrics", timeout=15)
        if ex.error or ex.status != 200:
            result.fail(f"GET /metrics failed: {ex.error or f'HTTP {ex.status}'}")
            return None
        return parse_metrics(ex.text)

    def check_metrics(self, check: Check, result: CheckResult, before: list[tuple[str, dict[str, str], float]],
                      request_body: Any, bodies: Sequence[Any], exchanges: Sequence[Exchange]) -> None:
        names = self.namespace(request_body, exchanges[-1], bodies, None)
        wanted: list[tuple[MetricExpectation, float | None, float | None]] = []
        for me in check.expect.metrics:
            try:
                exact = float(me.delta.evaluate(names)) if me.delta is not None else None
                least = float(me.min_delta.evaluate(names)) if me.min_delta is not None else None
            except (ExprError, TypeError, ValueError) as exc:
                result.fail(f"metric {me.name}: the expected delta could not be computed: {exc}")
                continue
            if metric_value(before, me.name, me.labels) is None:
                result.fail(f"metric {me.name}{_labels(me.labels)} is not in /metrics")
                continue
            wanted.append((me, exact, least))
        deadline = time.monotonic() + METRICS_SETTLE
        while wanted:
            after = self.scrape_metrics(result)
            if after is None:
                return
            misses: list[str] = []
            for me, exact, least in wanted:
                b = metric_value(before, me.name, me.labels) or 0.0
                a = metric_value(after, me.name, me.labels) or 0.0
                delta = a - b
                if exact is not None and not math.isclose(delta, exact, abs_tol=1e-6):
                    misses.append(f"metric {me.name}{_labels(me.labels)} grew by {delta:g}, expected exactly "
                                  f"{exact:g} ({me.delta.text if me.delta else ''}) [{b:g} -> {a:g}]")
                if least is not None and delta < least:
                    misses.append(f"metric {me.name}{_labels(me.labels)} grew by {delta:g}, expected at least "
                                  f"{least:g} [{b:g} -> {a:g}]")
            if not misses:
                return
            if time.monotonic() >= deadline:
                for m in misses:
                    result.fail(m)
                return
            time.sleep(0.25)

    # -- the whole suite --------------------------------------------------------

    def run(self, checks: Sequence[Check], table: LiveTable) -> list[CheckResult]:
        results: dict[str, CheckResult] = {}
        serial = [c for c in checks if c.serial and not c.skip]
        parallel = [c for c in checks if not c.serial or c.skip]
        for check in serial:
            table.running(check)
            result = self.run_check(check)
            results[check.id] = result
            table.done(result)
        pool = ThreadPoolExecutor(max_workers=max(1, self.concurrency), thread_name_prefix="smoke")
        try:
            futures: dict[Future[CheckResult], Check] = {}
            for check in parallel:
                futures[pool.submit(self._run_tracked, check, table)] = check
            for future in _as_completed(futures):
                result = future.result()
                results[result.check.id] = result
                table.done(result)
        except BaseException:
            # Ctrl-C: do not wait for checks in flight (the caller removes the server, which ends them)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [results[c.id] for c in checks]

    def _run_tracked(self, check: Check, table: LiveTable) -> CheckResult:
        table.running(check)
        return self.run_check(check)


def _as_completed(futures: Mapping[Future[CheckResult], Check]) -> Iterator[Future[CheckResult]]:
    from concurrent.futures import as_completed

    yield from as_completed(futures)


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def schema_errors(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(dict(schema))
    out: list[str] = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))[:5]:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        out.append(f"{where}: {_short(error.message, 200)}")
    return out


def _type_ok(value: Any, name: str) -> bool:
    actual = _type_name(value)
    if name == "number":
        return actual in ("number", "integer")
    return actual == name


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
            f" (found {_short(matches[0])})" if matches else "")
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


def compare(op: str, value: Any, want: Any) -> str | None:
    """None when ``value <op> want`` holds, else why not."""
    shown = _short(value)
    try:
        if op == "equals":
            return None if value == want else f"{shown} != {_short(want)}"
        if op == "not_equals":
            return None if value != want else f"is {shown}"
        if op == "one_of":
            return None if value in want else f"{shown} is not one of {_short(want)}"
        if op in ("contains", "not_contains"):
            if isinstance(value, str | list | tuple | Mapping):
                inside = want in value
            else:
                return f"{shown} is {_type_name(value)}: cannot look inside"
            if op == "contains":
                return None if inside else f"{shown} does not contain {_short(want)}"
            return None if not inside else f"{shown} contains {_short(want)}"
        if op in ("matches", "full_match"):
            if not isinstance(value, str):
                return f"{shown} is {_type_name(value)}, not a string"
            hit = re.search(want, value) if op == "matches" else re.fullmatch(want, value)
            return None if hit else f"{shown} does not {'match' if op == 'matches' else 'fully match'} /{want}/"
        if op in ("gt", "ge", "lt", "le"):
            ok = {"gt": value > want, "ge": value >= want, "lt": value < want, "le": value <= want}[op]
            sign = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[op]
            return None if ok else f"{shown} {sign} {_short(want)} is false"
        if op == "type":
            return None if _type_ok(value, want) else f"{shown} is {_type_name(value)}, expected {want}"
        if op in ("length", "min_length"):
            if not isinstance(value, str | list | tuple | Mapping):
                return f"{shown} is {_type_name(value)}: has no length"
            n = len(value)
            if op == "length":
                return None if n == want else f"length {n}, expected {want}"
            return None if n >= want else f"length {n}, expected at least {want}"
        if op == "valid":
            errors = schema_errors(value, want)
            return None if not errors else "does not validate: " + "; ".join(errors)
        if op == "parses_as":
            if not isinstance(value, str):
                return f"{shown} is {_type_name(value)}, not a JSON string"
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                return f"{shown} is not valid JSON ({exc})"
            errors = schema_errors(parsed, want)
            return None if not errors else f"{shown} parses but does not validate: " + "; ".join(errors)
    except TypeError as exc:
        return f"cannot compare {shown} with {_short(want)}: {exc}"
    raise ValueError(f"unknown comparison {op}")  # pragma: no cover - the loader refuses it


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
            return f"{where}: {_short(text)} is {_type_name(text)}, not a string (for /{rx.pattern}/)"
        hit = re.fullmatch(rx.pattern, text, re.S) if rx.full else re.search(rx.pattern, text)
        if rx.negate and hit:
            return f"{where}: /{rx.pattern}/ found in {_short(text)}"
        if not rx.negate and not hit:
            return f"{where}: {_short(text)} does not {'fully ' if rx.full else ''}match /{rx.pattern}/"
    return None


def describe_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    if len(a) != len(b):
        return f"{len(a)} choices streamed, {len(b)} without streaming"
    for x, y in zip(a, b, strict=True):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"choice {x.get('index')} {key}: streamed {_short(x.get(key))}, plain {_short(y.get(key))}"
    return "differs"  # pragma: no cover


# --------------------------------------------------------------------------- the live table


class LiveTable:
    """Rich live table on a terminal; one line per finished check otherwise. Thread-safe."""

    def __init__(self, checks: Sequence[Check], *, echo: Log, console: Any = None, live: bool | None = None) -> None:
        from rich.console import Console

        self.checks = list(checks)
        self.echo = echo
        self.console = console or Console(stderr=False)
        self.live_mode = self.console.is_terminal if live is None else live
        self.state: dict[str, tuple[str, float | None]] = {c.id: ("waiting", None) for c in checks}
        self._lock = threading.Lock()
        self._live: Any = None
        self._width = max((len(c.id) for c in checks), default=10)

    def __enter__(self) -> LiveTable:
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            tall = len(self.checks) + 6 > self.console.height
            self._live.update(self.render(full=not tall))
            self._live.__exit__(None, None, None)
            self._live = None
            if tall:  # the live view showed a window; print every row once
                self.console.print(self.render(full=True))

    def render(self, full: bool = False) -> Any:
        """The table; unless ``full``, cut to what fits: checks in flight, failures, the latest results."""
        from rich.table import Table

        styles = {PASS: "green", FAIL: "bold red", SKIP: "yellow", "running": "cyan", "waiting": "dim"}
        rows = list(self.checks)
        room = max(5, self.console.height - 7)
        caption = None
        if not full and len(rows) > room:
            counts: dict[str, int] = {}
            for status, _ in self.state.values():
                counts[status] = counts.get(status, 0) + 1
            caption = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            important = [c for c in rows if self.state[c.id][0] in ("running", FAIL)]
            finished = [c for c in rows if self.state[c.id][0] in (PASS, SKIP)]
            waiting = [c for c in rows if self.state[c.id][0] == "waiting"]
            rows = (important + finished[-max(0, room - len(important)):] + waiting)[:room]
            rows.sort(key=self.checks.index)
        table = Table(title="smoke", caption=caption, expand=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("latency", justify="right")
        for check in rows:
            status, latency = self.state[check.id]
            lat = "" if latency is None else f"{latency * 1000:.0f} ms"
            table.add_row(check.id, f"[{styles.get(status, '')}]{status}[/]", lat)
        return table

    def running(self, check: Check) -> None:
        with self._lock:
            self.state[check.id] = ("running", None)
            if self._live is not None:
                self._live.update(self.render())

    def done(self, result: CheckResult) -> None:
        with self._lock:
            self.state[result.check.id] = (result.status, result.latency)
            if self._live is not None:
                self._live.update(self.render())
            else:
                lat = "" if result.latency is None else f"{result.latency * 1000:7.0f} ms"
                word = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP"}.get(result.status, result.status)
                line = f"  {word:<4}  {result.check.id:<{self._width}}  {lat}"
                if result.status == FAIL and result.failures:
                    line += f"  {_short(result.failures[0], 140)}"
                elif result.status == SKIP:
                    line += f"  ({result.message})"
                self.echo(line)


# =========================================================================== entry points


def run_suite(
    suite: Suite,
    url: str,
    *,
    tags: Sequence[str] = DEFAULT_TAGS,
    run_id: str | None = None,
    run_dir: Path,
    vars: Mapping[str, Any] | None = None,
    hooks: ServerHooks | None = None,
    echo: Log = print,
    console: Any = None,
    live: bool | None = None,
    target: str | None = None,
    profile: str | None = None,
    startup_seconds: float | None = None,
    transport: Any = None,
) -> SmokeReport:
    """Run the checks of ``suite`` selected by ``tags`` against ``url``; write the reports.

    ``transport`` (an httpx transport) replaces the network, for tests.

    Returns the report (``report.ok`` says whether everything passed); raises SmokeError only
    when no server answers at all.
    """
    from .build import new_run_id

    run_id = run_id or new_run_id()
    t0 = time.monotonic()
    checks = suite.select(tags)
    hooks = hooks or ServerHooks()
    runner = Runner(suite, url, tags=tags, vars=vars, hooks=hooks, echo=echo, transport=transport)
    try:
        first = runner.send("GET", "/health", timeout=10)
        if first.error is not None and "Connect" in first.error:
            raise SmokeError(
                f"no server answers at {url}",
                found=first.error,
                hint="start one with `invoke run --target T` (it prints URL=...), or let `invoke smoke --target T` "
                "start and stop one",
            )
        runner.prepare()
        echo(f"smoke {suite.name} ({suite.path}): {len(checks)} checks tagged {', '.join(tags) or 'any'} "
             f"against {url}  run {run_id}")
        for problem in runner.setup_problems:
            echo(f"  warning: {problem}")
        with LiveTable(checks, echo=echo, console=console, live=live) as table:
            results = runner.run(checks, table)
    finally:
        runner.close()
    seconds = time.monotonic() - t0
    report = SmokeReport(run_id=run_id, suite=suite, url=url, tags=tuple(tags), results=results, started=t0,
                         seconds=seconds, run_dir=run_dir, target=target, profile=profile,
                         server_problem=runner.server_down, startup_seconds=startup_seconds)
    if not report.ok and hooks.log_tail is not None:
        with contextlib.suppress(Exception):
            report.log_tail = hooks.log_tail(LOG_TAIL)
    write_reports(report)
    print_failures(report, echo)
    echo(report.summary_line())
    echo(f"report: {report.json_path}  junit: {report.junit_path}  ({seconds:.1f}s)")
    return report


def print_failures(report: SmokeReport, echo: Log) -> None:
    failed = [r for r in report.results if r.status == FAIL]
    if not failed:
        return
    echo("")
    echo(f"failures ({len(failed)}):")
    for result in failed:
        echo(failure_text(result))
        echo("")
    if report.server_problem:
        echo(f"the server went away during the suite: {report.server_problem}")
    if report.log_tail:
        echo(f"server log (last {len(report.log_tail)} lines):")
        for line in report.log_tail:
            echo("  | " + line)
        echo("")


def verdict(report: SmokeReport) -> None:
    """Raise SmokeError (exit 4) when any check failed."""
    if report.ok:
        return
    names = ", ".join(r.check.id for r in report.results if r.status == FAIL)
    raise SmokeError(
        f"{report.failed} of {len(report.results)} smoke checks failed: {_short(names, 300)}",
        found=report.server_problem,
        hint=f"the request, response and server log of each failure are above and in {report.json_path}",
    )


def parse_tags(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else [t for part in text for t in part.split(",")]
    tags = tuple(t.strip() for t in items if t.strip())
    return tags or None


def target_vars(resolved: Any) -> dict[str, Any]:
    """Variables the manifest knows for a target: served_model_name, max_model_len."""
    args = resolved.serving_args()
    out: dict[str, Any] = {}
    name = args.get("served-model-name") or args.get("model")
    if isinstance(name, list):
        name = name[0] if name else None
    if name:
        out["served_model_name"] = str(name)
    if isinstance(args.get("max-model-len"), int):
        out["max_model_len"] = int(args["max-model-len"])
    return out


def suite_for(resolved: Any, explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    suite: Path | None = resolved.target.smoke.suite
    if suite is None:
        raise ConfigError(
            f"target {resolved.target.name!r} names no smoke suite",
            key_path=f"targets.{resolved.target.name}.smoke.suite",
            hint="add smoke.suite to the target in the manifest, or pass --suite smoke/<file>.yaml",
        )
    return suite


def smoke_url(url: str, *, suite_path: Path, tags: Sequence[str], run_root: Path, echo: Log = print,
              vars: Mapping[str, Any] | None = None, wait: float = 0.0) -> SmokeReport:
    """``invoke smoke --url``: a server somebody else started."""
    from .build import new_run_id

    check_url(url)
    suite = load_suite(suite_path)
    if wait > 0:
        _wait_for_url(url, wait, echo)
    run_id = new_run_id()
    return run_suite(suite, url, tags=tags, run_id=run_id, run_dir=run_root / ".imageforge" / "runs" / run_id,
                     vars=vars, echo=echo)


def check_url(url: str) -> None:
    """An http(s) URL with a host, or ConfigError (exit 2)."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise ConfigError(f"not a URL: {url!r}", expected="http://HOST:PORT", found=str(exc)) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"not an http URL: {url!r}", expected="http://127.0.0.1:8000")


def _wait_for_url(url: str, timeout: float, echo: Log) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url.rstrip("/") + "/health", timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            echo(f"{url}/health did not answer 200 within {timeout:.0f}s; running the suite anyway")
            return
        time.sleep(1)


def smoke_target(resolved: Any, *, environ: Mapping[str, str] | None = None, suite_path: Path | None = None,
                 tags: Sequence[str] | None = None, echo: Log = print, base: bool = False,
                 build_image: bool = True, port: int | None = None, live: bool | None = None,
                 startup_timeout: float | None = None) -> SmokeReport:
    """``invoke smoke --target T --profile P``: build if needed, serve, run the suite, always remove."""
    from .build import new_run_id
    from .run import serving

    environ = os.environ if environ is None else environ
    suite = load_suite(suite_for(resolved, str(suite_path) if suite_path else None))
    selected_tags = tuple(tags) if tags else (tuple(resolved.target.smoke.tags) or DEFAULT_TAGS)
    run_id = new_run_id()
    with serving(resolved, environ=environ, base=base, port=port, build_image=build_image, run_id=run_id,
                 startup_timeout=startup_timeout, log=echo) as server:

        def alive() -> str | None:
            return None if server.running() else f"container {server.name}: {server.describe_state()}"

        hooks = ServerHooks(alive=alive, log_tail=lambda n: interesting_lines(server.logs(n * 20), n))
        return run_suite(suite, server.url, tags=selected_tags, run_id=run_id, run_dir=server.run_dir,
                         vars=target_vars(resolved), hooks=hooks, echo=echo, live=live,
                         target=resolved.target.name, profile=server.profile,
                         startup_seconds=server.startup_seconds)


def smoke_for_cli(manifest: str | None, target: str | None, profile: str | None, sets: Sequence[str], *,
                  url: str | None, suite: str | None, tags: str | None, base: bool, port: int | None,
                  wait: float, echo: Log = print) -> SmokeReport:
    from .manifest import load_manifest, manifest_path
    from .resolve import resolve

    tag_list = parse_tags(tags)
    if url:
        if base or profile:
            raise ConfigError("--url tests a running server: --profile and --base do not apply",
                              hint="drop --url to build, start and stop the target's server")
        resolved = None
        if target or not suite:
            m = load_manifest(manifest_path(manifest))
            resolved = resolve(m, target, None, environ=os.environ, sets=sets)
        suite_path = suite_for(resolved, suite) if resolved is not None else Path(suite or "")
        root = resolved.manifest.root if resolved is not None else Path.cwd()
        chosen = tag_list or (tuple(resolved.target.smoke.tags) if resolved is not None else ()) or DEFAULT_TAGS
        report = smoke_url(url, suite_path=suite_path, tags=chosen, run_root=root, echo=echo,
                           vars=target_vars(resolved) if resolved is not None and target else None, wait=wait)
    else:
        m = load_manifest(manifest_path(manifest))
        resolved = resolve(m, target, profile, environ=os.environ, sets=sets)
        report = smoke_target(resolved, suite_path=Path(suite) if suite else None, tags=tag_list, echo=echo,
                              base=base, port=port)
    verdict(report)
    return report


__all__ = [
    "Check",
    "Expr",
    "ExprError",
    "Runner",
    "ServerHooks",
    "SmokeReport",
    "Suite",
    "assemble_stream",
    "load_suite",
    "parse_metrics",
    "parse_sse",
    "render",
    "run_suite",
    "smoke_for_cli",
    "smoke_target",
    "smoke_url",
    "verdict",
    "write_reports",
]


def demo_for_cli(manifest: str | None, *, target: str = "cpu", echo: Log = print) -> SmokeReport:
    """``invoke demo``: Docker engine, base image, build and smoke of the cpu target, from nothing."""
    from .docker_engine import ensure_daemon
    from .manifest import load_manifest, manifest_path
    from .resolve import resolve

    t0 = time.monotonic()
    m = load_manifest(manifest_path(manifest))
    resolved = resolve(m, target, None, environ=os.environ)
    echo(f"demo: {target}:{resolved.profile_name} -- Docker engine, base image, build, serve, smoke")
    ensure_daemon(log=echo)
    report = smoke_target(resolved, echo=echo)  # the build makes the base image (and model) first
    echo(f"demo: {report.summary_line()} in {time.monotonic() - t0:.0f}s")
    verdict(report)
    return report
