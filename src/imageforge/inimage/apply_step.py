"""imageforge submission runtime: one step op per run, read from the JSON file named by argv[1].

The tail of the submission tree's generated ``apply.py`` (:func:`imageforge.submission.applier.applier_source`),
after :mod:`imageforge.patches.anchored` and :mod:`imageforge.patches.pycheck` verbatim: their ``apply_patch``,
``describe`` and ``check_python`` are this file's globals there (the ``if TYPE_CHECKING:`` import below is left
out of the tree).
Standard library only; every name is ``_``-prefixed so that it cannot meet one of the two modules above.
"""

from __future__ import annotations

import hashlib as _hashlib
import json as _json
import os as _os
import posixpath as _posixpath
import shutil as _shutil
import stat as _stat
import sys as _sys
from fnmatch import fnmatchcase as _fnmatchcase
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # left out of the generated apply.py, where the two modules come first
    from ..patches.anchored import apply_patch, describe
    from ..patches.pycheck import check_python

_FIXED_MTIME = 1577836800  # the engine's fixed mtime for written files (imageforge.docker_engine.containers)


def _fail(step: str, message: str) -> NoReturn:
    _sys.stderr.write(f"imageforge: step {step} failed: {message}\n")
    _sys.stderr.flush()
    raise SystemExit(3)


def _makedirs(directory: str) -> None:
    """Missing parents as the engine's put_archive makes them: 0755, root."""
    missing = []
    while directory and not _os.path.lexists(directory):
        missing.append(directory)
        directory = _posixpath.dirname(directory)
    for d in reversed(missing):
        _os.mkdir(d)
        _os.chmod(d, 0o755)


def _guard(step: str, site: str, path: str) -> None:
    site = site.rstrip("/")
    if not path.startswith(site + "/"):
        return
    current = site
    for part in path[len(site) + 1:].split("/")[:-1]:
        current = current + "/" + part
        if not _os.path.lexists(current):
            return
        if _os.path.islink(current):
            _fail(step, f"destination {path} goes through a symbolic link in the image "
                        f"({current} -> {_os.readlink(current)})")


def _op_edit(spec: dict[str, Any], here: str) -> None:
    step, path = spec["step"], spec["path"]
    _guard(step, spec["site"], path)
    if not _os.path.lexists(path):
        _fail(step, f"patch target {path} does not exist in the image")
    if _os.path.islink(path):
        _fail(step, f"{path} is a symbolic link in the image (to {_os.readlink(path)})")
    if not _os.path.isfile(path):
        _fail(step, f"{path} is not a regular file in the image")
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(step, f"{path} is not UTF-8 text: {exc}")
    outcome = apply_patch(text, spec["old"], spec["new"], int(spec["count"]))
    if outcome.status == "already-applied":
        print(f"imageforge: step {step}: already applied: skipped")
        return
    if outcome.result is None:
        _fail(step, f"patch {step!r} does not apply to {path}: {describe(outcome)}")
    _check_python(step, path, outcome.result, spec, outcome.new_lines)
    st = _os.stat(path)
    with open(path, "wb") as fh:  # in place: mode and owner stay; the mtime is put back (as the engine does)
        fh.write(outcome.result.encode("utf-8"))
    _os.utime(path, (int(st.st_mtime), int(st.st_mtime)))
    print(f"imageforge: step {step}: patched {path} at line {', '.join(map(str, outcome.lines))}")


def _check_python(step: str, path: str, text: str, spec: dict[str, Any], lines: tuple[int, ...] | None) -> None:
    """imageforge.patches.pycheck.check_python (embedded above): compiles, parses as the base's Python, names bound."""
    if not path.endswith(".py"):
        return
    problem = check_python(text, path, python_version=spec.get("python_version") or "", lines=lines)
    if problem is not None:
        _fail(step, f"step {step!r} breaks {path}: line {problem.line:d}: {problem.error}\n{problem.context}")


