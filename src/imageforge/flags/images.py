"""Serving flags learnt from the target's own package and the manifest checked against them.

:mod:`imageforge.flags.model` (read: `learn`, checked: `check`); this module wires it to the image and a cache:

* :func:`flag_method` -- ``package.flags`` (``introspect`` | ``static`` | ``off``); when not written,
  ``off`` when the package is not ``vllm``, ``introspect`` for a recipe base (this project's image: its
  vLLM imports without a device) and ``static`` for an image base (the vendor image needs the card).
* :func:`parser_steps` -- the steps up to and including the last one that can change the parser: a
  script step, or a patch/overlay writing one of :data:`PARSER_FILES` (bi100's baseline script replaces
  ``cli_args.py``). The cache key (:func:`flags_key`) is the plan's chain key of that step: the base
  image ID plus those steps' keys (the base ID itself when no step changes the parser).
* :func:`learn_flags` -- against the daemon: the parser steps run in check-patches' machinery
  (:func:`~imageforge.patches.check.check_steps` with a :class:`~imageforge.patches.check.ScriptSandbox`),
  then the parser files are read (static) or vLLM's own parser is listed in a throwaway container,
  network off, removed after (introspect). The table is cached under ``<cache>/flags/``, with an index
  by base *reference* so that ``validate`` (no daemon) finds it: :func:`cached_flags`.
* :func:`check_validate` / :func:`check_resolved` / :func:`check_target` -- the front door's calls:
  problems are one ConfigError (exit 2) with the file:line of each offending key.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .. import labels as lb
from ..errors import BuildError, ConfigError, ErrorCollector, InfraError, Location, Problem
from ..manifest.yamldoc import load_yaml_c
from ..plan import canonical, chain_key, sha256_bytes, sha256_file, step_inputs
from ..settings import cache_dir
from ..steps import kind, one_file
from .check import (
    ServingArg,
    check_serving_args,
    run_port_of,
    serving_args_of_resolved,
    serving_args_of_target,
    suite_models,
)
from .learn import FORMAT, INTROSPECT_COMMAND, STATIC_FILES, introspection_source, parse_introspection, read_static
from .model import FlagSpec, FlagTable, Range

if TYPE_CHECKING:
    from ..manifest.model import Manifest, Step, Target
    from ..manifest.resolve import Resolved
    from ..patches.check import Overlay, ScriptSandbox

Log = Callable[[str], None]
FlagMethod = Literal["introspect", "static", "off"]

#: Files whose change changes the parser (relative to the site directory); vLLM 0.32's config classes too.
PARSER_FILES = (*STATIC_FILES, "vllm/entrypoints/launchers/cli_args.py", "vllm/utils/argparse_utils.py")
PARSER_DIRS = ("vllm/config/",)
NOT_CHECKED = "flags not checked: run plan or check-patches once with the daemon"
INTROSPECT_TIMEOUT_S = 900


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


# --------------------------------------------------------------------------- method and key


def flag_method(target: Target) -> FlagMethod:
    """``package.flags``, else off for a package other than vllm, introspect for a recipe base, static else."""
    written = target.package.flags
    if written in ("introspect", "static", "off"):
        return written  # type: ignore[return-value]
    if target.package.import_name != "vllm":
        return "off"  # the flags checked are vLLM's
    return "introspect" if target.base.recipe is not None else "static"


def _in_package(path: str) -> str:
    """A step's image path as a package path (``vllm/...``) when it names one."""
    if not path.startswith("/"):
        return path
    marker = "/vllm/"
    return path[path.rfind(marker) + 1:] if marker in path else path


def changes_parser(step: Step) -> bool:
    """A step that runs a process (a script: it may do anything), or a file step writing a parser file."""
    if kind(step.kind).runs_process:
        return True
    written = one_file(step)
    if written is None:
        return False
    path = _in_package(written)
    return path in PARSER_FILES or path.startswith(PARSER_DIRS)


def parser_steps(steps: Sequence[Step]) -> tuple[Step, ...]:
    """The steps up to and including the last that can change the parser (none: the base's parser)."""
    last = max((i for i, step in enumerate(steps) if changes_parser(step)), default=-1)
    return tuple(steps[: last + 1])


