"""The generated, stdlib-only helpers that run during ``docker build`` (the platform's builder may have no device).

``apply.py`` = the source of :mod:`imageforge.patching` and :mod:`imageforge.pycheck` (read with
:func:`inspect.getsource`, so an anchor is counted, and a patched or overlaid ``.py`` checked, by the one
definition the engine and ``check-patches`` use) + a small runtime
that performs one step op read from a JSON file: ``patch``, ``overlay``, ``symlink``, ``tree``
(a directory script step's copied folder: modes, owner, mtime as the engine writes them).  A patch
whose anchor is missing, ambiguous or inside a line, or that breaks a ``.py`` file (it must compile, parse as the
base's Python and bind every name its lines load), fails the build with exit code 3 and the step id.

``verify.py`` = :data:`imageforge.verify.IN_IMAGE` (the engine's verification script) run without
imports: it recompiles every changed ``.py`` into hash-checked ``.pyc`` files exactly as the engine's
verify layer does, checks overlay hashes and symlinks, and fails the build on a problem.  Imports
are not replicated: importing vLLM imports torch, and the platform's builder may have no device.
"""

from __future__ import annotations

import ast
import inspect
import sys

from ..errors import ImageforgeError
from ..verify import IN_IMAGE

FIXED_MTIME = 1577836800  # the engine's fixed mtime for written files (imageforge.build.FIXED_MTIME)

RUNTIME = r'''
# ---------------------------------------------------------------------------------------------------
# imageforge submission runtime: one step op per run, read from the JSON file named by argv[1].
import json as _json
import os as _os
import posixpath as _posixpath
import shutil as _shutil
import stat as _stat
import sys as _sys
from fnmatch import fnmatchcase as _fnmatchcase

_FIXED_MTIME = %(mtime)d


def _fail(step, message):
    _sys.stderr.write("imageforge: step %%s failed: %%s\n" %% (step, message))
    _sys.stderr.flush()
    raise SystemExit(3)


def _makedirs(directory):
    """Missing parents as the engine's put_archive makes them: 0755, root."""
    missing = []
    while directory and not _os.path.lexists(directory):
        missing.append(directory)
        directory = _posixpath.dirname(directory)
    for d in reversed(missing):
        _os.mkdir(d)
        _os.chmod(d, 0o755)


def _guard(step, site, path):
    site = site.rstrip("/")
    if not path.startswith(site + "/"):
        return
    current = site
    for part in path[len(site) + 1:].split("/")[:-1]:
        current = current + "/" + part
        if not _os.path.lexists(current):
            return
        if _os.path.islink(current):
            _fail(step, "destination %%s goes through a symbolic link in the image (%%s -> %%s)"
                  %% (path, current, _os.readlink(current)))


def _op_patch(spec, here):
    step, path = spec["step"], spec["path"]
    _guard(step, spec["site"], path)
    if not _os.path.lexists(path):
        _fail(step, "patch target %%s does not exist in the image" %% path)
    if _os.path.islink(path):
        _fail(step, "%%s is a symbolic link in the image (to %%s)" %% (path, _os.readlink(path)))
    if not _os.path.isfile(path):
        _fail(step, "%%s is not a regular file in the image" %% path)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(step, "%%s is not UTF-8 text: %%s" %% (path, exc))
    outcome = apply_patch(text, spec["old"], spec["new"], int(spec["count"]))
    if outcome.status == "already-applied":
        print("imageforge: step %%s: already applied: skipped" %% step)
        return
    if outcome.result is None:
        _fail(step, "patch %%r does not apply to %%s: %%s" %% (step, path, describe(outcome)))
    _check_python(step, path, outcome.result, spec, outcome.new_lines)
    st = _os.stat(path)
    with open(path, "wb") as fh:  # in place: mode and owner stay; the mtime is put back (as the engine does)
        fh.write(outcome.result.encode("utf-8"))
    _os.utime(path, (int(st.st_mtime), int(st.st_mtime)))
    print("imageforge: step %%s: patched %%s at line %%s" %% (step, path, ", ".join(map(str, outcome.lines))))


def _check_python(step, path, text, spec, lines):
    """imageforge.pycheck.check_python (embedded above): compiles, parses as the base's Python, names bound."""
    if not path.endswith(".py"):
        return
    problem = check_python(text, path, python_version=spec.get("python_version") or "", lines=lines)
    if problem is not None:
        _fail(step, "step %%r breaks %%s: line %%d: %%s\n%%s" %% (step, path, problem.line, problem.error,
                                                                problem.context))


def _op_overlay(spec, here):
    step, path = spec["step"], spec["path"]
    _guard(step, spec["site"], path)
    if path.endswith(".py"):
        with open(_os.path.join(here, spec["source"]), "rb") as fh:
            try:
                source_text = fh.read().decode("utf-8")
            except UnicodeDecodeError as exc:
                _fail(step, "the source of %%s is not UTF-8 text: %%s" %% (path, exc))
        _check_python(step, path, source_text, spec, None)
    if _os.path.isdir(path) and not _os.path.islink(path):
        _fail(step, "overlay destination %%s is a directory in the image" %% path)
    existed = _os.path.lexists(path)
    if existed:
        _os.unlink(path)
    _makedirs(_posixpath.dirname(path))
    _shutil.copyfile(_os.path.join(here, spec["source"]), path)
    _os.chown(path, int(spec["uid"]), int(spec["gid"]))
    _os.chmod(path, int(spec["mode"]))
    _os.utime(path, (_FIXED_MTIME, _FIXED_MTIME))
    print("imageforge: step %%s: %%s %%s (mode %%o)" %% (step, "replaced" if existed else "added", path, spec["mode"]))


def _op_symlink(spec, here):
    step = spec["step"]
    if "glob" in spec:
        directory, name_glob = _posixpath.split(spec["glob"])
        try:
            names = sorted(_os.listdir(directory))
        except OSError:
            names = []
        matches = [n for n in names if _fnmatchcase(n, name_glob)
                   and not _stat.S_ISDIR(_os.lstat(_posixpath.join(directory, n)).st_mode)]
        if not matches:
            _fail(step, "symlink glob %%s matches nothing in the image" %% spec["glob"])
        pairs = [(spec["into"] + "/" + n, directory + "/" + n) for n in matches]
    else:
        pairs = [(spec["link"], spec["target"])]
    made = skipped = 0
    for link, target in pairs:
        if _os.path.lexists(link):
            if _os.path.islink(link) and _os.readlink(link) == target:
                skipped += 1
                continue
            if _os.path.isdir(link) and not _os.path.islink(link):
                if _os.listdir(link) and not spec.get("replace_directory"):
                    _fail(step, "%%s is a non-empty directory in the image; refusing to replace it with a link" %% link)
                _shutil.rmtree(link)
            elif not spec.get("replace"):
                _fail(step, "%%s already exists in the image (replace: true replaces it)" %% link)
            else:
                _os.unlink(link)
        _makedirs(_posixpath.dirname(link))
        _os.symlink(target, link)
        _os.utime(link, (_FIXED_MTIME, _FIXED_MTIME), follow_symlinks=False)
        made += 1
    print("imageforge: step %%s: %%d link(s) made, %%d already in place" %% (step, made, skipped))


def _op_tree(spec, here):
    """A directory script step's copied folder, as the engine writes it: dirs 0755, files their host mode, root."""
    dest = spec["dest"]
    for rel, kind, mode in spec["entries"]:
        path = dest if rel == "" else dest + "/" + rel
        if not _os.path.lexists(path):
            _fail(spec["step"], "%%s is missing after COPY" %% path)
        _os.lchown(path, 0, 0)
        if kind != "l":
            _os.chmod(path, int(mode))
        _os.utime(path, (_FIXED_MTIME, _FIXED_MTIME), follow_symlinks=False)
    print("imageforge: step %%s: %%d entries of %%s set" %% (spec["step"], len(spec["entries"]), dest))


_OPS = {"patch": _op_patch, "overlay": _op_overlay, "symlink": _op_symlink, "tree": _op_tree}


def _main(argv):
    spec_path = _os.path.abspath(argv[1])
    here = _os.path.dirname(spec_path)
    try:
        with open(spec_path, encoding="utf-8") as fh:
            spec = _json.load(fh)
        _OPS[spec["op"]](spec, here)
    finally:
        _shutil.rmtree(here, ignore_errors=True)


if __name__ == "__main__":
    _main(_sys.argv)
'''

