"""Resolve a target + profile into one frozen configuration, by one pure function.

Precedence, lowest first (each value remembers where it came from):

1. the target's ``serving`` (manifest defaults);
2. the profile chain (``extends`` ancestors first, then the profile itself);
3. the environment: ``IMAGEFORGE_SET="key=value key=value"``;
4. the command line: ``--set key=value`` (repeatable).

Keys for ``--set`` / ``IMAGEFORGE_SET``:

* ``max-num-seqs`` or ``serving.max-num-seqs`` -- a serving argument that the target or one
  of its profiles defines (the value must have the same type);
* ``env.NAME`` -- a serving environment variable (any name);
* ``run.port``, ``run.shm_size`` -- run options.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from ..errors import ConfigError
from .model import Manifest, Profile, RunOptions, Step, Target, frozen_map
from .yaml_messages import did_you_mean

ENV_SET = "IMAGEFORGE_SET"


@dataclass(frozen=True)
class Value:
    """One resolved value and its provenance."""

    key: str
    value: Any
    source: str  # "manifest", "profile:NAME", "env:IMAGEFORGE_SET", "cli:--set"
    default: Any  # the manifest's own value (None when the manifest has none)
    reason: str | None = None

    @property
    def changed(self) -> bool:
        return self.source != "manifest"


@dataclass(frozen=True)
class Resolved:
    manifest: Manifest
    target: Target
    profile: Profile | None
    serving: tuple[Value, ...]
    env: tuple[Value, ...]
    run: RunOptions
    run_values: tuple[Value, ...]
    shared_steps: tuple[Step, ...]
    profile_steps: tuple[Step, ...]

    @property
    def profile_name(self) -> str:
        return self.profile.name if self.profile else "default"

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.shared_steps + self.profile_steps

    @property
    def overridden(self) -> bool:
        """True when the environment or the command line changed a value (a variant, not the profile)."""
        values = (*self.serving, *self.env, *self.run_values)
        return any(v.source.startswith(("env:", "cli:")) for v in values)

    def serving_args(self) -> dict[str, Any]:
        return {v.key: v.value for v in self.serving if v.value is not None}

    def serving_env(self) -> dict[str, str]:
        return {v.key: str(v.value) for v in self.env}


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _type_word(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}.get(
        type(value), type(value).__name__
    )


def parse_assignments(items: Iterable[str], origin: str) -> list[tuple[str, Any, str]]:
    """``["a=1", "b=x"]`` -> ``[("a", 1, origin), ...]``; values are parsed as YAML scalars."""
    out: list[tuple[str, Any, str]] = []
    for item in items:
        if "=" not in item:
            raise ConfigError(
                f"{origin}: cannot read {item!r}",
                expected="key=value, e.g. max-num-seqs=16",
                found=repr(item),
            )
        key, _, text = item.partition("=")
        key = key.strip()
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, dict | list) and not text.strip().startswith(("[", "{")):
            value = text
        out.append((key, value, origin))
    return out


def env_assignments(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    raw = environ.get(ENV_SET, "").strip()
    if not raw:
        return []
    return parse_assignments(shlex.split(raw), f"env:{ENV_SET}")


def resolve(
    manifest: Manifest,
    target_name: str | None,
    profile_name: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    sets: Sequence[str] = (),
) -> Resolved:
    """The one precedence chain. Pure: reads only its arguments."""
    environ = environ or {}
    target = manifest.target(target_name)
    profile: Profile | None = None
    chain: tuple[Profile, ...] = ()
    name = profile_name or target.default_profile
    if name is not None:
        if name not in target.profiles:
            raise ConfigError(
                f"unknown profile {name!r} for target {target.name!r}",
                location=manifest.document.location(("targets", target.name, "profiles")),
                key_path=f"targets.{target.name}.profiles",
                expected="one of " + ", ".join(repr(p) for p in target.profiles) if target.profiles else "no profiles",
                found=repr(name),
                hint=did_you_mean(name, target.profiles) or "see `invoke validate` for the profiles",
            )
        profile = target.profiles[name]
        chain = target.profile_chain(name)

    serving: dict[str, Value] = {
        key: Value(key, value, "manifest", value, target.serving.reasons.get(key))
        for key, value in target.serving.args.items()
    }
    env: dict[str, Value] = {k: Value(k, v, "manifest", v) for k, v in target.serving.env.items()}
    for p in chain:
        for key, value in p.args.items():
            default = target.serving.args.get(key)
            serving[key] = Value(key, value, f"profile:{p.name}", default, p.reasons.get(key))
        for key, value in p.env.items():
            env[key] = Value(key, value, f"profile:{p.name}", target.serving.env.get(key))

    known_serving = set(target.serving.args)
    for p in target.profiles.values():
        known_serving |= set(p.args)
    run = target.run
    run_values: dict[str, Value] = {
        "port": Value("port", run.port, "manifest", run.port),
        "shm_size": Value("shm_size", run.shm_size, "manifest", run.shm_size),
    }
    for key, value, origin in [*env_assignments(environ), *parse_assignments(sets, "cli:--set")]:
        if key.startswith("env."):
            var = key[4:]
            if not var:
                raise ConfigError(f"{origin}: empty variable name in {key!r}", expected="env.NAME=value")
            env[var] = Value(var, str(value), origin, target.serving.env.get(var))
            continue
        if key.startswith("run."):
            rkey = key[4:]
            if rkey not in run_values:
                raise ConfigError(
                    f"{origin}: unknown key {key!r}",
                    expected="run.port or run.shm_size",
                    found=repr(key),
                    hint=did_you_mean(rkey, run_values),
                )
            current = run_values[rkey].default
            if rkey == "port" and not (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536):
                raise ConfigError(f"{origin}: wrong type for {key!r}", expected="a port number 1-65535",
                                  found=f"{_type_word(value)} {value!r}")
            run_values[rkey] = Value(rkey, value if rkey == "port" else str(value), origin, current)
            continue
        skey = key[len("serving."):] if key.startswith("serving.") else key
        if skey not in known_serving:
            raise ConfigError(
                f"{origin}: unknown key {key!r}",
                expected="a serving argument of target " + repr(target.name) + " ("
                + ", ".join(sorted(known_serving)) + "), env.NAME or run.port/run.shm_size",
                found=repr(key),
                hint=did_you_mean(skey, known_serving) or "new serving arguments are added in the manifest",
            )
        current_value = serving[skey].value if skey in serving else None
        reference = current_value if current_value is not None else target.serving.args.get(skey)
        if not _type_ok(reference, value):
            raise ConfigError(
                f"{origin}: wrong type for {skey!r}",
                expected=_type_word(reference),
                found=f"{_type_word(value)} {value!r}",
                hint=f"e.g. {skey}={reference!r}" if not isinstance(reference, str) else None,
            )
        if isinstance(reference, float) and isinstance(value, int):
            value = float(value)
        serving[skey] = Value(skey, value, origin, target.serving.args.get(skey))

    run = replace(run, port=int(run_values["port"].value), shm_size=run_values["shm_size"].value)
    return Resolved(
        manifest=manifest,
        target=target,
        profile=profile,
        serving=tuple(serving.values()),
        env=tuple(env.values()),
        run=replace(run, env=frozen_map(run.env)),
        run_values=tuple(run_values.values()),
        shared_steps=target.steps,
        profile_steps=tuple(step for p in chain for step in p.steps),
    )


@dataclass(frozen=True)
class ValidationSummary:
    manifest: Manifest
    resolved: tuple[Resolved, ...]
    notes: tuple[str, ...] = ()  # what the serving-flag check said per target (imageforge.flags.images)
    warnings: tuple[str, ...] = ()  # evaluator checks the serving values make fail (imageforge.flags.evaluator)

    def to_json(self) -> dict[str, Any]:
        targets: dict[str, Any] = {}
        for name, target in self.manifest.targets.items():
            targets[name] = {
                "default_profile": target.default_profile,
                "profiles": list(target.profiles),
                "steps": [s.id for s in target.steps],
                "base": target.base.image or (f"${{{target.base.image_env}}}" if target.base.image_env else None),
                "recipe": str(target.base.recipe) if target.base.recipe else None,
            }
        return {
            "ok": True,
            "manifest": str(self.manifest.path),
            "digest": self.manifest.digest,
            "default_target": self.manifest.default_target,
            "targets": targets,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }

    def text(self) -> str:
        m = self.manifest
        lines = [f"{m.path}: ok (digest {m.short_digest})"]
        for name, target in m.targets.items():
            default = " (default)" if name == m.default_target else ""
            profiles = ", ".join(
                p + ("*" if p == target.default_profile else "") for p in target.profiles
            ) or "none"
            lines.append(
                f"  target {name}{default}: {len(target.steps)} steps; profiles {profiles}"
            )
        return "\n".join([*lines, *(f"  {note}" for note in self.notes),
                          *(f"  warning: {w}" for w in self.warnings)])


def validate_all(manifest: Manifest) -> ValidationSummary:
    """Resolve every profile of every target of a loaded manifest (no daemon, no environment)."""
    resolved: list[Resolved] = []
    for name, target in manifest.targets.items():
        names: list[str | None] = list(target.profiles) or [None]
        for profile in names:
            resolved.append(resolve(manifest, name, profile, environ={}))
    return ValidationSummary(manifest, tuple(resolved))