def key_parts(steps: Sequence[Step], environ: Mapping[str, str]) -> list[Any]:
    """What of the parser steps decides the flags, by content, never the layer chain:

    each step that can change the parser (:func:`changes_parser`) by its own definition and input digests;
    every other file step by the path it writes only (a new module can add a choice to a registry, a patch to a
    module that is not a parser file cannot change a flag). So an edit of the cpu target's ``prefix_prefill``
    patch is not a new parser, even though the ``ldconfig`` script after it puts it among the parser steps.
    A script counts by its own definition: the same script on the same base is taken to change the same flags.
    """
    parts: list[Any] = []
    for step in parser_steps(steps):
        if changes_parser(step):
            parts.append([step.definition(), step_inputs(step, environ)])
        elif (written := one_file(step)) is not None:  # a patch's file, an overlay's dest
            parts.append([step.kind, written])
        else:  # a symlink step is paths only: all of it, but its id and why
            parts.append({k: v for k, v in step.definition().items() if k not in ("id", "why")})
    return parts


def flags_key(base_id: str, steps: Sequence[Step], environ: Mapping[str, str]) -> str:
    """The base image ID chained with :func:`key_parts` (the base ID when no step changes the parser)."""
    key = base_id
    for part in key_parts(steps, environ):
        key = chain_key(key, {"part": part}, {})
    return key


def _recipe_digest(recipe: Path) -> str | None:
    """The recipe directory by content (relative names, modes, bytes; no caches): where it is cloned does not count."""
    if not recipe.is_dir():
        return None
    lines = [f"{'x' if os.access(p, os.X_OK) else 'f'} {p.relative_to(recipe).as_posix()} {sha256_file(p)}"
             for p in sorted(recipe.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sha256_bytes("\n".join(lines).encode())


def _reference(target: Target, environ: Mapping[str, str]) -> str | None:
    """The base by content, without a daemon: the recipe's files (recipe base), else the reference and its pin.

    Never a host path: a fresh clone of the same manifest finds the flags learnt in another clone.
    """
    if target.base.recipe is not None:
        digest = _recipe_digest(Path(target.base.recipe))
        return None if digest is None else f"recipe-content:{digest}"
    ref = target.base.reference(environ)
    if ref is None or not target.base.image_id:
        return ref
    return f"{ref}@{target.base.image_id}"


def index_key(target: Target, environ: Mapping[str, str]) -> str | None:
    """What ``validate`` can compute without a daemon: the base by content + the parser steps + the method."""
    ref = _reference(target, environ)
    if ref is None:
        return None
    steps = key_parts(target.steps, environ)
    return sha256_bytes(canonical({"ref": ref, "steps": steps, "method": flag_method(target),
                                   "format": FORMAT}).encode())


# --------------------------------------------------------------------------- the cache


def flags_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    return cache_dir(environ) / "flags"


def _cache_file(key: str, method: str, environ: Mapping[str, str] | None) -> Path:
    return flags_cache_dir(environ) / f"{key.split(':')[-1][:32]}-{method}.json"


def table_to_json(table: FlagTable) -> dict[str, Any]:
    return {"format": FORMAT, "source": table.source, "flags": [asdict(spec) for spec in table.flags.values()]}


def table_from_json(data: Mapping[str, Any]) -> FlagTable:
    if data.get("format") != FORMAT:
        raise ValueError(f"flag cache format {data.get('format')!r}")
    flags: dict[str, FlagSpec] = {}
    for item in data["flags"]:
        rng = Range(**item["range"]) if item.get("range") else None
        spec = FlagSpec(**{**item, "range": rng, **{k: tuple(item.get(k) or ()) for k in
                                                     ("choices", "aliases", "also")}})
        flags[spec.name] = spec
    return FlagTable(flags, str(data["source"]))


def store_flags(table: FlagTable, *, key: str, base_id: str, method: str, index: str | None,
                environ: Mapping[str, str] | None = None) -> Path:
    """Write the table under its key, and the index entry ``validate`` looks up."""
    path = _cache_file(key, method, environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**table_to_json(table), "key": key, "base_id": base_id, "method": method}))
    if index is not None:
        entry = flags_cache_dir(environ) / "index" / f"{index[:32]}.json"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps({"file": path.name, "base_id": base_id, "key": key}))
    return path


