"""Verify a built image before any tag moves: one container run with the image's own Python.

Checks, in order:

1. every changed ``.py`` compiles (``py_compile``), and is recompiled into hash-checked
   ``.pyc`` files for each optimisation level present -- so no stale bytecode can shadow a
   patch, even a same-size patch that kept the file's mtime;
2. no ``.pyc`` of a changed file still claims to match it by timestamp while holding old code;
3. the sha256 of every overlaid file in the image equals its source;
4. every symlink made by a step resolves;
5. the target's listed modules import.

The container's file changes (the fresh ``.pyc`` files) become the verify layer; its
summary is recorded as a label, so an all-HIT build skips verification.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .docker_engine.containers import process_overrides
from .errors import BuildError
from .labels import L_KIND
from .manifest import Target
from .plan import Plan
from .settings import cache_dir
from .steps import kind

if TYPE_CHECKING:
    from .base import PackageInfo
    from .docker_engine.containers import Containers

MARK = "IMAGEFORGE-VERIFY "

IN_IMAGE = r'''
import hashlib, glob, importlib, importlib.util, json, os, py_compile, sys, traceback
sys.dont_write_bytecode = True
spec = json.loads(sys.argv[1])
home = "/tmp/imageforge-verify-home"
os.makedirs(home, exist_ok=True)
# TMPDIR too: torch's inductor cache (tempfile.gettempdir()/torchinductor_<user>) then lands in `home`,
# which is removed below, instead of staying in the image's /tmp.
os.environ.update({"HOME": home, "XDG_CACHE_HOME": home, "TMPDIR": home, "VLLM_NO_USAGE_STATS": "1",
                   "DO_NOT_TRACK": "1"})
import tempfile
tempfile.tempdir = None
os.environ.update(spec["import_env"])
out = {"compiled": [], "syntax": [], "missing": [], "stale": [], "hash": [], "symlinks": [], "imports": [],
       "checked": {"python": 0, "overlays": 0, "symlinks": 0, "imports": 0}}
tag = sys.implementation.cache_tag
def pycs(path):
    d = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0] + "." + tag
    if not os.path.isdir(d):
        return []
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.startswith(stem) and n.endswith(".pyc")]
for path in spec["python_files"]:
    out["checked"]["python"] += 1
    if not os.path.isfile(path):
        out["missing"].append(path); continue
    levels = {0}
    for p in pycs(path):
        levels.add(2 if ".opt-2." in p else 1 if ".opt-1." in p else 0)
    ok = True
    for level in sorted(levels):
        cfile = importlib.util.cache_from_source(path, optimization="" if level == 0 else level)
        try:
            py_compile.compile(path, cfile=cfile, doraise=True, optimize=level,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            out["compiled"].append(cfile)
        except py_compile.PyCompileError as exc:
            out["syntax"].append({"path": path, "error": str(exc.msg).strip().splitlines()[-4:]}); ok = False; break
    if not ok:
        continue
    src = open(path, "rb").read()
    digest = importlib.util.source_hash(src)
    st = os.stat(path)
    for p in pycs(path):
        head = open(p, "rb").read(16)
        flags = int.from_bytes(head[4:8], "little")
        if flags & 1:
            if head[8:16] != digest:
                out["stale"].append({"pyc": p, "why": "hash differs from the source"})
        else:
            out["stale"].append({"pyc": p, "why": "timestamp-based pyc (mtime %d, size %d)"
                                 % (int.from_bytes(head[8:12], "little"), int.from_bytes(head[12:16], "little"))})
for path, want in sorted(spec["overlays"].items()):
    out["checked"]["overlays"] += 1
    try:
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
    except OSError as exc:
        out["hash"].append({"path": path, "expected": want, "found": str(exc)}); continue
    if got != want:
        out["hash"].append({"path": path, "expected": want, "found": got})
for link in spec["links"]:
    out["checked"]["symlinks"] += 1
    if not os.path.islink(link) or not os.path.exists(link):
        out["symlinks"].append({"link": link, "target": os.readlink(link) if os.path.islink(link) else None})
for g in spec["link_globs"]:
    for src in sorted(glob.glob(g["glob"])):
        link = os.path.join(g["into"], os.path.basename(src))
        out["checked"]["symlinks"] += 1
        if not os.path.islink(link) or not os.path.exists(link):
            out["symlinks"].append({"link": link, "target": os.readlink(link) if os.path.islink(link) else None})
# What the imports depend on besides the base: the bytes of every file a step changed (the host's context
# holds the base ID, the script steps, links and env). Imports that passed on this content before are not redone.
reuse = False
if spec.get("context"):  # the engine's build (the submission tree's copy has no imports to reuse)
    h = hashlib.sha256(spec["context"].encode())
    for path in sorted(set(spec["python_files"]) | set(spec["overlays"])):
        try:
            h.update(("%s\0%s\n" % (path, hashlib.sha256(open(path, "rb").read()).hexdigest())).encode())
        except OSError:
            h.update(("%s\0missing\n" % path).encode())
    out["content"] = h.hexdigest()
    reuse = out["content"] in spec.get("verified", ())
    if reuse:
        out["reused"] = out["content"]
for name in ([] if reuse else spec["imports"]):
    out["checked"]["imports"] += 1
    try:
        importlib.import_module(name)
    except BaseException as exc:
        out["imports"].append({"module": name, "error": "%s: %s" % (type(exc).__name__, exc),
                               "trace": traceback.format_exc().strip().splitlines()[-6:]})
import shutil
shutil.rmtree(home, ignore_errors=True)
for leftover in glob.glob("/tmp/torchinductor_*"):  # made before TMPDIR took effect (e.g. by a .pth hook)
    shutil.rmtree(leftover, ignore_errors=True)
print("IMAGEFORGE-VERIFY " + json.dumps(out), flush=True)
'''


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

    def to_json(self) -> dict[str, Any]:
        return {"python_files": list(self.python_files), "overlays": dict(self.overlays),
                "links": list(self.links), "link_globs": [dict(g) for g in self.link_globs],
                "imports": list(self.imports), "import_env": dict(self.import_env),
                **({"context": self.context, "verified": list(self.verified)} if self.context else {})}


# --------------------------------------------------------------------------- verification facts by content


def verify_context(plan: Plan, base_id: str, python: str, spec: VerifySpec,
                   environ: Mapping[str, str] | None = None) -> str:
    """What an import result depends on besides the bytes of the files the steps changed (issue 25).

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
    """The contents (see :func:`verify_context`) whose imports passed in an earlier build on this host."""
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


