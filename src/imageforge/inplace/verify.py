"""Verify in place: the image's verify program (:mod:`imageforge.inimage.verify_image`) run with the target
interpreter on the live tree, with the facts of the same definition (:func:`imageforge.verify.verify_facts`).

What script steps changed comes from the journal (every ``.py`` it holds as a file the steps wrote), as the
layer's diff gives it in an image. The ``.pyc`` files the program will write are asked first (``--plan``) and
journaled before it writes them (write-ahead: revert removes them); a tree verified before is checked without
writing (``write: false``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..inimage import program
from ..inimage.compile_files import MARKER as COMPILE_MARKER
from ..manifest.model import Step, Target
from ..patches.compiled import Compiled
from ..steps import kind
from ..verify import IN_IMAGE, MARK, VerifySpec, failures_of, verdict, verify_facts
from .journal import Journal
from .package import LocalPackage, image_path

VERIFY_STEP = "verify"
#: Problems that stop the verify step itself (its .pyc are undone); the others leave the steps applied.
STOPS = ("missing", "syntax")


def changed_in_journal(journal: Journal, pkg: LocalPackage) -> list[str]:
    """Image paths of the ``.py`` files the journal holds as written by a step (``__pycache__`` left out)."""
    out: list[str] = []
    for key in journal.journaled():
        if key.endswith(".py") and "/__pycache__/" not in key and journal.expected(key)["type"] == "file":
            try:
                out.append(image_path(pkg.root, key))
            except BuildError:
                continue
    return out


def spec_of_root(steps: Sequence[Step], target: Target, pkg: LocalPackage, environ: Mapping[str, str],
                  changed: Sequence[str], *, imports: bool) -> VerifySpec:
    """The verify spec of ``steps`` on this machine (image paths; :meth:`VerifySpec.to_json` puts the root)."""
    spec = verify_facts([(s, kind(s.kind).inputs(s, environ)) for s in steps], target, pkg.site, changed, environ)
    return VerifySpec(spec.python_files, spec.overlays, spec.links, spec.link_globs, spec.imports, spec.import_env,
                      check_imports=imports, changed=spec.changed, live=spec.live)


def run_program(pkg: LocalPackage, environ: Mapping[str, str], args: Sequence[str]) -> dict[str, Any]:
    """The verify program with the target interpreter; its result (BuildError when it gives none)."""
    done = subprocess.run([pkg.python, "-c", IN_IMAGE, *args], env={**environ, "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=900, check=False)
    marks = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
    if not marks:
        raise BuildError("verification did not finish", found=f"exit code {done.returncode}",
                         hint=f"the target interpreter {pkg.python} may be broken; run it by hand",
                         log_tail=(done.stdout + done.stderr).splitlines()[-20:])
    result: dict[str, Any] = json.loads(marks[-1][len(MARK):])
    return result


def compile_sources(pkg: LocalPackage, environ: Mapping[str, str],
                    files: Sequence[tuple[str, str]]) -> Compiled | None:
    """``(path, text)`` pairs compiled by the target interpreter in one call (``inimage/compile_files.py``); None
    when it printed no result (the interpreter could not run it)."""
    with tempfile.TemporaryDirectory(prefix="imageforge-compile-") as tmp:
        listing = Path(tmp) / "files.json"
        listing.write_text(json.dumps([{"path": p, "text": t} for p, t in files]), encoding="utf-8")
        try:
            done = subprocess.run([pkg.python, "-c", program("compile_files"), str(listing)],
                                  env={**environ, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True,
                                  timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return Compiled.from_output(done.stdout, COMPILE_MARKER)


@dataclass(frozen=True)
class InPlaceVerify:
    """The program's result on the root and its verdict (image paths): the report's ``verify``."""

    result: Mapping[str, Any]
    root: str
    seconds: float

    def verdict(self) -> dict[str, Any]:
        return verdict(self.result, self.root)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict()
        c = v["checked"]
        return {"ok": v["ok"], "python": c.get("python", 0), "run": v["run"], "dead": v["dead"],
                "overlays": c.get("overlays", 0), "symlinks": c.get("symlinks", 0), "imports": c.get("imports", 0),
                "problems": v["problems"], "verdict": v,
                "python_files": sorted(_image(p, self.root) for p in self.result.get("python_files", []))}


def _image(path: str, root: str) -> str:
    return path if root == "/" else path[len(root.rstrip("/")):]


def check(pkg: LocalPackage, environ: Mapping[str, str], spec: VerifySpec) -> InPlaceVerify:
    """The checks without writing (a tree whose verify step is applied): .pyc read, sources compiled in memory."""
    t0 = time.monotonic()
    result = run_program(pkg, environ, [json.dumps(spec.to_json(str(pkg.root), write=False))])
    return InPlaceVerify(result, str(pkg.root), time.monotonic() - t0)


def verify_step(journal: Journal, pkg: LocalPackage, environ: Mapping[str, str], spec: VerifySpec,
                key: str) -> InPlaceVerify:
    """The verify step: hash-checked ``.pyc`` for every checked ``.py`` (each level present), journaled first, and
    the checks. A file that is missing or does not compile raises (the step is undone by the caller); other
    problems are in the result (the steps stay applied)."""
    t0 = time.monotonic()
    root = str(pkg.root)
    journal.begin(VERIFY_STEP, key)
    planned = run_program(pkg, environ, ["--plan", json.dumps(spec.to_json(root))])
    made: set[Path] = set()
    for _source, cfile in planned["pycs"]:
        cache = Path(cfile).parent
        journal.note_pycache(cache)
        if not cache.exists() and cache not in made:
            journal.push(cache, VERIFY_STEP, {"type": "dir", "mode": 0o755, "mtime_ns": None})
            made.add(cache)
        journal.push(Path(cfile), VERIFY_STEP, {"type": "file", "sha256": None})
    journal.save()
    result = run_program(pkg, environ, [json.dumps(spec.to_json(root))])
    unplanned = sorted(set(result["compiled"]) - {c for _, c in planned["pycs"]})
    journal.settle(VERIFY_STEP)
    if unplanned:
        raise BuildError("verify wrote .pyc files it had not announced (the tree changed while verifying)",
                         log_tail=unplanned[:20], hint="run apply again")
    stops = {k: result[k] for k in STOPS if result.get(k)}
    if stops:
        raise BuildError("the changed .py files do not compile with the target interpreter",
                         log_tail=failures_of(stops), found=", ".join(sorted(stops)),
                         hint="fix the step that changed the file (check-patches shows each patch); a file a "
                              "script only copies and never runs or imports is listed as dead, not compiled")
    dead = result.get("dead", [])
    journal.complete(VERIFY_STEP, key, f"{len(result['compiled'])} hash-checked .pyc"
                     + (f", {len(dead)} dead file(s) listed" if dead else ""))
    return InPlaceVerify(result, root, time.monotonic() - t0)
