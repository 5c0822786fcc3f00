"""Serving flags: what the target's own vLLM accepts, and the manifest's serving args checked against it.

Over 600 lines: one flag model, its two readers (static ast, in-image introspection) and its checker belong together.

Two ways to learn the flags, both ending in a :class:`FlagTable` of frozen :class:`FlagSpec`:

* **static** -- :func:`read_static` parses the source text of the files that build vLLM's parser
  (``STATIC_FILES``: ``vllm/engine/arg_utils.py`` and ``vllm/entrypoints/openai/cli_args.py`` in
  vLLM 0.6.3, where flags are plain ``parser.add_argument("--max-num-seqs", type=int, ...)`` calls)
  with :mod:`ast`; nothing is imported or run. For images whose vLLM needs the device to import
  (the vendor image on a machine without the card). Read the files *after* the steps that change the
  parser (bi100's baseline replaces ``cli_args.py`` and adds ``--reasoning-parser``).
* **introspection** -- :func:`introspection_source` is the Python program to run inside the image
  (``[*INTROSPECT_COMMAND, introspection_source()]``, network off) where vLLM imports without a device
  (cpu): it builds vLLM's own parser (0.32: ``make_arg_parser`` + ``FlexibleArgumentParser``), unwraps
  closure types (``_optional_type``), reads ``BooleanOptionalAction`` and the pydantic field metadata
  (``Gt(0)``, ``Le(1)``) of the config classes, and prints one JSON line; :func:`parse_introspection`
  turns that output into a FlagTable.

Checking is pure: :func:`check_serving_args` takes serving args with their manifest positions
(:class:`ServingArg`; see :func:`serving_args_of_resolved` / :func:`serving_args_of_target`) and a
table, and returns :class:`~imageforge.errors.Problem` s (unknown flag + "did you mean", underscores ->
"use dashes", types, choices, ranges, ``--no-FLAG`` that does not exist, ``port`` vs ``run.port``,
``served-model-name`` vs the model the smoke suite calls: :func:`suite_models`). The reasons given are
imageforge's (one spelling per flag, typed values), not "vLLM rejects this": vLLM's own parser
accepts underscores and numeric strings.

Wiring (a later task; nothing here touches Docker or a cache)::

    table = read_static({path: text, ...}) or parse_introspection(container_output)
    problems = check_serving_args(serving_args_of_target(manifest, "cpu"), table,
                                  run_port=run_port_of(manifest, "cpu"), suite=suite_models(suite_doc))
    ErrorCollector(problems).raise_if_any("serving flags do not match the image's vLLM")
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from .errors import ConfigError, Location, Problem
from .inimage import program
from .yaml_messages import did_you_mean, format_key_path, type_name
from .yamldoc import YamlDocument

if TYPE_CHECKING:
    from .manifest import Manifest
    from .resolve import Resolved

FlagType = Literal["int", "float", "str", "bool", "choice", "json", "any"]
STATIC_FILES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py")
INTROSPECT_COMMAND = ("python3", "-c")
MARKER = "IMAGEFORGE-FLAGS "
FORMAT = 1


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Range:
    """A numeric range; either end may be open (None) or exclusive."""

    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False

    def contains(self, value: float) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.min_exclusive else value < self.minimum):
            return False
        return not (
            self.maximum is not None and (value >= self.maximum if self.max_exclusive else value > self.maximum)
        )

    def text(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f"{'>' if self.min_exclusive else '>='} {_number(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"{'<' if self.max_exclusive else '<='} {_number(self.maximum)}")
        return " and ".join(parts) or "any number"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class FlagSpec:
    """One flag of a vLLM parser. ``name`` has no dashes: ``max-num-seqs``."""

    name: str
    type: FlagType
    choices: tuple[str, ...] = ()
    range: Range | None = None
    negatable: bool = False  # --no-NAME exists (BooleanOptionalAction)
    takes_value: bool = True  # False for store_true/store_false
    multiple: bool = False  # nargs '+' / '*': a list is accepted
    nullable: bool = False  # the type maps "None" / "" to None
    aliases: tuple[str, ...] = ()  # the other option strings, with dashes: ("-tp",)
    also: tuple[str, ...] = ()  # words accepted besides the type (max-model-len: "auto")
    origin: str | None = None  # "vllm/engine/arg_utils.py:123" or "vllm 0.32.0 parser"

    def describe(self) -> str:
        """What the flag takes, in words: ``an integer >= 1``, ``true or false``, ``one of 'a', 'b'``."""
        if self.type == "bool":
            return "true or false" if (self.negatable or self.takes_value) else "true (or no such key)"
        if self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            text = {"int": "an integer", "float": "a number", "str": "text", "json": "a mapping, a list or JSON text",
                    "any": "a value", "choice": "a value"}[self.type]
            if self.range is not None and self.type in ("int", "float"):
                text += " " + self.range.text()
        if self.also:
            text += " or " + " or ".join(repr(a) for a in self.also)
        if self.multiple:
            text += " (or a list of them)"
        return text


@dataclass(frozen=True)
class FlagTable:
    """The flags of one parser, by name; ``source`` says where they came from (for messages)."""

    flags: Mapping[str, FlagSpec]
    source: str

    def __len__(self) -> int:
        return len(self.flags)

    def __contains__(self, name: object) -> bool:
        return name in self.flags

    def get(self, name: str) -> FlagSpec | None:
        return self.flags.get(name)

    def by_alias(self, name: str) -> FlagSpec | None:
        """The flag that ``--name`` / ``-name`` is an alias of."""
        for spec in self.flags.values():
            if f"--{name}" in spec.aliases or f"-{name}" in spec.aliases:
                return spec
        return None


# Known ranges where vLLM has them (0.32 declares most of them in pydantic metadata; 0.6.3 in code).
KNOWN_RANGES: Mapping[str, Range] = {
    "gpu-memory-utilization": Range(0, 1, min_exclusive=True),
    "port": Range(1, 65535),
    "max-num-seqs": Range(1),
    "max-num-batched-tokens": Range(1),
    "max-model-len": Range(1),
    "max-seq-len-to-capture": Range(1),
    "tensor-parallel-size": Range(1),
    "pipeline-parallel-size": Range(1),
    "block-size": Range(0, min_exclusive=True),
    "swap-space": Range(0),
}


# --------------------------------------------------------------------------- static reader (0.6.3 style)

_TYPE_NAMES: Mapping[str, tuple[FlagType, bool]] = {
    "int": ("int", False),
    "float": ("float", False),
    "str": ("str", False),
    "nullable_str": ("str", True),
    "loads": ("json", False),  # json.loads
    "nullable_kvs": ("str", True),
    "human_readable_int": ("int", False),
}


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _callee_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def flags_from_source(text: str, filename: str) -> list[FlagSpec]:
    """Every ``<x>.add_argument("--flag", ...)`` call in ``text`` as a FlagSpec (positionals are skipped)."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as exc:
        raise ConfigError(
            "cannot read the vLLM parser source",
            location=Location(filename, exc.lineno, exc.offset),
            expected="Python source with parser.add_argument(...) calls",
            found=f"a syntax error: {exc.msg}",
        ) from None
    constants = _module_constants(tree)
    out: list[FlagSpec] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        options = [n for n in names if n.startswith("-")]
        if not options:
            continue
        long = [o for o in options if o.startswith("--")]
        main = long[0] if long else options[0]
        kw = {k.arg: k.value for k in node.keywords if k.arg is not None}
        out.append(_spec_from_call(main, options, kw, f"{filename}:{node.lineno}", constants))
    return sorted(out, key=lambda s: s.origin or "")


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level ``NAME = <literal>`` assignments (``choices=TOOL_PARSERS`` names one)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value)
            if value is not _NOT_LITERAL:
                out[node.targets[0].id] = value
    return out


