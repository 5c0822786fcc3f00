"""Serving flags, checking: the manifest's serving args against a :class:`~imageforge.flags.model.FlagTable`.

Pure: :func:`check_serving_args` takes serving args with their manifest positions (:class:`ServingArg`; see
:func:`serving_args_of_resolved` / :func:`serving_args_of_target`) and a table, and returns
:class:`~imageforge.errors.Problem` s (unknown flag + "did you mean", underscores -> "use dashes", types,
choices, ranges, ``--no-FLAG`` that does not exist, ``port`` vs ``run.port``, ``served-model-name`` vs the model
the smoke suite calls: :func:`suite_models`). The reasons given are imageforge's (one spelling per flag, typed
values), not "vLLM rejects this": vLLM's own parser accepts underscores and numeric strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import Location, Problem
from ..manifest.yaml_messages import did_you_mean, format_key_path, type_name
from ..manifest.yamldoc import YamlDocument
from .model import KNOWN_RANGES, FlagSpec, FlagTable

if TYPE_CHECKING:
    from ..manifest.model import Manifest
    from ..manifest.resolve import Resolved


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