def _load(path: Path) -> FlagTable | None:
    if not path.exists():
        return None
    try:
        return table_from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, OSError):
        return None  # an unreadable or older cache entry is learnt again


@dataclass(frozen=True)
class CachedFlags:
    """An index hit: the table, and the base image ID and flags key it was learnt under."""

    table: FlagTable
    base_id: str
    key: str


def cached_entry(target: Target, environ: Mapping[str, str]) -> CachedFlags | None:
    """The table last learnt for this base content and these parser steps (no daemon, no docker import), or None.

    The index key holds the parser steps' definitions and input digests, so the entry's key is the
    :func:`flags_key` of its base ID and today's parser steps.
    """
    index = index_key(target, environ)
    if index is None:
        return None
    entry = flags_cache_dir(environ) / "index" / f"{index[:32]}.json"
    try:
        data = json.loads(entry.read_text())
        name, base_id, key = str(data["file"]), str(data["base_id"]), str(data["key"])
    except (ValueError, KeyError, TypeError, OSError):
        return None
    table = _load(flags_cache_dir(environ) / name)
    return None if table is None else CachedFlags(table, base_id, key)


def cached_flags(target: Target, environ: Mapping[str, str]) -> FlagTable | None:
    """The table last learnt for this base content and these parser steps (no daemon), or None."""
    hit = cached_entry(target, environ)
    return None if hit is None else hit.table


def _base_confirmed(target: Target, hit: CachedFlags, environ: Mapping[str, str]) -> bool:
    """Whether the cached entry's base is the target's base, with at most one image inspect.

    A recipe base is named by its files' content (the same recipe makes the same vLLM parser) and a pinned
    image by its ID (the build refuses another): no daemon call. An unpinned reference can be re-pointed
    (``docker load``), so its ID is read once; no daemon answering -> not confirmed.
    """
    if target.base.recipe is not None or target.base.image_id:
        return True
    ref = target.base.reference(environ)
    if ref is None:
        return False
    from ..docker_engine import image_or_none

    try:
        image = image_or_none(ref)
    except Exception:  # no daemon, a refused connection: learnt (or noted) the slow way
        return False
    return image is not None and str(image.id) == hit.base_id


# --------------------------------------------------------------------------- learning against the daemon


def _image_after(sandbox: ScriptSandbox, state: Overlay) -> str:
    """An image holding the parser steps' result: the last script's, plus the file steps since."""
    from ..patches.check import ScriptSandbox

    if not state.files and not state.links:
        return sandbox.image
    container = sandbox.scope.create(sandbox.image, entrypoint=["/bin/true"], command=[])
    try:
        ScriptSandbox._materialise(container, state)
        image = container.commit(message="imageforge flags", conf={"Labels": sandbox.labels})
    finally:
        sandbox.scope.remove(container)
    sandbox.images.append(str(image.id))  # removed with the sandbox
    return str(image.id)


def _introspect(sandbox: ScriptSandbox, image: str, log: Log) -> str:
    container = sandbox.scope.create(
        image, entrypoint=[], command=[*INTROSPECT_COMMAND, introspection_source()], network_disabled=True,
        environment={"VLLM_TARGET_DEVICE": "cpu", "HOME": "/tmp"}, labels={lb.L_KIND: "flags"})
    try:
        container.start()
        status = container.wait(timeout=INTROSPECT_TIMEOUT_S)
        output = str(container.logs(stdout=True, stderr=True).decode("utf-8", "replace"))
    finally:
        sandbox.scope.remove(container)
    if status.get("StatusCode") != 0:
        raise BuildError("the image's vLLM could not list its flags", found=f"exit code {status.get('StatusCode')}",
                         hint="package.flags: static reads them from the source instead",
                         log_tail=output.splitlines()[-20:])
    log("  listed the serving flags with the image's own vLLM parser")
    return output