def verify_spec(plan: Plan, site: str) -> VerifySpec:
    """What to verify, derived from the plan alone (cached steps included): each step kind's facts."""
    python_files: set[str] = set()
    overlays: dict[str, str] = {}
    links: list[str] = []
    link_globs: list[dict[str, str]] = []
    for planned in plan.steps:
        step = planned.step
        if step is None:
            continue
        facts = kind(step.kind).facts(step, planned.inputs, site)
        python_files.update(facts.python_files)
        overlays.update(facts.overlays)
        links.extend(facts.links)
        link_globs.extend(dict(g) for g in facts.link_globs)
    target = plan.resolved.target
    return VerifySpec(tuple(sorted(python_files)), overlays, tuple(links), tuple(link_globs),
                      target.verify.imports, target.verify.import_env)


@dataclass
class VerifyReport:
    container: Any
    result: dict[str, Any]
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def reused(self) -> str | None:
        """The content digest whose imports passed before (they were not run again), else None."""
        value = self.result.get("reused")
        return str(value) if value else None

    def summary(self) -> dict[str, Any]:
        return {"ok": not self.failures, "checked": self.result.get("checked", {}),
                "recompiled": len(self.result.get("compiled", [])), "seconds": round(self.seconds, 1),
                "content": self.result.get("content"), "imports_reused": bool(self.reused)}

    def text(self) -> str:
        c = self.result.get("checked", {})
        imports = (f"imports REUSED (content {self.reused[:12]} verified before)" if self.reused
                   else f"{c.get('imports', 0)} imports ok")
        return (f"{c.get('python', 0)} .py recompiled/checked, {c.get('overlays', 0)} overlay hashes, "
                f"{c.get('symlinks', 0)} links, {imports} ({self.seconds:.1f}s)")


def failures_of(result: Mapping[str, Any]) -> list[str]:
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
        out.append(f"import {item['module']} failed: {item['error']}")
    return out


def verify_image(scope: Containers, parent: str, parent_config: Mapping[str, Any], target: Target, info: PackageInfo,
                 spec: VerifySpec, *, log: Callable[[str], None], verbose: bool) -> VerifyReport:
    """Run the checks in a container from ``parent``; raise BuildError (no tag moves) on failure."""
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
    report = VerifyReport(container, result, time.monotonic() - t0, failures_of(result))
    if not report.failures and result.get("content") and not report.reused and spec.context:
        record_verified(str(result["content"]))
    if report.failures:
        raise BuildError(
            f"verification of target {target.name!r} failed ({len(report.failures)} problem(s)); no tag moved",
            problems=(),
            hint="fix the step that changed the file; `invoke build -v` shows the container's output",
            log_tail=report.failures + [ln for ln in output.splitlines() if not ln.startswith(MARK)][-10:],
        )
    return report
