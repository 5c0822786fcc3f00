"""imageforge's verification, run inside the image with its own python (``python -c TEXT SPEC_JSON``).

Standard library only. The spec (argv[1], JSON: :class:`imageforge.verify.VerifySpec`) names the changed ``.py``
files, the overlaid files with their sha256, the links and the imports. Each changed ``.py`` is recompiled into
hash-checked ``.pyc`` files for each optimisation level present; a ``.pyc`` that still claims to match by timestamp,
an overlay whose bytes differ, a link that does not resolve and an import that fails are reported. One line
``IMAGEFORGE-VERIFY {json}`` is the result. The submission tree's ``verify.py`` is this text between a prelude
(reads the spec from a file) and a tail (fails the build on a problem; it reads ``out``, ``json`` and ``sys``).
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


def check_python(spec: dict[str, Any], out: dict[str, Any]) -> None:
    """Recompile every changed ``.py`` (hash-checked ``.pyc``, each level present); then find stale ``.pyc``."""
    for path in spec["python_files"]:
        out["checked"]["python"] += 1
        if not os.path.isfile(path):
            out["missing"].append(path)
            continue
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
                out["syntax"].append({"path": path, "error": str(exc.msg).strip().splitlines()[-4:]})
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


def check_link(link: str, out: dict[str, Any]) -> None:
    out["checked"]["symlinks"] += 1
    if not os.path.islink(link) or not os.path.exists(link):
        out["symlinks"].append({"link": link, "target": os.readlink(link) if os.path.islink(link) else None})


def check_links(spec: dict[str, Any], out: dict[str, Any]) -> None:
    for link in spec["links"]:
        check_link(link, out)
    for g in spec["link_globs"]:
        for src in sorted(glob.glob(g["glob"])):
            check_link(os.path.join(g["into"], os.path.basename(src)), out)


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
    os.makedirs(HOME, exist_ok=True)
    # TMPDIR too: torch's inductor cache (tempfile.gettempdir()/torchinductor_<user>) then lands in HOME,
    # which is removed below, instead of staying in the image's /tmp.
    os.environ.update({"HOME": HOME, "XDG_CACHE_HOME": HOME, "TMPDIR": HOME, "VLLM_NO_USAGE_STATS": "1",
                       "DO_NOT_TRACK": "1"})
    import tempfile  # here, after sys.dont_write_bytecode: the check writes no .pyc of its own

    tempfile.tempdir = None
    os.environ.update(spec["import_env"])
    out: dict[str, Any] = {"compiled": [], "syntax": [], "missing": [], "stale": [], "hash": [], "symlinks": [],
                           "imports": [], "checked": {"python": 0, "overlays": 0, "symlinks": 0, "imports": 0}}
    check_python(spec, out)
    check_overlays(spec, out)
    check_links(spec, out)
    check_imports(spec, out, imports_reused(spec, out))
    import shutil  # (as tempfile)

    shutil.rmtree(HOME, ignore_errors=True)
    for leftover in glob.glob("/tmp/torchinductor_*"):  # made before TMPDIR took effect (e.g. by a .pth hook)
        shutil.rmtree(leftover, ignore_errors=True)
    return out


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    out = verify(json.loads(sys.argv[1]))
    print(MARK + json.dumps(out), flush=True)