def _read_sources(state: Overlay, site: str) -> dict[str, str]:
    sources: dict[str, str] = {}
    for rel in STATIC_FILES:
        data = state.read(f"{site.rstrip('/')}/{rel}")
        if data is not None:
            sources[rel] = data.decode("utf-8", "replace")
    return sources


def learn_flags(manifest: Manifest, target_name: str, *, environ: Mapping[str, str],
                log: Log = _stderr) -> FlagTable | None:
    """The target's flags after its parser steps, from the cache or learnt now (None: ``package.flags: off``)."""
    from ..docker_engine import daemon_errors
    from ..patches.check import check_steps, image_session, script_sandbox

    target = manifest.target(target_name)
    method = flag_method(target)
    if method == "off":
        return None
    with image_session(manifest, target.name, None, environ=environ, log=log) as s, \
            daemon_errors("learning the serving flags"):
        steps = parser_steps(s.shared)
        key = flags_key(s.base_id, steps, environ)
        index = index_key(target, environ)
        table = _load(_cache_file(key, method, environ))
        if table is None:
            with script_sandbox(s.base_id, s.target, environ) as sandbox:
                rows, state = check_steps(steps, {}, s.fs, s.site, run_script=sandbox)
                bad = [r for r in rows if not r.ok]
                if bad:
                    raise BuildError(
                        f"cannot learn the serving flags of target {target.name!r}: a step before them fails",
                        found="; ".join(f"{r.step}: {r.status}" for r in bad),
                        hint=f"`invoke check-patches --target {target.name}` shows why")
                if method == "static":
                    sources = _read_sources(state, s.site)
                    after = f" after step {steps[-1].id}" if steps else ""
                    table = read_static(sources, label=f"the vLLM {s.version} parser source{after}")
                    if not len(table):
                        raise BuildError(f"no serving flags found in the parser files of target {target.name!r}",
                                         found=", ".join(sources) or "none of " + ", ".join(STATIC_FILES),
                                         hint=f"set targets.{target.name}.package.flags: introspect or off")
                else:
                    table = parse_introspection(_introspect(sandbox, _image_after(sandbox, state), log))
        store_flags(table, key=key, base_id=s.base_id, method=method, index=index, environ=environ)
        return table


def flags_of_state(target: Target, *, base_id: str, version: str, site: str, steps: Sequence[Step],
                   sandbox: ScriptSandbox, state: Overlay, environ: Mapping[str, str], store: bool = True,
                   log: Log = _stderr) -> FlagTable | None:
    """Preflight's flags: the table cached for these parser steps, else learnt from a state the caller already
    built with ``sandbox`` (no second run of the scripts). ``store=False`` for a state that is not what the steps
    build (a script failed part-way: the parser as the platform would get it, not a table to cache)."""
    method = flag_method(target)
    if method == "off":
        return None
    key = flags_key(base_id, parser_steps(steps), environ)
    table = _load(_cache_file(key, method, environ)) if store else None
    if table is None:
        if method == "static":
            table = read_static(_read_sources(state, site), label=f"the vLLM {version} parser source after the steps")
        else:
            table = parse_introspection(_introspect(sandbox, _image_after(sandbox, state), log))
        if store:
            store_flags(table, key=key, base_id=base_id, method=method, index=index_key(target, environ),
                        environ=environ)
    return table


def target_problems(manifest: Manifest, name: str, table: FlagTable,
                    environ: Mapping[str, str] | None = None) -> list[Problem]:
    """The target's serving args (and every profile's) against ``table``, as ``validate`` checks them."""
    return _target_problems(manifest, name, table, environ)


# --------------------------------------------------------------------------- the checks the front door calls


