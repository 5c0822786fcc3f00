"""Verify a built image before any tag moves: one container run with the image's own Python.

Checks, in order:

1. every changed ``.py`` compiles (``py_compile``), and is recompiled into hash-checked
   ``.pyc`` files for each optimisation level present -- so no stale bytecode can shadow a
   patch, even a same-size patch that kept the file's mtime;
2. no ``.pyc`` of a changed file still claims to match it by timestamp while holding old code;
3. the sha256 of every overlaid file in the image equals its source;
4. every symlink made by a step resolves;
5. the target's listed modules import -- only with ``build --verify-imports`` (``check_imports``): by default
   the first server start proves them (importing vLLM is its own start-up, 10-30 s), and a start that fails
   names the step that wrote the failing file (:mod:`imageforge.serve.startfail`).

The container's file changes (the fresh ``.pyc`` files) become the verify layer; its
summary is recorded as a label, so an all-HIT build skips verification. Whether the imports passed is a fact
about the content (:func:`verify_context` + the changed files' bytes), kept on the host: a build with the
imports checked, or a server start that reached ``/health``, records it; content recorded before is not
imported again ("imports REUSED").
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .blame import Blame, diagnose, trace_tail
from .docker_engine.containers import process_overrides
from .errors import BuildError
from .inimage import program
from .labels import L_KIND, L_STEP, L_VERIFIED
from .manifest.model import Step, Target
from .plan import Plan
from .settings import cache_dir
from .steps import kind

if TYPE_CHECKING:
    from .base import PackageInfo
    from .docker_engine.containers import Containers

MARK = "IMAGEFORGE-VERIFY "
AT_FIRST_START = "at first start"

#: The checks, run in the image: ``python -c IN_IMAGE SPEC_JSON`` (the program :mod:`imageforge.inimage.verify_image`).
IN_IMAGE = program("verify_image")


@dataclass(frozen=True)
class VerifySpec:
    python_files: tuple[str, ...]
    overlays: Mapping[str, str]
    links: tuple[str, ...]
    link_globs: tuple[Mapping[str, str], ...]
    imports: tuple[str, ...]
    import_env: Mapping[str, str]
    context: str = ""  # verify_context: what the imports depend on besides the changed files' bytes
    verified: tuple[str, ...] = ()  # contents whose imports passed before (verified_contents)
    check_imports: bool = True  # False: the imports are left to the first server start (build's default)
    changed: tuple[str, ...] = ()  # .py files a script step added or changed (the layer's diff; the journal)
    live: Mapping[str, str] = field(default_factory=dict)  # of those outside the import roots: run or imported, why

    def to_json(self, root: str = "/", *, write: bool = True) -> dict[str, Any]:
        """The program's spec; ``root``: the image's ``/`` on this machine (in place), every path under it;
        ``write``: recompile into ``.pyc`` (else compile in memory: a check of a tree already verified)."""
        at = _under(root)
        return {"python_files": [at(p) for p in self.python_files],
                "overlays": {at(p): h for p, h in self.overlays.items()},
                "links": [at(p) for p in self.links],
                "link_globs": [{"glob": at(g["glob"]), "into": at(g["into"])} for g in self.link_globs],
                "imports": list(self.imports) if self.check_imports else [], "import_env": dict(self.import_env),
                "changed": [at(p) for p in self.changed], "live": {at(p): why for p, why in self.live.items()},
                "root": root, "write": write, "image": root == "/" and write,
                **({"context": self.context, "verified": list(self.verified)} if self.context else {})}


def _under(root: str) -> Callable[[str], str]:
    if root == "/":
        return lambda p: p
    return lambda p: root.rstrip("/") + "/" + p.lstrip("/")


# --------------------------------------------------------------------------- verification facts by content


def verify_context(plan: Plan, base_id: str, python: str, spec: VerifySpec,
                   environ: Mapping[str, str] | None = None) -> str:
    """What an import result depends on besides the bytes of the files the steps changed.

    The base image ID (every file no step wrote), the interpreter, the imports and their environment, the
    links, and every script step (definition and input digests: a script can change anything). The image
    adds the sha256 of each changed ``.py`` and overlaid file; the digest of both is the content verified.
    """
    from .plan import canonical, sha256_bytes, step_inputs

    scripts = [[p.step.definition(), step_inputs(p.step, environ)] for p in plan.steps
               if p.step is not None and kind(p.step.kind).runs_process]
    return sha256_bytes(canonical({
        "base": base_id, "python": python, "imports": list(spec.imports), "import_env": dict(spec.import_env),
        "links": list(spec.links), "link_globs": [dict(g) for g in spec.link_globs], "scripts": scripts,
    }).encode())


def _facts_file() -> Path:
    return cache_dir() / "verify" / "imports-passed.txt"


def verified_contents() -> tuple[str, ...]:
    """The contents (see :func:`verify_context`) whose imports passed on this host: in a build that checked them,
    or in a server start that reached ``/health`` (:func:`record_started`)."""
    try:
        return tuple(sorted(set(_facts_file().read_text().split())))
    except OSError:
        return ()


def record_verified(content: str) -> None:
    """Remember that the imports passed on ``content`` (one line; concurrent builds append whole lines)."""
    with contextlib.suppress(OSError):
        _facts_file().parent.mkdir(parents=True, exist_ok=True)
        with _facts_file().open("a") as f:
            f.write(content + "\n")


def verified_label_content(labels: Mapping[str, str] | None) -> str | None:
    """The content digest an image's verify label names (its verify layer's, inherited by the final image)."""
    raw = (labels or {}).get(L_VERIFIED)
    if not raw:
        return None
    try:
        content = json.loads(raw).get("content")
    except (ValueError, AttributeError):
        return None
    return str(content) if content else None


def record_started(labels: Mapping[str, str] | None) -> str | None:
    """A server of an image with these labels reached ``/health``: its imports passed (vLLM imported them on
    the way); the content is recorded as verified (a later ``build --verify-imports`` says REUSED). The
    content, or None (not an imageforge image, or recorded before)."""
    content = verified_label_content(labels)
    if content is None or content in verified_contents():
        return None
    record_verified(content)
    return content


def verify_facts(steps: Sequence[tuple[Step, Mapping[str, str]]], target: Target, site: str,
                 changed: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> VerifySpec:
    """What to verify, one definition for the image and in place: each step kind's facts (``steps``: each step
    with its input digests), the ``.py`` files script steps added or changed (``changed``, image paths: the
    layers' diffs or the journal), and which of the directory script steps' files their commands run or import
    (the kind's ``live_files``, by :mod:`imageforge.scripts.deadfiles`: the dead-file rule; the in-image program
    compiles a changed file outside the import roots only when it is live, and lists the others as dead)."""
    python_files: set[str] = set()
    overlays: dict[str, str] = {}
    links: list[str] = []
    link_globs: list[dict[str, str]] = []
    live: dict[str, str] = {}
    for step, inputs in steps:
        facts = kind(step.kind).facts(step, inputs, site)
        python_files.update(facts.python_files)
        overlays.update(facts.overlays)
        links.extend(facts.links)
        link_globs.extend(dict(g) for g in facts.link_globs)
        live.update(kind(step.kind).live_files(step, environ or {}))
    extra = sorted(set(changed) - python_files)
    return VerifySpec(tuple(sorted(python_files)), overlays, tuple(links), tuple(link_globs),
                      target.verify.imports, target.verify.import_env, changed=tuple(extra),
                      live={p: w for p, w in sorted(live.items())})


def verify_spec(plan: Plan, site: str, changed: Iterable[str] = (),
                environ: Mapping[str, str] | None = None) -> VerifySpec:
    """:func:`verify_facts` of a plan's steps (cached steps included)."""
    steps = [(p.step, p.inputs) for p in plan.steps if p.step is not None]
    return verify_facts(steps, plan.resolved.target, site, changed, environ)


# --------------------------------------------------------------------------- what script steps changed (labels)


def changed_label(step_id: str) -> str:
    """The label a script step's layer carries: the ``.py`` files it added or changed (its diff)."""
    return f"{L_STEP}.{step_id}.changed-py"


def encode_changed(paths: Iterable[str]) -> str:
    """The label's value: the sorted paths, JSON, zlib, base64 (a pip install adds thousands of paths)."""
    return base64.b64encode(zlib.compress(json.dumps(sorted(set(paths))).encode(), 9)).decode()


def changed_of_labels(labels: Mapping[str, str] | None) -> tuple[str, ...]:
    """Every ``.py`` file the script steps of an image's chain added or changed (the labels it inherited)."""
    out: set[str] = set()
    for key, value in (labels or {}).items():
        if key.startswith(L_STEP + ".") and key.endswith(".changed-py"):
            out.update(json.loads(zlib.decompress(base64.b64decode(value))))
    return tuple(sorted(out))


def changed_py(diff: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ``.py`` files of a container's diff (``docker diff``: Kind 0 changed, 1 added, 2 deleted)."""
    return sorted(str(d["Path"]) for d in diff
                  if d.get("Kind") in (0, 1) and str(d["Path"]).endswith(".py") and "/__pycache__/" not in d["Path"])


@dataclass
class VerifyReport:
    container: Any
    result: dict[str, Any]
    seconds: float
    failures: list[str] = field(default_factory=list)
    checked_imports: bool = True  # False: left to the first server start

    @property
    def reused(self) -> str | None:
        """The content digest whose imports passed before (they were not run again), else None."""
        value = self.result.get("reused")
        return str(value) if value else None

    @property
    def imports(self) -> str:
        """What the imports are: ``checked`` here, ``reused`` (passed before on this content), ``at first start``."""
        return "reused" if self.reused else "checked" if self.checked_imports else AT_FIRST_START

    def summary(self) -> dict[str, Any]:
        v = verdict(self.result)
        return {"ok": not self.failures, "checked": self.result.get("checked", {}), "dead": v["dead"],
                "run": v["run"], "python_digest": v["python_digest"],
                "recompiled": len(self.result.get("compiled", [])), "seconds": round(self.seconds, 1),
                "content": self.result.get("content"), "imports_reused": bool(self.reused), "imports": self.imports}

    def text(self) -> str:
        c = self.result.get("checked", {})
        imports = (f"imports REUSED (content {self.reused[:12]} verified before)" if self.reused
                   else f"{c.get('imports', 0)} imports ok" if self.checked_imports
                   else "imports: at first start (not checked at build; --verify-imports checks them)")
        dead = self.result.get("dead", [])
        return (f"{c.get('python', 0)} .py recompiled/checked, "
                + (f"{c.get('run', 0)} run by a script compiled, " if c.get("run") else "")
                + (f"{len(dead)} dead (listed, not compiled: {', '.join(dead[:3])}{' ...' if len(dead) > 3 else ''}), "
                   if dead else "")
                + f"{c.get('overlays', 0)} overlay hashes, {c.get('symlinks', 0)} links, {imports} "
                f"({self.seconds:.1f}s)")


def failures_of(result: Mapping[str, Any], steps: Sequence[Step] = ()) -> list[str]:
    """One line per problem; a failed import says where its traceback ends and which of ``steps`` wrote that file."""
    out: list[str] = []
    for item in result.get("missing", []):
        out.append(f"changed file missing in the image: {item}")
    for item in result.get("syntax", []):
        out.append(f"{item['path']} does not compile: " + " / ".join(item["error"]))
    for item in result.get("stale", []):
        out.append(f"stale bytecode {item['pyc']}: {item['why']}")
    for item in result.get("hash", []):
        out.append(f"{item['path']} sha256 {str(item['found'])[:16]} != source {item['expected'][:16]}")
    for item in result.get("symlinks", []):
        out.append(f"symlink {item['link']} -> {item['target']} does not resolve")
    for item in result.get("imports", []):
        blame = diagnose(trace_tail(item.get("trace", [])), steps)
        out.append(f"import {item['module']} failed: {item['error']}" + (f" ({blame.where()})" if blame else ""))
    return out


def verdict(result: Mapping[str, Any], root: str = "/", steps: Sequence[Step] = ()) -> dict[str, Any]:
    """The program's result as a verdict in image paths, the same shape in both modes (image and in place): ok,
    the counts checked, the digest of the ``.py`` files checked, the live files compiled, the dead ones listed,
    and one line per problem."""
    strip = len(root.rstrip("/")) if root != "/" else 0
    def image(path: str) -> str:
        return path[strip:] if strip else path

    checked = sorted(image(p) for p in result.get("python_files", []))
    problems = failures_of(result, steps)
    return {"ok": not problems, "checked": dict(result.get("checked", {})),
            "python_digest": hashlib.sha256("\n".join(checked).encode()).hexdigest(),
            "run": sorted(image(p) for p in result.get("run", [])),
            "dead": sorted(image(p) for p in result.get("dead", [])),
            "problems": [line.replace(root.rstrip("/") + "/", "/") if strip else line for line in problems]}


def _import_blame(result: Mapping[str, Any], steps: Sequence[Step]) -> Blame | None:
    """The first failed import that a step's file explains, for the error's location."""
    for item in result.get("imports", []):
        blame = diagnose(trace_tail(item.get("trace", [])), steps)
        if blame is not None and blame.step is not None:
            return blame
    return None


def verify_image(scope: Containers, parent: str, parent_config: Mapping[str, Any], target: Target, info: PackageInfo,
                 spec: VerifySpec, *, log: Callable[[str], None], verbose: bool,
                 steps: Sequence[Step] = ()) -> VerifyReport:
    """Run the checks in a container from ``parent``; raise BuildError (no tag moves) on failure, at the step that
    wrote the file a failed import's traceback ends in (of ``steps``, the plan's)."""
    import time

    t0 = time.monotonic()
    argv = [info.python, "-c", IN_IMAGE, json.dumps(spec.to_json())]
    container = scope.create(parent, labels={L_KIND: "verify"}, **process_overrides(parent_config, argv))
    container.start()
    status = container.wait(timeout=900)
    output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    if verbose:
        for line in output.splitlines():
            if not line.startswith(MARK):
                log(f"    | {line}")
    lines = [ln for ln in output.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise BuildError(
            "verification did not finish",
            found=f"exit code {status.get('StatusCode')}",
            hint="the image's python3 may be broken; run it by hand",
            log_tail=output.splitlines()[-30:],
        )
    result: dict[str, Any] = json.loads(lines[-1][len(MARK):])
    report = VerifyReport(container, result, time.monotonic() - t0, failures_of(result, steps),
                          checked_imports=spec.check_imports)
    if not report.failures and result.get("content") and not report.reused and spec.context and spec.check_imports:
        record_verified(str(result["content"]))
    if report.failures:
        blamed = _import_blame(result, steps)
        raise BuildError(
            f"verification of target {target.name!r} failed ({len(report.failures)} problem(s)); no tag moved",
            location=blamed.step.location if blamed and blamed.step else None,
            key_path=blamed.step.key_path if blamed and blamed.step else None,
            problems=(),
            hint="fix the step that changed the file; `invoke build -v` shows the container's output",
            log_tail=report.failures + [ln for ln in output.splitlines() if not ln.startswith(MARK)][-10:],
        )
    return report
