"""An offline wheelhouse for a machine without PyPI (the card's box: CPython 3.10, x86_64, glibc 2.31).

:func:`make_wheelhouse` builds imageforge's own wheel from the source checkout, lets pip download
its runtime dependencies as binary wheels for the *target* interpreter (``--python-version``,
``--implementation cp``, ``--abi cpXY`` and every manylinux platform tag from manylinux2014 /
manylinux_2_17 up to manylinux_2_31; pure-Python ``py3-none-any`` wheels match those tags by
themselves), and writes beside the wheels a ``requirements.txt`` pinning every one of them with its
sha256, so that::

    pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt

installs exactly these files. The same wheels and requirements go into one tar archive written as
parts of at most :data:`PART_SIZE` bytes under ``DIR/parts/`` with ``SHA256SUMS`` and the stdlib
script :mod:`imageforge.wheelhouse.join` that checks the parts and joins and unpacks them (an SSH
copy of 11 MB in one piece failed on the box).

The dependency list is the built wheel's own metadata (``Requires-Dist`` without extras), so what
is downloaded follows pyproject.toml with no second list here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imageforge.cli.progress import progress, watch_size
from imageforge.errors import ConfigError, InfraError
from imageforge.wheelhouse import join as wheelhouse_join

Log = Callable[[str], None]

#: Largest part written (bytes): below 4 MB in either meaning of MB.
PART_SIZE = 4_000_000
#: The oldest glibc a manylinux tag may ask for, and the box's (Ubuntu 20.04: glibc 2.31).
MANYLINUX_FROM, MANYLINUX_TO = 17, 31
ARCH = "x86_64"
#: What of the checkout a wheel is built from (copied first: building writes build/ and *.egg-info).
PROJECT_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "src", "schema")
REQUIREMENTS = "requirements.txt"
PARTS = "parts"
HEADER = "# imageforge wheelhouse"
_PYTHON = re.compile(r"^3\.(\d{1,2})$")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def python_tag(python: str) -> str:
    """'3.10' -> 'cp310'; ConfigError for anything not '3.N'."""
    match = _PYTHON.match(python.strip())
    if not match:
        raise ConfigError(f"--python {python!r}: expected a CPython version like 3.10 or 3.11")
    return f"cp3{match.group(1)}"


def platform_tags() -> list[str]:
    """manylinux2014 (pip widens it to manylinux2010/1 itself) and manylinux_2_17 ... manylinux_2_31."""
    return [f"manylinux2014_{ARCH}", *(f"manylinux_2_{m}_{ARCH}" for m in range(MANYLINUX_FROM, MANYLINUX_TO + 1))]


def pip_target_args(python: str) -> list[str]:
    """The ``pip download`` options that pick wheels for CPython ``python`` on the box, not for this machine."""
    tag = python_tag(python)
    args = ["--only-binary=:all:", "--python-version", python.strip(), "--implementation", "cp", "--abi", tag]
    for platform in platform_tags():
        args += ["--platform", platform]
    return args


def sha256_of(path: Path) -> str:
    return wheelhouse_join.sha256_file(path)


def wheel_name_version(path: Path) -> tuple[str, str]:
    """('PyYAML' -> 'pyyaml', '6.0.2') from a wheel's file name (PEP 427, names normalised)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise InfraError(f"not a wheel file name: {path.name}", found=str(exc)) from None
    return str(name), str(version)


