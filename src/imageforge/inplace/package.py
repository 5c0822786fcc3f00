"""The target's package on this machine: :data:`imageforge.base.identity.DISCOVER` run by the *target* interpreter.

Never imageforge's own interpreter: ``--python`` (default ``python3`` on the caller's PATH) with the
caller's environment (its ``PYTHONPATH`` included: on the card's machine that is what finds corex's vLLM).
The same process also reports the interpreter's install scheme (``sysconfig.get_paths()``: ``purelib``,
``platlib``, ``scripts``): where ``pip install`` writes, which a script step names in ``touches:`` as
``{purelib}/...`` (on the card: ``/usr/local/lib/python3.10/site-packages``, transformers' home).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..base.identity import DISCOVER
from ..errors import BuildError, ConfigError, InfraError
from ..manifest.model import Target

#: Appended to the discovery script: the install scheme of the target interpreter, on a line of its own.
SCHEME = r"""
import sysconfig
print("IMAGEFORGE-SCHEME " + json.dumps(sysconfig.get_paths()))
"""
#: The sysconfig paths a ``touches:`` entry may start with (``{purelib}/transformers``).
SCHEME_NAMES = ("purelib", "platlib", "scripts")


@dataclass(frozen=True)
class LocalPackage:
    """The package as the target interpreter sees it; ``site`` is the image path (the root's prefix removed)."""

    root: Path
    python: str
    python_version: str
    cache_tag: str
    version: str
    site: str  # image path of the site directory
    package_dir: str  # image path
    dist_info: str  # host path ("" when unknown)
    scheme: tuple[tuple[str, str], ...] = ()  # (sysconfig name, host path) of SCHEME_NAMES
    python_why: str = ""  # why this interpreter (find_python)

    def host(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def scheme_path(self, name: str) -> str | None:
        """The image path of the interpreter's sysconfig path ``name``; None when it lies outside the root."""
        host = dict(self.scheme).get(name)
        if host is None:
            return None
        try:
            return image_path(self.root, host)
        except BuildError:
            return None

    def expand_scheme(self, pattern: str) -> str:
        """``{purelib}/x`` -> the image path of ``x`` in the interpreter's purelib (other paths as they are)."""
        if not pattern.startswith("{"):
            return pattern
        name, _, rest = pattern[1:].partition("}")
        if name not in SCHEME_NAMES:
            raise ConfigError(f"touches: {pattern!r} names no install path of the interpreter",
                              expected="{" + "}, {".join(SCHEME_NAMES) + "}", found="{" + name + "}")
        base = self.scheme_path(name)
        if base is None:
            raise BuildError(f"touches: {pattern!r}: the interpreter's {name} ({dict(self.scheme).get(name)}) is "
                             f"not under the root {self.root}", hint="give --python the root's own interpreter")
        return base.rstrip("/") + rest if rest else base


@dataclass(frozen=True)
class Interpreter:
    """The target interpreter chosen and why (the apply report says both)."""

    path: str
    why: str


def own_venv_bin(prefix: str | None = None, base_prefix: str | None = None) -> str | None:
    """imageforge's own venv's bin directory, when imageforge runs in a venv (``sys.prefix != sys.base_prefix``);
    None when it is installed into an interpreter of its own (the target's, say): then nothing is skipped."""
    prefix = sys.prefix if prefix is None else prefix
    base_prefix = sys.base_prefix if base_prefix is None else base_prefix
    if os.path.realpath(prefix) == os.path.realpath(base_prefix):
        return None
    return os.path.join(prefix, "bin")


def find_python(python: str, environ: Mapping[str, str], *, own_bin: str | None = None) -> Interpreter:
    """``python`` as a path: a path is used as given (``--python`` overrides); a name is looked up on the caller's
    PATH, skipping imageforge's own venv (``own_bin``, default :func:`own_venv_bin`): an activated venv puts its
    ``python3`` first, which is not the target's. Directories are compared, not resolved executables: a venv's
    ``python3`` is a link to the system one, which may well be the target."""
    if "/" in python:
        return Interpreter(python, "given with --python")
    own = own_venv_bin() if own_bin is None else own_bin
    entries = [d for d in environ.get("PATH", os.defpath).split(os.pathsep) if d]
    skipped = [d for d in entries if own and _same_dir(d, own)]
    kept = [d for d in entries if d not in skipped]
    found = shutil.which(python, path=os.pathsep.join(kept)) if kept else None
    if found is None:
        raise InfraError(f"no {python} on PATH" + (f" outside imageforge's own venv ({own})" if skipped else ""),
                         hint="give the target's interpreter with --python PATH")
    why = f"the first {python} on PATH"
    if skipped:
        why += f", imageforge's own venv ({skipped[0]}) skipped"
    return Interpreter(found, why)


def own_prefixes() -> list[str]:
    """Where imageforge itself is installed: its venv (when it runs in one) and its package's import root."""
    out: list[str] = []
    if sys.prefix != sys.base_prefix:
        out.append(os.path.realpath(sys.prefix))
    package_root = os.path.realpath(str(Path(__file__).resolve().parents[2]))  # the folder holding imageforge/
    out.append(package_root)
    return out


def is_own(entry: str, prefixes: Sequence[str]) -> bool:
    real = os.path.realpath(entry) if entry else ""
    return bool(real) and any(real == p or real.startswith(p.rstrip("/") + "/") for p in prefixes)


def without_own(environ: Mapping[str, str], prefixes: Sequence[str] | None = None) -> dict[str, str]:
    """The caller's environment less imageforge's own venv: what the target's processes get (the script steps in
    place, the server). ``PYTHONPATH`` and ``PATH`` entries inside imageforge's venv or source tree are dropped (the
    box's own ``PYTHONPATH``, e.g. corex's, stays); ``VIRTUAL_ENV`` naming imageforge's venv is dropped too: with
    that venv activated, a script's ``python3 -m pip install`` must reach the target's interpreter, not ours."""
    prefixes = own_prefixes() if prefixes is None else list(prefixes)
    env = dict(environ)
    for name in ("PYTHONPATH", "PATH"):
        if name in env:
            kept = [e for e in env[name].split(os.pathsep) if not is_own(e, prefixes)]
            if kept:
                env[name] = os.pathsep.join(kept)
            else:
                del env[name]
    if env.get("VIRTUAL_ENV") and is_own(env["VIRTUAL_ENV"], prefixes):
        del env["VIRTUAL_ENV"]
    return env


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def image_path(root: Path, host: str) -> str:
    """The image path of a host path under ``root`` (BuildError when it is outside)."""
    real_root = str(root.resolve())
    if real_root == "/":
        return host
    if host == real_root or host.startswith(real_root + "/"):
        return host[len(real_root):] or "/"
    raise BuildError(f"the target interpreter's package is at {host}, outside the root {real_root}",
                     hint="give the interpreter that lives in the root (--python), or --root /")


def discover_local(target: Target, root: Path, python: str, environ: Mapping[str, str], *,
                   check_version: bool = True) -> LocalPackage:
    pkg = target.package
    chosen = find_python(python, environ)
    exe = chosen.path
    try:
        done = subprocess.run([exe, "-c", DISCOVER + SCHEME, pkg.distribution, pkg.import_name], env=dict(environ),
                              capture_output=True, text=True, timeout=120, check=False)
    except OSError as exc:
        raise InfraError(f"cannot run the target interpreter {exe}", found=str(exc),
                         hint="give it with --python PATH") from None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BuildError(f"could not read the installed {pkg.distribution} with {exe}",
                         found=f"exit code {done.returncode}", log_tail=(done.stdout + done.stderr).splitlines()[-20:])
    data = json.loads(lines[-1])
    if "error" in data:
        raise BuildError(data["error"] + f" for {exe}", hint=f"is targets.{target.name}.package.distribution right, "
                         "and --python the target's interpreter?")
    if not data.get("exists"):
        raise BuildError(f"package directory {data['package_dir']} does not exist",
                         hint=f"is targets.{target.name}.package.import right?")
    if check_version and pkg.version != "*" and data["version"] != pkg.version:
        raise BuildError(f"{pkg.distribution} version of {exe} differs from the manifest",
                         key_path=f"targets.{target.name}.package.version", expected=pkg.version,
                         found=data["version"], hint="the patches were written for the manifest's version")
    marks = [ln for ln in done.stdout.splitlines() if ln.startswith("IMAGEFORGE-SCHEME ")]
    paths = json.loads(marks[-1].split(" ", 1)[1]) if marks else {}
    scheme = tuple((n, os.path.realpath(paths[n])) for n in SCHEME_NAMES if paths.get(n))
    return LocalPackage(root, exe, data["python_version"], data.get("cache_tag", ""), data["version"],
                        image_path(root, data["site"]), image_path(root, data["package_dir"]),
                        str(data.get("dist_info", "")), scheme, chosen.why)
