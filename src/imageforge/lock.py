"""`lock` / `build --locked`: build.lock.

``invoke lock --target T`` records, per target, what a build of it rests on: the manifest's
digest, the base image (reference and ID), the package version found in it, and the sha256
of every overlay and script source (shared and profile steps).  ``invoke build --locked``
compares the same facts before any layer is built and fails on any drift, naming each one.

Drift exits with code 2 (config error): nothing was built, and what disagrees is the declared
input (the manifest, a source file, the base the manifest names) against the lock, which is
itself configuration.  Build failures proper keep exit 3; a base image that is not on the
daemon at all keeps exit 5.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .base import base_reference, discover_package, missing_variable_error
from .docker_engine import daemon_errors, ensure_daemon
from .docker_engine.containers import containers
from .errors import ConfigError, Problem
from .labels import L_KIND, L_TARGET, L_TOOL, TOOL
from .manifest.model import Manifest, Target
from .manifest.resolve import Resolved
from .plan import step_inputs

Log = Callable[[str], None]
LOCK_FILE = "build.lock"
LOCK_VERSION = 1


# --------------------------------------------------------------------------- lock


def lock_path(manifest: Manifest) -> Path:
    return manifest.root / LOCK_FILE


def target_inputs(target: Target) -> dict[str, dict[str, str]]:
    """step id -> {source, sha256} for every overlay/script step (shared and all profiles)."""
    steps = list(target.steps) + [s for p in target.profiles.values() for s in p.steps]
    out: dict[str, dict[str, str]] = {}
    for step in steps:
        for source, digest in step_inputs(step).items():
            out[step.id] = {"source": source, "sha256": digest}
    return dict(sorted(out.items()))


def lock_entry(manifest: Manifest, target: Target, base_ref: str, base_id: str, version: str) -> dict[str, Any]:
    """What ``build.lock`` records for one target (pure)."""
    return {
        "manifest": manifest.path.name,
        "manifest_digest": manifest.digest,
        "base": {"reference": base_ref, "image_id": base_id},
        "package": {"distribution": target.package.distribution, "import": target.package.import_name,
                    "version": version},
        "inputs": target_inputs(target),
    }


def lock_drift(locked: Mapping[str, Any], current: Mapping[str, Any]) -> list[Problem]:
    """Every difference between a lock entry and the current facts, one Problem each (pure)."""
    out: list[Problem] = []
    if locked.get("manifest_digest") != current.get("manifest_digest"):
        out.append(Problem(f"manifest {current.get('manifest')} changed since the lock",
                           key_path="manifest_digest", expected=str(locked.get("manifest_digest")),
                           found=str(current.get("manifest_digest"))))
    lb, cb = locked.get("base", {}), current.get("base", {})
    if lb.get("image_id") != cb.get("image_id"):
        out.append(Problem(f"base image {cb.get('reference')} is a different image", key_path="base.image_id",
                           expected=str(lb.get("image_id")), found=str(cb.get("image_id"))))
    if lb.get("reference") != cb.get("reference"):
        out.append(Problem("base image reference changed", key_path="base.reference",
                           expected=str(lb.get("reference")), found=str(cb.get("reference"))))
    lp, cp = locked.get("package", {}), current.get("package", {})
    for key in ("distribution", "import", "version"):
        if lp.get(key) != cp.get(key) and cp.get(key) is not None:
            out.append(Problem(f"package {key} changed", key_path=f"package.{key}", expected=str(lp.get(key)),
                               found=str(cp.get(key))))
    li, ci = locked.get("inputs", {}), current.get("inputs", {})
    for step_id in sorted(set(li) | set(ci)):
        a, b = li.get(step_id), ci.get(step_id)
        if a == b:
            continue
        if a is None:
            out.append(Problem(f"step {step_id}: {b['source']} is not in the lock (new step)",
                               key_path=f"inputs.{step_id}"))
        elif b is None:
            out.append(Problem(f"step {step_id}: locked input {a['source']} no longer in the manifest",
                               key_path=f"inputs.{step_id}"))
        elif a.get("source") != b.get("source"):
            out.append(Problem(f"step {step_id}: source changed", key_path=f"inputs.{step_id}.source",
                               expected=a.get("source"), found=b.get("source")))
        else:
            out.append(Problem(f"step {step_id}: {b['source']} changed", key_path=f"inputs.{step_id}.sha256",
                               expected=a.get("sha256"), found=b.get("sha256")))
    return out


def read_lock(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": LOCK_VERSION, "targets": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable lock file", found=str(exc)[:200],
                          hint="delete it and run `invoke lock` again") from None
    if not isinstance(data, dict) or not isinstance(data.get("targets"), dict):
        raise ConfigError(f"{path} is not a lock file written by imageforge",
                          hint="delete it and run `invoke lock` again")
    return data


def _current(resolved: Resolved, environ: Mapping[str, str], log: Log, *, version_of_locked: Mapping[str, Any] | None,
             ) -> dict[str, Any]:
    """The lock entry the daemon and the files describe now (base must exist; never made)."""
    target = resolved.target
    with daemon_errors("reading the base image"):
        base_ref, base_id = base_reference(resolved, environ, log, make=False)
        if version_of_locked is not None and version_of_locked.get("base", {}).get("image_id") == base_id:
            version = str(version_of_locked.get("package", {}).get("version"))  # same image, same package
        else:
            labels = {L_TOOL: TOOL, L_TARGET: target.name, L_KIND: "lock"}
            with containers(labels) as scope:
                version = discover_package(base_id, target, scope, log, check_version=False).version
    return lock_entry(resolved.manifest, target, base_ref, base_id, version)


def write_lock(resolved: Resolved, environ: Mapping[str, str], *, log: Log = print) -> tuple[Path, dict[str, Any]]:
    """`invoke lock`: record the target's facts in build.lock (other targets' entries are kept)."""
    if resolved.target.base.recipe is None and resolved.target.base.reference(environ) is None:
        raise missing_variable_error(resolved.target)
    ensure_daemon(log=log)
    entry = _current(resolved, environ, log, version_of_locked=None)
    entry["locked_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    m = resolved.manifest
    path = lock_path(m)
    data = read_lock(path)
    data["version"] = LOCK_VERSION
    data["targets"][resolved.target.name] = entry
    data["targets"] = dict(sorted(data["targets"].items()))
    tmp = path.with_suffix(".lock.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path, entry


def check_lock(resolved: Resolved, environ: Mapping[str, str], log: Log) -> None:
    """Raise ConfigError (exit 2) naming every drift from build.lock; never builds or makes anything."""
    path = lock_path(resolved.manifest)
    name = resolved.target.name
    locked = read_lock(path)["targets"].get(name)
    if locked is None:
        raise ConfigError(f"--locked, but {path} has no entry for target {name!r}",
                          hint=f"run `invoke lock --target {name}` and commit {LOCK_FILE}")
    current = _current(resolved, environ, log, version_of_locked=locked)
    drift = lock_drift(locked, current)
    if drift:
        raise ConfigError(f"target {name!r} drifted from {path.name} ({len(drift)} difference(s)); nothing built",
                          problems=drift,
                          hint=f"build without --locked, or run `invoke lock --target {name}` to accept the change")
    log(f"lock ok: {name} matches {path.name} (base {current['base']['image_id'].split(':')[-1][:12]}, "
        f"{len(current['inputs'])} input(s))")