VERIFY_PRELUDE = '''# Generated by imageforge: the engine's verification script (imageforge.verify.IN_IMAGE),
# run without imports (importing vLLM imports torch; the platform's builder may have no device).
# Spec: the JSON file argv[1].
import sys
sys.argv[1:] = [open(sys.argv[1], encoding="utf-8").read()]
'''

VERIFY_TAIL = r'''
import shutil as _shutil
_shutil.rmtree("%(stage)s", ignore_errors=True)
_bad = {k: out[k] for k in ("missing", "syntax", "stale", "hash", "symlinks", "imports") if out[k]}
if _bad:
    sys.stderr.write("imageforge: step verify failed: %%s\n" %% json.dumps(_bad))
    raise SystemExit(3)
'''


def _stdlib_only(source: str, what: str) -> None:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level:
            names = ["." * node.level + (node.module or "")]
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and name != "__future__":
                raise ImageforgeError(f"{what} imports {name!r}, which is not in the standard library",
                                      hint="the build-time helpers must run with the image's bare python")


FUTURE = "from __future__ import annotations\n"


def applier_source() -> str:
    from .. import patching, pycheck

    body = inspect.getsource(patching)
    _stdlib_only(body, "imageforge.patching")
    checker = inspect.getsource(pycheck)
    _stdlib_only(checker, "imageforge.pycheck")
    if FUTURE not in body or FUTURE not in checker:  # pragma: no cover - both modules start with it
        raise ImageforgeError("imageforge.patching and imageforge.pycheck must import annotations from __future__")
    head = ("#!/usr/bin/env python3\n"
            "# Generated by imageforge: stdlib only. Below are imageforge.patching and imageforge.pycheck verbatim\n"
            "# (inspect.getsource; pycheck's __future__ line is dropped: patching's, at the top, covers the file):\n"
            "# the one definition of an anchored patch and of a working .py; then the runtime that applies one step.\n")
    text = (head + body.rstrip("\n") + "\n\n\n# " + "-" * 99 + "\n# imageforge.pycheck\n"
            + checker.replace(FUTURE, "", 1).rstrip("\n") + "\n" + RUNTIME % {"mtime": FIXED_MTIME})
    _stdlib_only(text, "the generated apply.py")
    compile(text, "apply.py", "exec")
    return text


def verifier_source(stage: str) -> str:
    text = VERIFY_PRELUDE + IN_IMAGE.strip("\n") + "\n" + VERIFY_TAIL % {"stage": stage}
    _stdlib_only(text, "the generated verify.py")
    compile(text, "verify.py", "exec")
    return text