def _spec_from_call(main: str, options: list[str], kw: Mapping[str, ast.expr], origin: str,
                    constants: Mapping[str, Any] | None = None) -> FlagSpec:
    name = main.lstrip("-")
    aliases = tuple(o for o in options if o != main)
    action = kw.get("action")
    action_text = _literal(action) if isinstance(action, ast.Constant) else _callee_name(action)
    nargs = _literal(kw.get("nargs"))
    multiple = nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1)
    if action_text in ("store_true", "store_false"):
        return FlagSpec(name, "bool", takes_value=False, aliases=aliases, origin=origin)
    if action_text == "BooleanOptionalAction":
        return FlagSpec(name, "bool", negatable=True, takes_value=False, aliases=aliases, origin=origin)
    if action_text == "StoreBoolean":  # 0.6.3: --flag [true|false]
        return FlagSpec(name, "bool", aliases=aliases, origin=origin)
    flag_type: FlagType = "str"
    nullable = False
    type_node = kw.get("type")
    if type_node is not None:
        flag_type, nullable = _TYPE_NAMES.get(_callee_name(type_node) or "", ("any", False))
    if action_text not in (None, "store", "append"):
        flag_type = "any"  # a custom action parses the text itself
    choices: tuple[str, ...] = ()
    choices_node = kw.get("choices")
    raw_choices = (constants or {}).get(choices_node.id) if isinstance(choices_node, ast.Name) else _literal(
        choices_node)
    if isinstance(raw_choices, list | tuple):
        choices = tuple(str(c) for c in raw_choices)
        if all(isinstance(c, str) for c in raw_choices):
            flag_type = "choice"
    return FlagSpec(name, flag_type, choices=choices, multiple=multiple or action_text == "append",
                    nullable=nullable, aliases=aliases, origin=origin)


