"""Smoke suites as data: the model (a suite of checks: request + expectations) and its loader.

A suite is a YAML file (``schema/smoke.schema.json``, strict; errors name file:line like the manifest's).
:func:`load_suite` reads it with its includes and checks everything that can be checked before a request
is sent: JSONPath and regular expressions compile, expressions and templates parse, named schemas exist.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonpath

from ..errors import ConfigError, ErrorCollector, Location
from ..manifest.yaml_messages import did_you_mean, format_key_path
from ..manifest.yaml_schema import validate_schema
from ..manifest.yamldoc import YamlDocument, load_yaml
from ..serve.openai_wire import short
from .expr import Expr, ExprError, check_templates, json_type, parse_expr
from .operators import PATH_OPS

SCHEMA_NAME = "smoke.schema.json"
DEFAULT_TIMEOUT = 60.0
DEFAULT_CONCURRENCY = 4
DEFAULT_TAGS = ("dummy-ok",)


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
    timeout: float | str = DEFAULT_TIMEOUT  # seconds, or one ${...} template (e.g. a suite parameter)
    merge: Any = None  # a mapping (template) merged into the rendered body
    delay: float = 0.0  # seconds to wait before sending


@dataclass(frozen=True)
class PathExpectation:
    path: str
    op: str
    value: Any
    each: bool
    location: Location

    def describe(self) -> str:
        return f"{self.path} {self.op} {short(self.value, 80)}" + (" (each)" if self.each else "")


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
class SkipRule:
    """Report the check as skipped (``why``) when ``when`` holds: before the request (variables only) or
    after the answer (the check's names)."""

    when: Expr
    why: str
    before: bool
    location: Location


@dataclass(frozen=True)
class Param:
    """A suite parameter: a named value with a default that ``smoke --param NAME=VALUE`` changes."""

    name: str
    default: Any
    description: str
    schema: Mapping[str, Any] | None
    location: Location

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (None: it is)."""
        if self.schema is None:
            return None
        from jsonschema import Draft202012Validator

        errors = sorted(Draft202012Validator(self.schema).iter_errors(value), key=str)
        return errors[0].message if errors else None


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
    skip_if: tuple[SkipRule, ...] = ()

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
    optional: bool = False


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
    params: Mapping[str, Param] = field(default_factory=lambda: MappingProxyType({}))
    tag_notes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def select(self, tags: Iterable[str]) -> tuple[Check, ...]:
        tags = tuple(tags)
        return tuple(c for c in self.checks if c.selected(tags))

    def not_selected_reason(self, check: Check, tags: Sequence[str]) -> str:
        """Why a run selecting ``tags`` leaves ``check`` out: its tags, and what they mean where the suite says."""
        notes = "; ".join(f"{t}: {self.tag_notes[t]}" for t in check.tags if t in self.tag_notes)
        return (f"not selected: tagged {', '.join(check.tags)}, the run selected {', '.join(tags) or 'any'}"
                + (f" ({notes})" if notes else ""))

    def resolve_params(self, given: Mapping[str, str] | Sequence[str] | None = None) -> dict[str, Any]:
        """Every parameter's value: its default, or ``given`` (``NAME=VALUE`` texts, or a mapping of texts or
        values). A text value is read as YAML (``4096`` is a number, ``on`` stays text). Raises ConfigError
        (exit 2) for an unknown name or a value its schema refuses, naming the parameters there are."""
        import yaml

        values = {name: p.default for name, p in self.params.items()}
        pairs: list[tuple[str, Any]] = []
        if isinstance(given, Mapping):
            pairs = list(given.items())
        else:
            for item in given or ():
                name, sep, text = item.partition("=")
                if not sep or not name.strip():
                    raise ConfigError(f"--param {item!r} is not NAME=VALUE", expected="NAME=VALUE, e.g. "
                                      "max_context_tokens=2048", hint=self._params_hint())
                pairs.append((name.strip(), text))
        for name, raw in pairs:
            if name not in self.params:
                raise ConfigError(f"suite {self.name!r} has no parameter {name!r}", location=Location(str(self.path)),
                                  expected=self._params_hint(), hint=did_you_mean(name, self.params))
            param = self.params[name]
            value = raw
            if isinstance(raw, str):
                try:
                    loaded = yaml.safe_load(raw) if raw.strip() else raw
                except yaml.YAMLError:
                    loaded = raw
                # the YAML reading unless only the text fits (`on` is a word to a string parameter)
                value = raw if param.problem(loaded) is not None and param.problem(raw) is None else loaded
            problem = param.problem(value)
            if problem is not None:
                raise ConfigError(f"--param {name}={raw}: {problem}", location=param.location,
                                  expected=param.description)
            values[name] = value
        return values

    def _params_hint(self) -> str:
        if not self.params:
            return "this suite has no parameters"
        return "parameters: " + ", ".join(f"{n} (default {p.default!r})" for n, p in self.params.items())


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

    def timeout(self, kp: tuple[str | int, ...], value: Any) -> float | str:
        """A request's timeout: seconds, or a ``${...}`` template the runner renders (a number > 0 when it runs)."""
        if isinstance(value, str):
            self.templates((*kp, "timeout"), value)
            return value
        return float(value)

    def request(self, kp: tuple[str | int, ...], raw: Mapping[str, Any]) -> Request:
        body = raw.get("body")
        self.templates((*kp, "body"), body)
        self.templates((*kp, "merge"), raw.get("merge"))
        if "merge" in raw and not isinstance(body, Mapping):
            self.problem((*kp, "merge"), "merge needs a JSON object body", found=json_type(body))
        self.templates((*kp, "endpoint"), raw["endpoint"])
        headers = {**self.defaults.get("headers", {}), **raw.get("headers", {})}
        method = raw.get("method") or ("POST" if "body" in raw or "raw_body" in raw else "GET")
        if "body" in raw and "raw_body" in raw:
            self.problem((*kp, "raw_body"), "a request has either body or raw_body, not both",
                         hint="raw_body sends text as is (e.g. malformed JSON); body sends JSON")
        if raw.get("stream") and not isinstance(body, Mapping):
            self.problem((*kp, "stream"), "stream: true needs a JSON object body",
                         found=json_type(body), hint="streaming sets body.stream: true")
        return Request(
            endpoint=raw["endpoint"],
            method=method,
            body=copy.deepcopy(body),
            raw_body=raw.get("raw_body"),
            headers=MappingProxyType(headers),
            stream=bool(raw.get("stream", False)),
            repeat=int(raw.get("repeat", 1)),
            concurrency=int(raw.get("concurrency", 1)),
            timeout=self.timeout(kp, raw.get("timeout", self.defaults.get("timeout", DEFAULT_TIMEOUT))),
            merge=copy.deepcopy(raw.get("merge")),
            delay=float(raw.get("delay", 0.0)),
        )

    def path_expectation(self, kp: tuple[str | int, ...], raw: Mapping[str, Any]) -> PathExpectation | None:
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
            skip_if=self.skip_rules((*kp, "skip_if"), raw.get("skip_if", [])),
        )

    def skip_rules(self, kp: tuple[str | int, ...], raw: Sequence[Mapping[str, Any]]) -> tuple[SkipRule, ...]:
        rules: list[SkipRule] = []
        for i, item in enumerate(raw):
            expr = self.expression((*kp, i, "when"), item["when"])
            self.templates((*kp, i, "why"), item["why"])
            if expr is not None:
                rules.append(SkipRule(expr, item["why"], bool(item.get("before", False)), self.doc.location((*kp, i))))
        return tuple(rules)

    def params(self, raw: Mapping[str, Any]) -> dict[str, Param]:
        out: dict[str, Param] = {}
        for name, item in raw.items():
            kp: tuple[str | int, ...] = ("params", name)
            schema = self.named_schema((*kp, "schema"), item["schema"]) if "schema" in item else None
            param = Param(name, item["default"], item["description"], schema, self.doc.location(kp))
            problem = param.problem(param.default)
            if problem is not None:
                self.problem((*kp, "default"), f"the default does not satisfy the parameter's schema: {problem}")
            out[name] = param
        return out

    def setup_step(self, index: int, raw: Mapping[str, Any]) -> SetupStep:
        kp: tuple[str | int, ...] = ("setup", index)
        for name, path in raw["bind"].items():
            try:
                jsonpath.compile(path)
            except jsonpath.JSONPathError as exc:
                self.problem((*kp, "bind", name), f"invalid JSONPath: {str(exc).splitlines()[0]}", found=path)
        return SetupStep(raw["id"], self.request((*kp, "request"), raw["request"]),
                         MappingProxyType(dict(raw["bind"])), bool(raw.get("all", False)),
                         self.doc.location((*kp, "id")), optional=bool(raw.get("optional", False)))


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
                          found=json_type(doc.data))
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
    params: dict[str, Param] = {}
    tag_notes: dict[str, str] = {}
    for sub in included:
        vars_.update(sub.vars)
        params.update(sub.params)
        tag_notes.update(sub.tag_notes)
    params.update(loader.params(data.get("params", {})))
    tag_notes.update(data.get("tags", {}))
    for name, rel in data.get("files", {}).items():
        file = path.parent / rel
        if not file.is_file():
            errors.add(doc.problem(("files", name), "file does not exist", expected=f"a file at {file}",
                                   hint="files paths are relative to the suite"))
            continue
        vars_[name] = base64.b64encode(file.read_bytes()).decode("ascii")
    for name, value in data.get("vars", {}).items():
        loader.templates(("vars", name), value)
        if name in params:
            errors.add(doc.problem(("vars", name), f"{name!r} is a parameter of the suite and a variable",
                                   hint="a parameter is set with --param; rename the variable"))
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
        params=MappingProxyType(params),
        tag_notes=MappingProxyType(tag_notes),
    )
    return suite

