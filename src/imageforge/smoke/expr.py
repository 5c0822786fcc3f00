"""The smoke suites' expression language and ``${...}`` templates.

Expressions (relations, metric deltas, ``${...}`` templates) are a small, safe subset of Python: literals,
names, ``a.b`` field access on mappings, ``a[i]``, arithmetic, comparisons, ``and``/``or``/``not``,
``x if c else y``, comprehensions and the functions in :data:`FUNCTIONS` (``len``, ``sum``, ``min``,
``max``, ``json``, ``valid``, ``fullmatch`` ...).  :meth:`Expr.parse` refuses everything else at load time.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from ..manifest.yaml_messages import type_name
from ..serve.openai_wire import short

MAX_SEQUENCE = 1_000_000  # longest list/string an expression may build


def json_type(value: Any) -> str:
    """A value's JSON type name (``string``, ``integer``, ``object`` ...) for messages."""
    return type_name(value, json_terms=True)


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
        raise ExprError(f"json(): not valid JSON ({exc}): {short(text)}") from None


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


# --------------------------------------------------------------------------- a chat message's reasoning and answer
# Servers and routers carry a model's thinking differently: a message field (`reasoning_content` in vLLM 0.6,
# `reasoning` in newer vLLM and routers, `thinking`, a `reasoning_details` list of parts), or, with no reasoning
# parser, a leading <think>...</think> block left in `content` (unclosed when generation stopped inside it).
# The evaluator judges the visible answer and any of these transports alike; these functions do the same.

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
_LEADING_THINK = re.compile(r"\s*<(think|thinking)>(?P<inner>.*?)(?:</(?:think|thinking)>|\Z)",
                            re.DOTALL | re.IGNORECASE)


def as_text(value: Any) -> str:
    """A message field as text: a string, null, a list of typed parts, or a part mapping."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(as_text(part.get("text") if isinstance(part, Mapping) else part) for part in value)
    if isinstance(value, Mapping):
        return as_text(value.get("text") or value.get("content"))
    return str(value)


def _message(obj: Any) -> Mapping[str, Any]:
    """A chat message: the mapping itself, or a response's first choice's message."""
    if isinstance(obj, Mapping) and isinstance(obj.get("choices"), list):
        choices = obj["choices"]
        first = choices[0] if choices and isinstance(choices[0], Mapping) else {}
        obj = first.get("message") or {}
    return obj if isinstance(obj, Mapping) else {}


def reasoning_field(obj: Any) -> str:
    """The reasoning a parser put in a field of the message (inline <think> text is not counted)."""
    message = _message(obj)
    for name in REASONING_FIELDS:
        text = as_text(message.get(name))
        if text:
            return text
    details = message.get("reasoning_details")
    if isinstance(details, list):
        return "".join(as_text(d.get("text") or d.get("summary")) for d in details if isinstance(d, Mapping))
    return ""


def _split_leading_think(content: str) -> tuple[str, str]:
    match = _LEADING_THINK.match(content)
    if match is None:
        return "", content
    return match.group("inner"), content[match.end():]


def inline_reasoning(obj: Any) -> str:
    """The leading <think> block left in the content by a deployment without a reasoning parser."""
    return _split_leading_think(as_text(_message(obj).get("content")))[0]


def reasoning(obj: Any) -> str:
    """The reasoning by any transport: a message field, else the content's leading <think> block."""
    return reasoning_field(obj) or inline_reasoning(obj)


def visible(obj: Any) -> str:
    """The answer a user sees: the content without a leading <think> block."""
    return _split_leading_think(as_text(_message(obj).get("content")))[1]


def _occurrences(text: Any, part: Any) -> int:
    if not isinstance(text, str) or not isinstance(part, str) or not part:
        raise ExprError("occurrences(text, part) needs two strings, part not empty")
    return text.count(part)


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
    "occurrences": _occurrences,
    "strip": lambda text: as_text(text).strip(),
    "lower": lambda text: as_text(text).lower(),
    "reasoning": reasoning,
    "reasoning_field": reasoning_field,
    "inline_reasoning": inline_reasoning,
    "visible": visible,
})

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.Compare, ast.Call, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Attribute, ast.Subscript,
    ast.Slice, ast.List, ast.Tuple, ast.Dict, ast.ListComp, ast.GeneratorExp, ast.DictComp,
    ast.comprehension, ast.IfExp, *_BINOPS, *_CMPOPS,
)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


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
            return f"{short(left)} {_CMP_TEXT[type(body.ops[0])]} {short(right)} is false"
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
            raise ExprError(f"{ast.unparse(node.value)} is {json_type(value)}, not a mapping: "
                            f"cannot read .{node.attr}")
        if isinstance(node, ast.Subscript):
            value = self.eval(node.value)
            index = self._slice(node.slice)
            try:
                return value[index]
            except (KeyError, IndexError, TypeError) as exc:
                raise ExprError(f"{ast.unparse(node)}: {type(exc).__name__} {exc} "
                                f"(on {json_type(value)} {short(value, 60)})") from None
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
                    raise ExprError(f"{ast.unparse(node)}: cannot compare {short(left, 40)} "
                                    f"{_CMP_TEXT[type(op)]} {short(right, 40)} ({exc})") from None
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
            raise ExprError(f"cannot iterate over {json_type(iterable)} in {ast.unparse(gen)}")
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