def read_static(sources: Mapping[str, str], *, label: str | None = None) -> FlagTable:
    """A FlagTable from parser source files: ``{"vllm/engine/arg_utils.py": text, ...}``; later files win."""
    flags: dict[str, FlagSpec] = {}
    for filename, text in sources.items():
        for spec in flags_from_source(text, filename):
            flags[spec.name] = spec
    return FlagTable(flags, label or "the vLLM parser source (" + ", ".join(sources) + ")")


# --------------------------------------------------------------------------- introspection (0.32 style)


def introspection_source() -> str:
    """Python source to run inside the image (``python3 -c SOURCE``): prints one ``IMAGEFORGE-FLAGS {json}`` line.

    The program is :mod:`imageforge.inimage.list_flags`, read as text."""
    return program("list_flags")


_KINDS: Mapping[str, FlagType] = {k: k for k in ("int", "float", "str", "bool", "choice", "json")}


def parse_introspection(output: str) -> FlagTable:
    """The FlagTable from the output of :func:`introspection_source` (other lines, e.g. warnings, are ignored)."""
    lines = [line for line in output.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise ConfigError("the image's vLLM did not list its flags", expected=f"a line starting {MARKER.strip()!r}",
                          found=tail or "no output")
    data = json.loads(lines[-1][len(MARKER):])
    if data.get("format") != FORMAT:
        raise ConfigError("unknown flag listing format", expected=f"format {FORMAT}", found=repr(data.get("format")))
    origin = f"vLLM {data.get('vllm', '?')}'s parser"
    flags: dict[str, FlagSpec] = {}
    for item in data["flags"]:
        b = item.get("bounds") or {}
        rng = None
        if b:
            rng = Range(
                minimum=b.get("gt", b.get("ge")), maximum=b.get("lt", b.get("le")),
                min_exclusive="gt" in b, max_exclusive="lt" in b,
            )
        kind: FlagType = _KINDS.get(item["type"], "any")
        spec = FlagSpec(
            name=item["name"], type=kind, choices=tuple(item.get("choices") or ()), range=rng,
            negatable=bool(item.get("negatable")), takes_value=bool(item.get("takes_value", True)),
            multiple=bool(item.get("multiple")), nullable=bool(item.get("nullable")),
            aliases=tuple(item.get("aliases") or ()), also=tuple(item.get("also") or ()), origin=origin,
        )
        flags[spec.name] = spec
    return FlagTable(flags, f"{origin} ({len(flags)} flags)")


# --------------------------------------------------------------------------- serving args with positions


@dataclass(frozen=True)
class ServingArg:
    """One value the manifest (or --set) gives, with where it was written."""

    key: str
    value: Any
    location: Location | None = None
    key_path: str | None = None
    source: str = "manifest"

    def problem(self, message: str, **kw: str | None) -> Problem:
        return Problem(message, location=self.location, key_path=self.key_path or self.key, **kw)


def _arg(doc: YamlDocument, kp: tuple[str | int, ...], key: str, value: Any, source: str) -> ServingArg:
    return ServingArg(key, value, doc.location(kp), format_key_path(kp), source)


def serving_args_of_target(manifest: Manifest, target: str) -> list[ServingArg]:
    """Every serving arg the target and its profiles write, each at its own line (for ``validate``)."""
    t = manifest.targets[target]
    doc = manifest.document
    out = [_arg(doc, ("targets", target, "serving", "args", k), k, v, "manifest") for k, v in t.serving.args.items()]
    for name, profile in t.profiles.items():
        out.extend(_arg(doc, ("targets", target, "profiles", name, "args", k), k, v, f"profile:{name}")
                   for k, v in profile.args.items())
    return out


def serving_args_of_resolved(resolved: Resolved) -> list[ServingArg]:
    """The resolved serving args, each pointing at the manifest line (or the --set) that decided it."""
    doc = resolved.manifest.document
    target = resolved.target.name
    out: list[ServingArg] = []
    for v in resolved.serving:
        if v.source == "manifest":
            out.append(_arg(doc, ("targets", target, "serving", "args", v.key), v.key, v.value, v.source))
        elif v.source.startswith("profile:"):
            kp = ("targets", target, "profiles", v.source.split(":", 1)[1], "args", v.key)
            out.append(_arg(doc, kp, v.key, v.value, v.source))
        else:
            out.append(ServingArg(v.key, v.value, None, f"{v.source} {v.key}", v.source))
    return out


def run_port_of(manifest: Manifest, target: str) -> ServingArg:
    """``run.port`` of a target with its line (the default 8000 points at the target when not written)."""
    kp = ("targets", target, "run", "port")
    return _arg(manifest.document, kp, "run.port", manifest.targets[target].run.port, "manifest")


def suite_models(doc: YamlDocument) -> list[ServingArg]:
    """Literal model names a smoke suite calls (``body.model`` of requests expecting success,
    ``vars.served_model_name``); templates such as ``${model}`` are skipped: they follow the server."""
    out: list[ServingArg] = []
    data = doc.data if isinstance(doc.data, dict) else {}
    for var in ("served_model_name", "model"):
        value = (data.get("vars") or {}).get(var)
        if isinstance(value, str) and "${" not in value:
            kp: tuple[str | int, ...] = ("vars", var)
            out.append(ServingArg("model", value, doc.location(kp), f"{doc.path.name}: {format_key_path(kp)}"))
    for section in ("setup", "checks"):
        for index, item in enumerate(data.get(section) or ()):
            if not isinstance(item, dict) or not _expects_success(item):
                continue  # a check that calls a wrong model on purpose (expects 404) names no served model
            body = (item.get("request") or {}).get("body")
            value = body.get("model") if isinstance(body, dict) else None
            if isinstance(value, str) and "${" not in value:
                kp = (section, index, "request", "body", "model")
                out.append(ServingArg("model", value, doc.location(kp), f"{doc.path.name}: {format_key_path(kp)}"))
    return out


def _expects_success(item: Mapping[str, Any]) -> bool:
    """True unless the check's ``expect.status`` asks for an error status only (absent: success)."""
    status = (item.get("expect") or {}).get("status") if isinstance(item.get("expect"), dict) else None
    if status is None:
        return True
    statuses = status if isinstance(status, list) else [status]
    for one in statuses:
        if isinstance(one, int) and not isinstance(one, bool) and 200 <= one < 300:
            return True
        if isinstance(one, str) and one.strip().lower().startswith("2"):
            return True
    return False


# --------------------------------------------------------------------------- the checker

_WHY_TYPED = "imageforge keeps serving values typed, one spelling each"
_WHY_DASHES = "imageforge keeps one spelling per flag (vLLM's parser would take both)"


def _type_word(value: Any) -> str:
    return type_name(value)


def _looks(value: str) -> Any:
    """A string that reads as a number or boolean: ``"8"`` -> 8 (for the hint); else None."""
    text = value.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return None


def _check_scalar(arg: ServingArg, spec: FlagSpec, value: Any, shown: str) -> Iterator[Problem]:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    found = f"{_type_word(value)} {value!r}"
    if spec.type == "bool":
        if not isinstance(value, bool):
            hint = f"write it without quotes: {str(_looks(value)).lower()} ({_WHY_TYPED})" if (
                isinstance(value, str) and isinstance(_looks(value), bool)) else None
            yield arg.problem(f"{shown} takes a boolean", expected=spec.describe(), found=found, hint=hint)
        elif value is False and not spec.negatable and not spec.takes_value:
            yield arg.problem(
                f"{shown}: false cannot be passed",
                expected="true, or no such key",
                found="false",
                hint=f"this vLLM has no --no-{spec.name}; remove the key to leave it off",
            )
        return
    if value in spec.also:
        return
    if spec.type in ("int", "float"):
        ok = (isinstance(value, int) and not isinstance(value, bool)) if spec.type == "int" else is_number
        if not ok:
            hint = None
            if isinstance(value, str):
                parsed = _looks(value)
                if isinstance(parsed, int | float) and not isinstance(parsed, bool) and (
                        spec.type == "float" or isinstance(parsed, int)):
                    hint = f"write it without quotes: {parsed} ({_WHY_TYPED})"
            yield arg.problem(f"{shown} takes {spec.describe()}", expected=spec.describe(), found=found, hint=hint)
            return
        rng = spec.range or KNOWN_RANGES.get(spec.name)
        if rng is not None and not rng.contains(value):
            yield arg.problem(f"{shown} is out of range", expected=rng.text(), found=repr(value))
        if spec.choices and str(value) not in spec.choices:
            yield arg.problem(f"{shown}: value not among its choices", expected=spec.describe(), found=repr(value))
        return
    if spec.type == "choice" or spec.choices:
        if not isinstance(value, str) or value not in spec.choices:
            yield arg.problem(
                f"{shown}: value not among its choices",
                expected=spec.describe(),
                found=found if not isinstance(value, str) else repr(value),
                hint=did_you_mean(value, spec.choices) if isinstance(value, str) else None,
            )
        return
    if spec.type == "str":
        if not isinstance(value, str):
            hint = f"write it quoted: '{value}' ({_WHY_TYPED})" if is_number else None
            yield arg.problem(f"{shown} takes text", expected="text", found=found, hint=hint)
        return
    if spec.type == "json":
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                yield arg.problem(f"{shown} takes a mapping or JSON text", expected="a mapping, a list or JSON text",
                                  found=found, hint="write it as a YAML mapping: imageforge passes it on as JSON")
        elif not isinstance(value, dict | list):
            yield arg.problem(f"{shown} takes a mapping or JSON text", expected="a mapping, a list or JSON text",
                              found=found)
        return
    # "any": a custom type; only the shape is checked
    if isinstance(value, dict):
        yield arg.problem(f"{shown} takes a value, not a mapping", expected="text or a number", found=found)


def _check_one(arg: ServingArg, spec: FlagSpec) -> Iterator[Problem]:
    value = arg.value
    shown = arg.key
    if value is None:
        return  # None leaves the flag out
    if isinstance(value, list | tuple) and spec.type != "json":
        if not spec.multiple:
            yield arg.problem(f"{shown} takes one value", expected=spec.describe(),
                              found=f"a list of {len(value)}")
            return
        for item in value:
            yield from _check_scalar(arg, spec, item, shown)
        return
    yield from _check_scalar(arg, spec, value, shown)


def check_serving_args(
    args: Iterable[ServingArg],
    table: FlagTable,
    *,
    run_port: ServingArg | None = None,
    suite: Sequence[ServingArg] = (),
) -> list[Problem]:
    """Problems of ``args`` against ``table`` plus the conflicts the manifest can see. Pure."""
    problems: list[Problem] = []
    args = list(args)
    for arg in args:
        key = arg.key
        spec = table.get(key)
        if spec is None:
            problems.extend(_unknown(arg, table))
            continue
        problems.extend(_check_one(arg, spec))
    problems.extend(_conflicts(args, run_port, suite))
    return problems


def _unknown(arg: ServingArg, table: FlagTable) -> Iterator[Problem]:
    key = arg.key
    dashed = key.replace("_", "-").lower()
    if dashed != key and dashed in table:
        yield arg.problem(
            f"serving flag {key!r} is written with underscores",
            expected=repr(dashed),
            found=repr(key),
            hint=f"use dashes: {dashed!r} ({_WHY_DASHES})",
        )
        spec = table.get(dashed)
        if spec is not None:
            yield from _check_one(replace(arg, key=dashed), spec)
        return
    alias_of = table.by_alias(key)
    if alias_of is not None:
        yield arg.problem(
            f"serving flag {key!r} is an alias of {alias_of.name!r}",
            expected=repr(alias_of.name),
            found=repr(key),
            hint=f"use {alias_of.name!r} ({_WHY_DASHES})",
        )
        yield from _check_one(replace(arg, key=alias_of.name), alias_of)
        return
    yield arg.problem(
        f"unknown serving flag {key!r}",
        expected=f"a flag of {table.source}",
        found=repr(key),
        hint=did_you_mean(dashed, table.flags) or "vllm serve --help inside the image lists them",
    )


def _conflicts(
    args: Sequence[ServingArg], run_port: ServingArg | None, suite: Sequence[ServingArg]
) -> Iterator[Problem]:
    by_key: dict[str, list[ServingArg]] = {}
    for arg in args:
        by_key.setdefault(arg.key, []).append(arg)
    if run_port is not None:
        for port in by_key.get("port", []):
            if port.value is not None and port.value != run_port.value:
                where = f" (line {run_port.location.line})" if run_port.location and run_port.location.line else ""
                yield port.problem(
                    "serving port differs from run.port",
                    expected=f"{run_port.value!r}, the run.port{where} imageforge publishes, or no serving port",
                    found=repr(port.value),
                    hint="vLLM would listen where nobody connects: set the port once, in run.port",
                )
    if suite:
        named = by_key.get("served-model-name") or by_key.get("model") or []
        for arg in named:
            served = [str(v) for v in arg.value] if isinstance(arg.value, list | tuple) else [str(arg.value)]
            for call in suite:
                if call.value not in served:
                    at = f" at {call.location}" if call.location else ""
                    yield arg.problem(
                        "the smoke suite calls a model this server does not serve",
                        expected=" or ".join(repr(s) for s in served),
                        found=f"{call.value!r} ({call.key_path}{at})",
                        hint="make them agree, or let the suite call \"${model}\" (the name the server reports)",
                    )


__all__ = [
    "INTROSPECT_COMMAND",
    "KNOWN_RANGES",
    "STATIC_FILES",
    "FlagSpec",
    "FlagTable",
    "Range",
    "ServingArg",
    "check_serving_args",
    "flags_from_source",
    "introspection_source",
    "parse_introspection",
    "read_static",
    "run_port_of",
    "serving_args_of_resolved",
    "serving_args_of_target",
    "suite_models",
]