def requirements_text(wheels: Iterable[Path], *, python: str) -> str:
    """A ``--require-hashes`` requirements file pinning every wheel by name, version and sha256."""
    lines = [f"{HEADER} for CPython {python} {ARCH} (manylinux2014 .. manylinux_2_{MANYLINUX_TO}), "
             "written by `invoke wheels`",
             "# pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt"]
    pinned: dict[str, tuple[str, list[str]]] = {}
    for wheel in sorted(wheels):
        name, version = wheel_name_version(wheel)
        have = pinned.setdefault(name, (version, []))
        if have[0] != version:
            raise InfraError(f"two versions of {name} in the wheelhouse: {have[0]} and {version}")
        have[1].append(sha256_of(wheel))
    for name in sorted(pinned):
        version, digests = pinned[name]
        hashes = " ".join(f"--hash=sha256:{d}" for d in digests)
        lines.append(f"{name}=={version} {hashes}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- parts


def write_archive(files: Sequence[Path], archive: Path) -> None:
    """A plain tar of ``files`` (by base name), reproducible: sorted, mtime 0, root-owned, mode 0644."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files, key=lambda p: p.name):
            info = tar.gettarinfo(str(path), arcname=path.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)


def split_file(path: Path, folder: Path, *, part_size: int = PART_SIZE) -> list[Path]:
    """``path`` cut into ``folder/NAME.000``, ``.001``, ... of at most ``part_size`` bytes each."""
    if part_size <= 0:
        raise ValueError("part_size must be positive")
    parts: list[Path] = []
    with open(path, "rb") as src:
        while True:
            block = src.read(part_size)
            if not block and parts:
                break
            part = folder / f"{path.name}.{len(parts):03d}"
            part.write_bytes(block)
            parts.append(part)
            if len(block) < part_size:
                break
    return parts


def write_parts(files: Sequence[Path], folder: Path, name: str, *, part_size: int = PART_SIZE) -> list[Path]:
    """The archive of ``files`` as parts in ``folder`` + SHA256SUMS + the join script; the parts' paths.

    SHA256SUMS has one ``sha256sum`` line per part and a last one for the joined archive
    (``sha256sum -c --ignore-missing SHA256SUMS`` checks the parts with coreutils too).
    """
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{name}.tar"
    write_archive(files, archive)
    try:
        parts = split_file(archive, folder, part_size=part_size)
        lines = [f"{sha256_of(p)}  {p.name}" for p in parts] + [f"{sha256_of(archive)}  {archive.name}"]
    finally:
        archive.unlink()
    (folder / wheelhouse_join.SUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    script = folder / "wheelhouse_join.py"
    shutil.copyfile(wheelhouse_join.__file__, script)
    script.chmod(0o755)
    return parts


# --------------------------------------------------------------------------- the wheelhouse


@dataclass(frozen=True)
class WheelFile:
    name: str
    version: str
    file: str
    size: int


@dataclass(frozen=True)
class Wheelhouse:
    """What :func:`make_wheelhouse` wrote."""

    out: Path
    python: str
    wheels: tuple[WheelFile, ...]
    parts: tuple[Path, ...]

    @property
    def total_bytes(self) -> int:
        return sum(w.size for w in self.wheels)

    @property
    def requirements(self) -> Path:
        return self.out / REQUIREMENTS

    def text(self) -> str:
        rows = [f"{w.name}=={w.version}  {w.size / 1e6:6.2f} MB  {w.file}" for w in self.wheels]
        parts_dir = self.out / PARTS
        return "\n".join([
            f"wheelhouse for CPython {self.python} {ARCH}: {len(self.wheels)} wheels, "
            f"{self.total_bytes / 1e6:.1f} MB in {self.out}",
            *("  " + r for r in rows),
            f"requirements: {self.requirements} (hash-pinned)",
            f"parts: {len(self.parts)} x <= {PART_SIZE / 1e6:.0f} MB in {parts_dir} "
            f"(+ {wheelhouse_join.SUMS}, wheelhouse_join.py)",
            f"on the box: python3 wheelhouse_join.py --out wheelhouse && python3 -m pip install --no-index "
            f"--find-links wheelhouse --require-hashes -r wheelhouse/{REQUIREMENTS}",
        ])

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out), "python": self.python, "total_bytes": self.total_bytes,
            "requirements": str(self.requirements),
            "wheels": [{"name": w.name, "version": w.version, "file": w.file, "size": w.size} for w in self.wheels],
            "parts": [str(p) for p in self.parts], "part_size": PART_SIZE,
        }


def project_root(start: Path | None = None) -> Path:
    """The source checkout holding imageforge's pyproject.toml (above this file), else ConfigError."""
    here = (start or Path(__file__)).resolve()
    for folder in here.parents:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"imageforge"', pyproject.read_text("utf-8")):
            return folder
    raise ConfigError(f"wheels builds imageforge's own wheel from its source checkout; none found above {here}",
                      hint="run it from a clone of the repository (its pyproject.toml and src/)")


def _pip(args: Sequence[str], *, what: str, log: Log) -> None:
    """``python -m pip ARGS`` with its output passed to ``log``; InfraError with the last lines on failure."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_REQUIRE_VIRTUALENV", "PYTHONPATH")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, env=env)
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                log(f"  {line}")
                tail = [*tail[-29:], line]
        proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        raise InfraError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}", log_tail=tail,
                         hint="pip needs PyPI (or PIP_INDEX_URL) to download; a dependency without a wheel for "
                         "this Python and manylinux_2_31 cannot go into an offline wheelhouse")


def build_wheel(project: Path, dest: Path, *, log: Log) -> Path:
    """imageforge's wheel, built from a copy of the checkout's :data:`PROJECT_FILES` into ``dest``."""
    with tempfile.TemporaryDirectory(prefix="imageforge-wheel-") as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        for name in PROJECT_FILES:
            path = project / name
            if path.is_dir():
                shutil.copytree(path, source / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
            elif path.is_file():
                shutil.copy2(path, source / name)
        built = Path(tmp) / "built"
        _pip(["wheel", "--no-deps", "--wheel-dir", str(built), str(source)], what="building imageforge's wheel",
             log=log)
        wheels = sorted(built.glob("imageforge-*.whl"))
        if len(wheels) != 1:
            raise InfraError(f"building imageforge's wheel gave {len(wheels)} wheel files", found=str(wheels))
        return Path(shutil.copy2(wheels[0], dest / wheels[0].name))


def _clear(out: Path) -> None:
    """Empty a previous wheelhouse in ``out``; refuse a folder that holds anything else."""
    if not out.exists():
        return
    entries = list(out.iterdir())
    if not entries:
        return
    requirements = out / REQUIREMENTS
    ours = requirements.is_file() and requirements.read_text("utf-8", "replace").startswith(HEADER)
    foreign = [e.name for e in entries if not (e.suffix == ".whl" or e.name in (REQUIREMENTS, PARTS))]
    if not ours or foreign:
        raise ConfigError(f"--out {out}: not empty and not a wheelhouse written by `invoke wheels`",
                          found=", ".join(sorted(e.name for e in entries)[:8]),
                          hint="name a new or empty folder")
    for entry in entries:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def make_wheelhouse(out: Path, *, python: str = "3.10", project: Path | None = None, part_size: int = PART_SIZE,
                    log: Log | None = None) -> Wheelhouse:
    """Build the wheelhouse for CPython ``python`` in ``out`` (see the module's docstring); progress to ``log``."""
    log = log or _stderr
    tag = python_tag(python)
    out = out.absolute()
    project = project or project_root()
    _clear(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"building imageforge's wheel from {project}")
    own = build_wheel(project, out, log=log)
    log(f"downloading its runtime dependencies for CPython {python} {ARCH} "
        f"(manylinux2014 .. manylinux_2_{MANYLINUX_TO}) into {out}")
    with progress("wheelhouse download", unit="bytes") as bar, watch_size(out, bar):  # bytes so far, on stderr
        _pip(["download", "--progress-bar", "off", "--dest", str(out), *pip_target_args(python), str(own)],
             what=f"pip download for CPython {python}", log=log)
    wheels = sorted(out.glob("*.whl"))
    (out / REQUIREMENTS).write_text(requirements_text(wheels, python=python), encoding="utf-8")
    log(f"writing parts of <= {part_size} bytes into {out / PARTS}")
    parts = write_parts([*wheels, out / REQUIREMENTS], out / PARTS, f"wheelhouse-{tag}", part_size=part_size)
    files = tuple(WheelFile(*wheel_name_version(w), file=w.name, size=w.stat().st_size) for w in wheels)
    return Wheelhouse(out=out, python=python, wheels=files, parts=tuple(parts))
