"""imageforge's verification, run with the target's own python: in the image (``python -c TEXT SPEC_JSON``) or,
in place, with the target interpreter on the live tree. One program, so both modes give the same verdict.

Standard library only. The spec (argv[1], JSON: :class:`imageforge.verify.VerifySpec`) names the steps' ``.py``
files (their kinds' facts), the ``.py`` files a script step added or changed (``changed``: the layer's diff, or
the journal in place), the live ones among those (``live``: run or imported, :mod:`imageforge.scripts.deadfiles`), the
overlaid files with their sha256, the links and the imports. A changed file under one of the interpreter's
import roots (a ``sys.path`` directory, as the server would import it) is checked like a step's file; one
outside them is compiled (in memory) when it is live, else listed as dead and not compiled. Each checked ``.py``
is recompiled into hash-checked ``.pyc`` files for each optimisation level present (``write: false``: compiled
in memory, the ``.pyc`` only read); a ``.pyc`` that still claims to match by timestamp, an overlay whose bytes
differ, a link that does not resolve (with ``root`` as ``/``) and an import that fails are reported. One line
``IMAGEFORGE-VERIFY {json}`` is the result (``--plan``: the ``.pyc`` files it would write, nothing written). The
submission tree's ``verify.py`` is this text between a prelude (reads the spec from a file) and a tail (fails the
build on a problem; it reads ``out``, ``json`` and ``sys``).
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import json
import os
import py_compile
import sys
import traceback

TYPE_CHECKING = False  # typing is not imported at run time: nothing but what the checks need loads before them
if TYPE_CHECKING:
    from typing import Any

HOME = "/tmp/imageforge-verify-home"
MARK = "IMAGEFORGE-VERIFY "


def pycs(path: str) -> list[str]:
    """The ``.pyc`` files of ``path`` for this interpreter, every optimisation level."""
    d = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0] + "." + sys.implementation.cache_tag
    if not os.path.isdir(d):
        return []
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.startswith(stem) and n.endswith(".pyc")]


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def import_roots(spec: dict[str, Any]) -> list[str]:
    """The directories this interpreter imports from (``sys.path`` and the imports' ``PYTHONPATH``), real paths;
    never the working directory (``python -c`` puts it first)."""
    extra = spec.get("import_env", {}).get("PYTHONPATH", "")
    roots: list[str] = []
    for entry in [*sys.path[1:], *(p for p in extra.split(os.pathsep) if p)]:
        if entry and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if real not in roots and real != "/":
                roots.append(real)
    return roots


def importable(path: str, roots: list[str]) -> bool:
    """Whether ``path`` is a module under an import root (every folder on the way and its name identifiers)."""
    real = os.path.realpath(path)
    for root in roots:
        if real.startswith(root + os.sep):
            parts = real[len(root) + 1:].split(os.sep)
            parts[-1] = os.path.splitext(parts[-1])[0]
            if all(p.isidentifier() for p in parts):
                return True
    return False


def classify(spec: dict[str, Any]) -> dict[str, Any]:
    """The files to check: the steps' ``.py`` files and the changed ones under an import root (recompiled), the
    live changed ones outside them (compiled in memory), the dead ones (listed only)."""
    roots = import_roots(spec)
    python = list(spec["python_files"])
    run: list[str] = []
    dead: list[str] = []
    live = spec.get("live", {})
    for path in spec.get("changed", []):
        if path in python or not os.path.isfile(path):
            continue
        if importable(path, roots):
            python.append(path)
        elif path in live:
            run.append(path)
        else:
            dead.append(path)
    return {"python": python, "run": run, "dead": dead, "roots": roots}


def levels_of(path: str) -> list[int]:
    levels = {0}
    for p in pycs(path):
        levels.add(2 if ".opt-2." in p else 1 if ".opt-1." in p else 0)
    return sorted(levels)


def cfile_of(path: str, level: int) -> str:
    return importlib.util.cache_from_source(path, optimization="" if level == 0 else level)


def plan(spec: dict[str, Any]) -> dict[str, Any]:
    """What :func:`verify` would write: the ``.pyc`` of each file it recompiles, each level present."""
    files = classify(spec)
    return {"pycs": [[path, cfile_of(path, level)] for path in files["python"] if os.path.isfile(path)
                     for level in levels_of(path)], "dead": files["dead"], "run": files["run"]}


def syntax_error(exc: BaseException) -> list[str]:
    return str(getattr(exc, "msg", exc)).strip().splitlines()[-4:]


def check_python(spec: dict[str, Any], files: list[str], out: dict[str, Any]) -> None:
    """Recompile every file (hash-checked ``.pyc``, each level present; in memory without ``write``); then find
    stale ``.pyc``."""
    write = spec.get("write", True)
    for path in files:
        out["checked"]["python"] += 1
        out["python_files"].append(path)
        if not os.path.isfile(path):
            out["missing"].append(path)
            continue
        ok = True
        for level in levels_of(path) if write else [0]:
            cfile = cfile_of(path, level)
            try:
                if write:
                    py_compile.compile(path, cfile=cfile, doraise=True, optimize=level,
                                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
                    out["compiled"].append(cfile)
                else:
                    compile(read_bytes(path), path, "exec", dont_inherit=True)
            except (py_compile.PyCompileError, SyntaxError, ValueError) as exc:
                out["syntax"].append({"path": path, "error": syntax_error(exc)})
                ok = False
                break
        if not ok:
            continue
        digest = importlib.util.source_hash(read_bytes(path))
        for p in pycs(path):
            with open(p, "rb") as f:
                head = f.read(16)
            flags = int.from_bytes(head[4:8], "little")
            if flags & 1:
                if head[8:16] != digest:
                    out["stale"].append({"pyc": p, "why": "hash differs from the source"})
            else:
                mtime, size = int.from_bytes(head[8:12], "little"), int.from_bytes(head[12:16], "little")
                out["stale"].append({"pyc": p, "why": f"timestamp-based pyc (mtime {mtime}, size {size})"})


def check_run(files: list[str], out: dict[str, Any]) -> None:
    """A live file outside the import roots (run or imported by a script): compiled in memory, nothing written."""
    for path in files:
        out["checked"]["run"] += 1
        try:
            compile(read_bytes(path), path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            out["syntax"].append({"path": path, "error": syntax_error(exc)})


def check_overlays(spec: dict[str, Any], out: dict[str, Any]) -> None:
    for path, want in sorted(spec["overlays"].items()):
        out["checked"]["overlays"] += 1
        try:
            got = hashlib.sha256(read_bytes(path)).hexdigest()
        except OSError as exc:
            out["hash"].append({"path": path, "expected": want, "found": str(exc)})
            continue
        if got != want:
            out["hash"].append({"path": path, "expected": want, "found": got})


def resolves(link: str, root: str) -> bool:
    """The link's target exists with ``root`` as ``/`` (in place on a tree under a folder)."""
    current = link
    for _ in range(40):
        if not os.path.islink(current):
            return os.path.exists(current)
        target = os.readlink(current)
        current = os.path.join(root, target.lstrip("/")) if target.startswith("/") else \
            os.path.join(os.path.dirname(current), target)
    return False


def check_link(link: str, root: str, out: dict[str, Any]) -> None:
    out["checked"]["symlinks"] += 1
    if not os.path.islink(link) or not resolves(link, root):
        out["symlinks"].append({"link": link, "target": os.readlink(link) if os.path.islink(link) else None})


def check_links(spec: dict[str, Any], out: dict[str, Any]) -> None:
    root = spec.get("root", "/")
    for link in spec["links"]:
        check_link(link, root, out)
    for g in spec["link_globs"]:
        for src in sorted(glob.glob(g["glob"])):
            check_link(os.path.join(g["into"], os.path.basename(src)), root, out)


def imports_reused(spec: dict[str, Any], out: dict[str, Any]) -> bool:
    """Whether the imports passed on this content before (then they are not redone).

    What the imports depend on besides the base: the bytes of every file a step changed (the host's context
    holds the base ID, the script steps, links and env).
    """
    if not spec.get("context"):  # the engine's build (the submission tree's copy has no imports to reuse)
        return False
    h = hashlib.sha256(spec["context"].encode())
    for path in sorted(set(spec["python_files"]) | set(spec["overlays"])):
        try:
            h.update(f"{path}\0{hashlib.sha256(read_bytes(path)).hexdigest()}\n".encode())
        except OSError:
            h.update(f"{path}\0missing\n".encode())
    out["content"] = h.hexdigest()
    reuse = out["content"] in spec.get("verified", ())
    if reuse:
        out["reused"] = out["content"]
    return bool(reuse)


def check_imports(spec: dict[str, Any], out: dict[str, Any], reuse: bool) -> None:
    for name in ([] if reuse else spec["imports"]):
        out["checked"]["imports"] += 1
        try:
            importlib.import_module(name)
        except BaseException as exc:
            out["imports"].append({"module": name, "error": f"{type(exc).__name__}: {exc}",
                                   "trace": traceback.format_exc().strip().splitlines()[-6:]})


def verify(spec: dict[str, Any]) -> dict[str, Any]:
    """Every check of ``spec``, in a scratch HOME (removed after); the result ``out``."""
    files = classify(spec)  # before the environment changes below
    os.makedirs(HOME, exist_ok=True)
    # TMPDIR too: torch's inductor cache (tempfile.gettempdir()/torchinductor_<user>) then lands in HOME,
    # which is removed below, instead of staying in the image's /tmp.
    os.environ.update({"HOME": HOME, "XDG_CACHE_HOME": HOME, "TMPDIR": HOME, "VLLM_NO_USAGE_STATS": "1",
                       "DO_NOT_TRACK": "1"})
    import tempfile  # here, after sys.dont_write_bytecode: the check writes no .pyc of its own

    tempfile.tempdir = None
    os.environ.update(spec["import_env"])
    out: dict[str, Any] = {"compiled": [], "syntax": [], "missing": [], "stale": [], "hash": [], "symlinks": [],
                           "imports": [], "python_files": [], "run": files["run"], "dead": files["dead"],
                           "checked": {"python": 0, "run": 0, "overlays": 0, "symlinks": 0, "imports": 0}}
    check_python(spec, files["python"], out)
    check_run(files["run"], out)
    check_overlays(spec, out)
    check_links(spec, out)
    check_imports(spec, out, imports_reused(spec, out))
    import shutil  # (as tempfile)

    shutil.rmtree(HOME, ignore_errors=True)
    if spec.get("image", True):  # an image's /tmp is the layer's; in place, /tmp is the machine's (a server's)
        for leftover in glob.glob("/tmp/torchinductor_*"):  # made before TMPDIR took effect (e.g. by a .pth hook)
            shutil.rmtree(leftover, ignore_errors=True)
    return out


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    if sys.argv[1] == "--plan":
        print(MARK + json.dumps(plan(json.loads(sys.argv[2]))), flush=True)
    else:
        out = verify(json.loads(sys.argv[1]))
        print(MARK + json.dumps(out), flush=True)