def _op_place(spec: dict[str, Any], here: str) -> None:
    step, path = spec["step"], spec["path"]
    _guard(step, spec["site"], path)
    if path.endswith(".py"):
        with open(_os.path.join(here, spec["source"]), "rb") as fh:
            try:
                source_text = fh.read().decode("utf-8")
            except UnicodeDecodeError as exc:
                _fail(step, f"the source of {path} is not UTF-8 text: {exc}")
        _check_python(step, path, source_text, spec, None)
    if _os.path.isdir(path) and not _os.path.islink(path):
        _fail(step, f"overlay destination {path} is a directory in the image")
    existed = _os.path.lexists(path)
    if existed:
        _os.unlink(path)
    _makedirs(_posixpath.dirname(path))
    _shutil.copyfile(_os.path.join(here, spec["source"]), path)
    _os.chown(path, int(spec["uid"]), int(spec["gid"]))
    _os.chmod(path, int(spec["mode"]))
    _os.utime(path, (_FIXED_MTIME, _FIXED_MTIME))
    print(f"imageforge: step {step}: {'replaced' if existed else 'added'} {path} (mode {spec['mode']:o})")


def _op_link(spec: dict[str, Any], here: str) -> None:
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
            _fail(step, f"symlink glob {spec['glob']} matches nothing in the image")
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
                    _fail(step, f"{link} is a non-empty directory in the image; refusing to replace it with a link")
                _shutil.rmtree(link)
            elif not spec.get("replace"):
                _fail(step, f"{link} already exists in the image (replace: true replaces it)")
            else:
                _os.unlink(link)
        _makedirs(_posixpath.dirname(link))
        _os.symlink(target, link)
        _os.utime(link, (_FIXED_MTIME, _FIXED_MTIME), follow_symlinks=False)
        made += 1
    print(f"imageforge: step {step}: {made:d} link(s) made, {skipped:d} already in place")


def _op_tree(spec: dict[str, Any], here: str) -> None:
    """A directory script step's copied folder, as the engine writes it: dirs 0755, files their host mode, root."""
    dest = spec["dest"]
    for rel, kind, mode in spec["entries"]:
        path = dest if rel == "" else dest + "/" + rel
        if not _os.path.lexists(path):
            _fail(spec["step"], f"{path} is missing after COPY")
        _os.lchown(path, 0, 0)
        if kind != "l":
            _os.chmod(path, int(mode))
        _os.utime(path, (_FIXED_MTIME, _FIXED_MTIME), follow_symlinks=False)
    print(f"imageforge: step {spec['step']}: {len(spec['entries']):d} entries of {dest} set")


def _op_install(spec: dict[str, Any], here: str) -> None:
    """A native step's pinned files: each copied only when its sha256 is its pin (never loaded), mode, root, mtime."""
    step = spec["step"]
    for entry in spec["files"]:
        source, path = _os.path.join(here, entry["source"]), entry["path"]
        with open(source, "rb") as fh:
            digest = _hashlib.sha256(fh.read()).hexdigest()
        if digest != entry["sha256"]:
            _fail(step, f"{entry['source']} has sha256 {digest}, not its pin {entry['sha256']}")
        _guard(step, spec["site"], path)
        if _os.path.isdir(path) and not _os.path.islink(path):
            _fail(step, f"native destination {path} is a directory in the image")
        if _os.path.lexists(path):
            _os.unlink(path)
        _makedirs(_posixpath.dirname(path))
        _shutil.copyfile(source, path)
        _os.chown(path, 0, 0)
        _os.chmod(path, int(entry["mode"]))
        _os.utime(path, (_FIXED_MTIME, _FIXED_MTIME))
        print(f"imageforge: step {step}: installed {path} (sha256 {digest[:12]}, its pin)")


#: The file operations this program knows, by what they do to the tree (a step kind's ``emit`` names the one it
#: needs: this stdlib program cannot import the kinds, and names none of them).
_OPS = {"edit": _op_edit, "place": _op_place, "link": _op_link, "tree": _op_tree, "install": _op_install}


def _main(argv: list[str]) -> None:
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