def _suite(target: Target, environ: Mapping[str, str] | None = None) -> list[ServingArg]:
    """The model names the target's smoke suite calls, with their lines.

    Cached by the suite's bytes under ``<cache>/flags/suites/`` (a no-op build reads one small JSON file);
    a new suite is read with libyaml's C parser (:func:`~imageforge.manifest.yamldoc.load_yaml_c`), not the
    position-tracking Python loader, which ``smoke`` itself uses to report the suite's problems.
    """
    path = target.smoke.suite
    if path is None:
        return []
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    entry = flags_cache_dir(environ) / "suites" / f"{sha256_bytes(raw)[:32]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return [ServingArg(str(a["key"]), a["value"], Location(str(path), a["line"], a["column"]), str(a["key_path"]),
                           f"{path.name}: {a['key_path']}") for a in json.loads(entry.read_text())]
    try:
        args = suite_models(load_yaml_c(path, what="smoke suite"))
    except (ConfigError, OSError):
        return []  # smoke reports the suite's own problems
    rows = [{"key": a.key, "value": a.value, "line": a.location.line if a.location else None,
             "column": a.location.column if a.location else None, "key_path": a.key_path} for a in args]
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps(rows))
    return args


def _raise(problems: Sequence[Problem]) -> None:
    ErrorCollector(list(problems)).raise_if_any("serving flags do not match the image's vLLM")


def _target_problems(manifest: Manifest, name: str, table: FlagTable,
                     environ: Mapping[str, str] | None = None) -> list[Problem]:
    target = manifest.targets[name]
    return check_serving_args(serving_args_of_target(manifest, name), table, run_port=run_port_of(manifest, name),
                              suite=_suite(target, environ))


def check_validate(manifest: Manifest, environ: Mapping[str, str]) -> list[str]:
    """``validate``: every target against its cached flags (ConfigError on a problem); notes for the rest."""
    problems: list[Problem] = []
    notes: list[str] = []
    for name, target in manifest.targets.items():
        if flag_method(target) == "off":
            continue
        table = cached_flags(target, environ)
        if table is None:
            notes.append(f"target {name}: {NOT_CHECKED}")
            continue
        problems.extend(_target_problems(manifest, name, table, environ))
        notes.append(f"target {name}: serving flags checked against {table.source} (cached)")
    _raise(problems)
    return notes


def check_target(manifest: Manifest, name: str | None, environ: Mapping[str, str], log: Log = _stderr) -> None:
    """``check-patches``: the target's args and every profile's, against flags learnt now (or cached)."""
    target = manifest.target(name)
    table = learn_flags(manifest, target.name, environ=environ, log=log)
    if table is not None:
        _raise(_target_problems(manifest, target.name, table, environ))


def check_resolved(resolved: Resolved, environ: Mapping[str, str], *, use_daemon: bool = True,
                   log: Log = _stderr) -> str | None:
    """``plan``/``build``/``submission``: the resolved args (``--set`` included) before any build work.

    Without the daemon (``plan --no-daemon``), or when the base cannot be read yet (not loaded, not
    made, a ``${VAR}`` unset), the cached table is used as ``validate`` does; returns a note then.
    """
    manifest, target = resolved.manifest, resolved.target
    if flag_method(target) == "off":
        return None
    table: FlagTable | None = None
    note: str | None = None
    hit = cached_entry(target, environ) if use_daemon else None
    if hit is not None and _base_confirmed(target, hit, environ):
        table = hit.table  # a flag-cache hit: no daemon set-up, no container
    elif use_daemon:
        try:
            table = learn_flags(manifest, target.name, environ=environ, log=log)
        except (InfraError, BuildError) as exc:  # no base yet, a ${VAR} unset, a step that does not apply
            note = exc.message
    if table is None:
        table = cached_flags(target, environ)
        if table is None:
            return f"target {target.name}: {NOT_CHECKED}" + (f" ({note})" if note else "")
    _raise(_target_problems(manifest, target.name, table, environ))  # the whole target, as validate checks it
    problems = check_serving_args(serving_args_of_resolved(resolved), table,
                                  run_port=run_port_of(manifest, target.name), suite=_suite(target, environ))
    _raise(problems)
    return None


__all__ = [
    "NOT_CHECKED",
    "PARSER_FILES",
    "CachedFlags",
    "cached_entry",
    "cached_flags",
    "changes_parser",
    "check_resolved",
    "check_target",
    "check_validate",
    "flag_method",
    "flags_key",
    "flags_of_state",
    "index_key",
    "learn_flags",
    "parser_steps",
    "store_flags",
    "table_from_json",
    "table_to_json",
    "target_problems",
]
