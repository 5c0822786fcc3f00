"""From a resolved configuration to an ordered plan: steps, cache keys, HIT/MISS, rendered config.

Cache keys are content hashes chained from the base image ID::

    key(step i) = sha256(key(step i-1), canonical step definition, bytes of its inputs)

so every key is known before anything is built, a change to one step changes its key
and every key after it, and a profile change touches only the profile's own steps and the
final config layer.  The daemon is consulted (through a :class:`CacheProbe`) only to read
the base image ID and to look keys up; without one every cache state is ``UNKNOWN``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from .manifest.model import Step
from .manifest.resolve import Resolved
from .serve.command import render_serving_config, serving_argv

# Bump when the engine makes different layers from the same inputs (v3: verify cleans /tmp/torchinductor_*;
# v4: a script layer labels the .py files it changed, which verify then compiles or lists as dead).
KEY_VERSION = "imageforge-cache-v4"
Stage = Literal["step", "profile-step", "verify", "config"]
CacheState = Literal["HIT", "MISS", "UNKNOWN"]


class CacheProbe(Protocol):
    """What plan needs from a daemon (implemented by :class:`imageforge.base.DaemonProbe`)."""

    def base_image_id(self, reference: str) -> str | None: ...

    def lookup(self, key: str) -> str | None: ...


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def chain_key(parent: str, definition: Mapping[str, Any], inputs: Mapping[str, str]) -> str:
    payload = canonical({"v": KEY_VERSION, "parent": parent, "def": definition, "inputs": inputs})
    return sha256_bytes(payload.encode())


def sha256_tree(root: Path) -> str:
    """One digest of a directory: every entry's relative path, type, executable bit and content (sorted)."""
    lines: list[str] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            lines.append(f"l {rel} {os.readlink(path)}")
        elif path.is_dir():
            lines.append(f"d {rel}")
        elif path.is_file():
            lines.append(f"{'x' if os.access(path, os.X_OK) else 'f'} {rel} {sha256_file(path)}")
    return sha256_bytes("\n".join(lines).encode())


DIRECTORY_UNSET = "unset"
DIRECTORY_MISSING = "missing"


def directory_input_name(step: Step) -> str:
    """The input name of a directory script step (no '$' or braces: it becomes a label key)."""
    return f"directory:{step.directory_env}" if step.directory_env else f"directory:{step.spec.host_directory}"


def step_inputs(step: Step, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """sha256 of every host file a step reads: its ``source`` (overlay, script), a ``directory`` (script).

    Kind-blind on purpose: a step kind reads host files through its spec's ``host_file`` and ``host_directory``
    only (imageforge.steps' classes take their inputs from here; steps sits above plan).

    A directory whose ``${VAR}`` is unset (or that is not there) has no digest: the value says
    ``unset`` (``missing``); the build refuses to start then (exit 5), plan and validate still work.
    """
    if step.spec.host_directory is not None:
        directory = step.directory(os.environ if environ is None else environ)
        if directory is None:
            return {directory_input_name(step): DIRECTORY_UNSET}
        if not directory.is_dir():
            return {directory_input_name(step): DIRECTORY_MISSING}
        return {directory_input_name(step): sha256_tree(directory)}
    if step.source_path is not None and step.spec.host_file is not None:
        return {step.spec.host_file: sha256_file(step.source)}
    return {}


@dataclass(frozen=True)
class PlannedStep:
    id: str
    kind: str
    stage: Stage
    definition: Mapping[str, Any]
    inputs: Mapping[str, str]
    key: str | None
    cache: CacheState
    image_id: str | None
    step: Step | None
    why: str | None


@dataclass(frozen=True)
class Plan:
    resolved: Resolved
    base_ref: str | None
    base_id: str | None
    base_problem: str | None
    steps: tuple[PlannedStep, ...]
    serving_config: bytes
    tags: tuple[str, ...]

    @property
    def final(self) -> PlannedStep:
        return self.steps[-1]

    def to_json(self) -> dict[str, Any]:
        r = self.resolved
        return {
            "manifest": str(r.manifest.path),
            "manifest_digest": r.manifest.digest,
            "target": r.target.name,
            "profile": r.profile_name,
            "base": {"reference": self.base_ref, "image_id": self.base_id, "problem": self.base_problem,
                     "recipe": str(r.target.base.recipe) if r.target.base.recipe else None},
            "package": {"import": r.target.package.import_name, "distribution": r.target.package.distribution,
                        "version": r.target.package.version},
            "image": r.target.image,
            "tags": list(self.tags),
            "serving": r.serving_args(),
            "serving_sources": {v.key: v.source for v in r.serving},
            "serving_env": r.serving_env(),
            "config_path": r.target.serving.config_path,
            "serving_style": r.target.serving.style,
            "argv": serving_argv(r) if r.target.serving.style == "argv" else None,
            "run": {"port": r.run.port, "shm_size": r.run.shm_size, "ipc": r.run.ipc, "gpus": r.run.gpus,
                    "devices": list(r.run.devices), "privileged": r.run.privileged,
                    "volumes": [asdict(v) for v in r.run.volumes],
                    "env": dict(r.run.env)},
            "steps": [
                {"id": s.id, "kind": s.kind, "stage": s.stage, **dict(s.definition), "why": s.why,
                 "inputs": dict(s.inputs), "key": s.key, "cache": s.cache, "image_id": s.image_id}
                for s in self.steps
            ],
        }


def verify_definition(resolved: Resolved) -> dict[str, Any]:
    t = resolved.target
    return {
        "imports": list(t.verify.imports),
        "import_env": dict(t.verify.import_env),
        "package": [t.package.import_name, t.package.distribution, t.package.version],
    }


def config_definition(resolved: Resolved, rendered: bytes) -> dict[str, Any]:
    s = resolved.target.serving
    return {
        "config_path": s.config_path,
        "config_sha256": sha256_bytes(rendered),
        "command": list(s.command),
        "env": resolved.serving_env(),
        "profile": resolved.profile_name,
    }


def make_plan(resolved: Resolved, *, environ: Mapping[str, str], probe: CacheProbe | None) -> Plan:
    """Order the steps and compute their keys; ask ``probe`` (if any) what already exists."""
    target = resolved.target
    base_ref = target.base.reference(environ)
    base_problem: str | None = None
    if target.base.recipe is not None:
        base_ref = None  # the recipe names its own image; the build engine resolves it
    elif base_ref is None and target.base.image_env is not None:
        base_problem = f"environment variable {target.base.image_env} is not set"
    base_id: str | None = None
    if probe is not None:
        if target.base.recipe is not None:
            base_id = probe.base_image_id(f"recipe:{target.base.recipe}")
        elif base_ref is not None:
            base_id = probe.base_image_id(base_ref)
        if base_id is None and base_problem is None:
            base_problem = "base image not present on the daemon"
        if base_id is not None and target.base.image_id and base_id != target.base.image_id:
            base_problem = f"base image ID {base_id} differs from the pinned {target.base.image_id}"

    rendered = render_serving_config(resolved)
    planned: list[PlannedStep] = []
    parent = base_id

    def add(stage: Stage, ident: str, kind: str, definition: Mapping[str, Any], inputs: Mapping[str, str],
            step: Step | None, why: str | None) -> None:
        nonlocal parent
        key = chain_key(parent, definition, inputs) if parent is not None else None
        image_id = probe.lookup(key) if (probe is not None and key is not None) else None
        cache: CacheState = "UNKNOWN" if key is None or probe is None else ("HIT" if image_id else "MISS")
        planned.append(PlannedStep(ident, kind, stage, definition, inputs, key, cache, image_id, step, why))
        parent = key

    for step in resolved.shared_steps:
        add("step", step.id, step.kind, step.definition(), step_inputs(step, environ), step, step.why)
    for step in resolved.profile_steps:
        add("profile-step", step.id, step.kind, step.definition(), step_inputs(step, environ), step, step.why)
    add("verify", "verify", "verify", verify_definition(resolved), {}, None,
        "stale bytecode, py_compile, overlay hashes, symlinks; imports at first start (build --verify-imports: here)")
    add("config", "serving-config", "config", config_definition(resolved, rendered), {}, None,
        f"rendered {target.serving.config_path} + CMD")
    name = target.image
    profile = resolved.profile_name
    if resolved.overridden:
        # --set / IMAGEFORGE_SET make a variant: it never takes the profile's own tags.
        variant = sha256_bytes(canonical(config_definition(resolved, rendered)).encode())[:8]
        tags: tuple[str, ...] = (f"{name}:{profile}-custom-{variant}",)
    else:
        tags = (f"{name}:{profile}", f"{name}:{profile}-{resolved.manifest.short_digest}")
    return Plan(
        resolved=resolved,
        base_ref=base_ref,
        base_id=base_id,
        base_problem=base_problem,
        steps=tuple(planned),
        serving_config=rendered,
        tags=tags,
    )


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def format_plan(plan: Plan) -> str:
    """Human-readable plan: every resolved value with its source, then the ordered steps."""
    r = plan.resolved
    t = r.target
    out: list[str] = []
    out.append(f"manifest  {r.manifest.path}  (digest {r.manifest.short_digest})")
    out.append(f"target    {t.name}: {t.description or ''}".rstrip())
    profile_line = r.profile_name
    if r.profile is not None:
        chain = " <- ".join(p.name for p in reversed(t.profile_chain(r.profile.name)))
        profile_line = chain + (f"   ({r.profile.why})" if r.profile.why else "")
    out.append(f"profile   {profile_line}")
    if t.base.recipe is not None:
        recipe = t.base.recipe
        base = f"recipe {recipe.relative_to(r.manifest.root) if recipe.is_relative_to(r.manifest.root) else recipe}"
    else:
        base = plan.base_ref or f"${{{t.base.image_env}}} (unset)"
    out.append(f"base      {base}" + (f"  id {plan.base_id[:19]}" if plan.base_id else ""))
    if plan.base_problem:
        out.append(f"          ! {plan.base_problem}")
        if t.base.load_hint:
            out.append(f"          hint: {t.base.load_hint}")
    out.append(f"package   {t.package.import_name} ({t.package.distribution} {t.package.version})")
    out.append(f"tags      {', '.join(plan.tags)}")
    out.append("")
    out.append(f"serving config -> {t.serving.config_path}   (* = differs from the manifest default)")
    width = max((len(v.key) for v in r.serving), default=10)
    for v in r.serving:
        mark = "*" if v.changed and v.value != v.default else " "
        line = f"  {mark} {v.key:<{width}}  {_fmt(v.value):<14} [{v.source}]"
        if v.changed and v.default is not None and v.value != v.default:
            line += f" (default {_fmt(v.default)})"
        if v.reason:
            line += f"  # {v.reason}"
        out.append(line)
    if r.env:
        out.append("serving env")
        for e in r.env:
            mark = "*" if e.changed and e.value != e.default else " "
            out.append(f"  {mark} {e.key}={e.value}  [{e.source}]")
    run_bits = [f"port {r.run.port} (127.0.0.1)"]
    if r.run.shm_size:
        run_bits.append(f"shm {r.run.shm_size}")
    if r.run.ipc:
        run_bits.append(f"ipc {r.run.ipc}")
    if r.run.gpus:
        run_bits.append(f"gpus {r.run.gpus}")
    if r.run.devices:
        run_bits.append("devices " + ",".join(r.run.devices))
    if r.run.privileged:
        run_bits.append("privileged")
    for vol in r.run.volumes:
        run_bits.append(f"volume {vol.source}:{vol.target}{':ro' if vol.read_only else ''}"
                        + (" (named)" if vol.named else ""))
    out.append("run       " + "; ".join(run_bits))
    out.append("")
    out.append(f"steps ({len(plan.steps)})")
    for i, s in enumerate(plan.steps, 1):
        key = s.key[:12] if s.key else "-" * 12
        stage = f"  ({s.stage})" if s.stage == "profile-step" else ""
        out.append(f"  {i:>2}. [{s.cache:<7}] {key}  {s.kind:<8} {s.id}{stage}")
        if s.why:
            out.append(f"      why: {s.why}")
        for k, v in s.definition.items():
            if k in ("id", "kind"):
                continue
            text = _fmt(v)
            if "\n" in text or len(text) > 90:
                text = json.dumps(text if isinstance(v, str) else v)
                text = text if len(text) <= 90 else text[:87] + "..."
            out.append(f"      {k}: {text}")
        for name, digest in s.inputs.items():
            if digest in (DIRECTORY_UNSET, DIRECTORY_MISSING) and s.step is not None:
                where = f"${s.step.directory_env}" if s.step.directory_env else str(s.step.spec.host_directory)
                state = "not set" if digest == DIRECTORY_UNSET else "not a directory"
                out.append(f"      input {name}: {where} is {state} (the build stops with exit 5)")
                if s.step.load_hint:
                    out.append(f"      hint: {s.step.load_hint}")
                continue
            out.append(f"      input {name}: sha256 {digest[:16]}")
    hits = sum(1 for s in plan.steps if s.cache == "HIT")
    unknown = all(s.cache == "UNKNOWN" for s in plan.steps)
    if unknown:
        out.append("cache: UNKNOWN (no daemon answered, or the base image is not there yet)")
    else:
        out.append(f"cache: {hits}/{len(plan.steps)} HIT")
    return "\n".join(out)


@dataclass(frozen=True)
class PlanReport:
    plan: Plan
    notes: tuple[str, ...] = ()  # e.g. "flags not checked: ..." (imageforge.flags.images)
    warnings: tuple[str, ...] = ()  # evaluator checks the serving values make fail (imageforge.flags.evaluator)

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), **({"notes": list(self.notes)} if self.notes else {}),
                "warnings": list(self.warnings)}

    def text(self) -> str:
        return "\n".join([format_plan(self.plan), *self.notes, *(f"warning: {w}" for w in self.warnings)])
