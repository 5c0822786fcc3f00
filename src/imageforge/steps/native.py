"""``native``: prebuilt extensions (``.so``) from a host folder, each pinned by its sha256, put into the package.

A native step never compiles and never loads what it installs: its files are built on the card's machine by
``imageforge native build`` (which runs the step's ``build:`` command there, checks and imports what it made and
rewrites the pins), committed with their pins, and installed by every face from those bytes only:

* the image build and ``apply --in-place``: the files as :class:`Changes` (the build's layer, the journal);
* the submission tree: the applier's ``native`` op copies each file and refuses one whose sha256 is not its pin;
* verify: each installed file's sha256 is a fact (the verify layer's overlay hashes).

Before installing, :func:`native_findings` checks, without the device (check-patches, build, ``apply --in-place``,
preflight): each pin against its file, no unpinned binary in the folder, and per extension the ELF checks of
:mod:`imageforge.vendor_api.elfcheck` against the image's own libraries (read through the step's image files): 64-bit
x86-64 shared object, ``PyInit_<name>``, every undefined symbol provided by the DT_NEEDED closure or a library
loaded before (the interpreter, torch's), every symbol version met. The closure's summaries are kept in the host
cache by file identity (:mod:`imageforge.vendor_api.elfcache`): libtorch_cpu.so (415 MB) is read once per file, not
once per command.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..errors import BuildError, InfraError
from ..manifest.model import Step, StepSpec, frozen_map, resolve_image_path
from ..vendor_api.elfcache import default_store
from ..vendor_api.elfcheck import Finding, Resolver, check_extension
from .core import (
    ApplyContext,
    Changes,
    Facts,
    FileChange,
    LoadedSpec,
    SpecChecks,
    StepKind,
    StepProblem,
    guard_links,
    register,
)
from .dockerfile import EmitContext, Emitted, applier_group, header, host_file
from .fs import ImageFS

SHA256 = re.compile(r"^[0-9a-f]{64}$")
ELF_MAGIC = b"\x7fELF"
MODE = 0o755


@dataclass(frozen=True)
class NativeSpec(StepSpec):
    """A native step's fields: the host ``directory``; ``extensions`` (each ``file``, ``dest``, ``sha256``,
    ``python``); ``build`` (the command ``native build`` runs in the directory); what the checks resolve against:
    ``interpreter``, ``loaded_before`` (image paths), ``library_path`` (LD_LIBRARY_PATH of the server)."""

    directory: str
    extensions: tuple[Mapping[str, Any], ...]
    build: str | None = None
    interpreter: str = "/usr/bin/python3"
    loaded_before: tuple[str, ...] = ()
    library_path: tuple[str, ...] = ()

    @property
    def host_directory(self) -> str | None:
        return self.directory

    def definition(self) -> dict[str, Any]:
        out = super().definition()
        out["extensions"] = [dict(e) for e in self.extensions]  # JSON values: the cache key, plan's output
        return out


@dataclass(frozen=True)
class Extension:
    file: str  # relative to the step's directory
    dest: str  # image path, relative to the package's site directory or absolute
    sha256: str
    python: bool = True  # a Python extension module: exports PyInit_<its file name's module>


def extensions(step: Step) -> tuple[Extension, ...]:
    return tuple(Extension(str(e["file"]), str(e["dest"]), str(e["sha256"]), bool(e.get("python", True)))
                 for e in NativeSpec.of(step).extensions)


def folder(step: Step, environ: Mapping[str, str]) -> Path:
    """The step's host folder (exit 5 when it is not there)."""
    directory = step.directory(environ)
    if directory is None or not directory.is_dir():
        raise InfraError(f"native step {step.id!r}: its directory is not there",
                         location=step.where("directory"), key_path=f"{step.key_path}.directory",
                         found=str(directory) if directory else f"${step.directory_env} unset")
    return directory


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_binary(path: Path) -> bool:
    """An ELF file, or a file named like a shared object."""
    if ".so" in path.suffixes or path.suffix == ".so":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def pin_findings(step: Step, environ: Mapping[str, str]) -> list[Finding]:
    """Each pin against its file's bytes; every binary of the folder that no extension pins."""
    root = folder(step, environ)
    out: list[Finding] = []
    pinned: set[Path] = set()
    for ext in extensions(step):
        path = (root / ext.file).resolve()
        pinned.add(path)
        if not path.is_file():
            out.append(Finding("file-missing", ext.file, f"no file at {path} (build it: imageforge native build)"))
            continue
        actual = sha256_of(path)
        if actual != ext.sha256:
            out.append(Finding("pin-mismatch", ext.file, f"sha256 {actual} is not its pin {ext.sha256} "
                                                         "(a stale pin: imageforge native build rewrites the pins)"))
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.resolve() not in pinned and is_binary(path):
            out.append(Finding("unpinned", path.relative_to(root).as_posix(),
                               "a binary in the step's folder that no extension pins (pin it or remove it)"))
    return out


def elf_findings(step: Step, fs: ImageFS, site: str, environ: Mapping[str, str],
                 resolver: Resolver | None = None) -> list[Finding]:
    """The ELF checks of every extension whose file is there, against the image's files ``fs``."""
    spec = NativeSpec.of(step)
    root = folder(step, environ)
    resolver = resolver or Resolver(fs, spec.library_path, store=default_store(environ))
    before = [resolve_image_path(p, site) for p in spec.loaded_before]
    out: list[Finding] = []
    for ext in extensions(step):
        path = root / ext.file
        if path.is_file():
            out += check_extension(resolve_image_path(ext.dest, site), path.read_bytes(), fs,
                                   python_extension=ext.python, interpreter=spec.interpreter,
                                   loaded_before=before, library_path=spec.library_path, resolver=resolver)
    return out


def native_findings(step: Step, fs: ImageFS, site: str, environ: Mapping[str, str]) -> list[Finding]:
    """Every check of a native step without the device (preflight's call): pins, unpinned binaries, ELF."""
    return [*pin_findings(step, environ), *elf_findings(step, fs, site, environ)]


@register
class Native(StepKind):
    name = "native"
    spec_type = NativeSpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": ["directory", "extensions"],
        "properties": {
            "directory": {"type": "string", "minLength": 1,
                          "description": "Host folder (relative to the manifest) holding the extensions, their "
                                         "sources and build files. A binary in it that no extension pins is a "
                                         "finding."},
            "extensions": {
                "type": "array", "minItems": 1,
                "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["file", "dest", "sha256"],
                    "properties": {
                        "file": {"type": "string", "minLength": 1,
                                 "description": "The built file, relative to `directory`."},
                        "dest": {"type": "string", "minLength": 1,
                                 "description": "Where it goes: relative to the package's site directory, or "
                                                "absolute."},
                        "sha256": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$",
                                   "description": "The pin: `sha256:` + 64 hex digits (`imageforge native build` "
                                                  "writes it)."},
                        "python": {"type": "boolean",
                                   "description": "A Python extension module (default true): it must export "
                                                  "PyInit_<module> of its file name. false: a plain library."},
                    },
                },
            },
            "build": {"type": "string", "minLength": 1,
                      "description": "Shell command `imageforge native build` runs in `directory` (on the card's "
                                     "machine: compiler and device there) to make the extensions. Never run by the "
                                     "image build."},
            "interpreter": {"type": "string", "pattern": "^/",
                            "description": "The image's Python (its exports and libraries are loaded before the "
                                           "extension); default /usr/bin/python3."},
            "loaded_before": {"type": "array", "items": {"type": "string", "minLength": 1},
                              "description": "Libraries loaded before the extension (torch's: torch/lib/libc10.so, "
                                             "...), relative to the site directory or absolute."},
            "library_path": {"type": "array", "items": {"type": "string", "pattern": "^/"},
                             "description": "LD_LIBRARY_PATH of the serving process, as directories."},
        },
    }

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        directory_env, directory_path = checks.directory("directory", raw["directory"])
        spec["directory"] = raw["directory"] if directory_env else posixpath.normpath(raw["directory"])
        exts = []
        for item in raw["extensions"]:
            exts.append(frozen_map({"file": posixpath.normpath(item["file"]),
                                    "dest": checks.dest("extensions", item["dest"], item["file"]),
                                    "sha256": str(item["sha256"]).removeprefix("sha256:"),
                                    "python": bool(item.get("python", True))}))
        spec["extensions"] = tuple(exts)
        for key in ("loaded_before", "library_path"):
            if key in raw:
                spec[key] = tuple(raw[key])
        loaded = super().load(raw, spec, checks)
        return LoadedSpec(loaded.spec, directory_env, directory_path)

    def row_path(self, step: Step, site: str) -> str:
        return resolve_image_path(extensions(step)[0].dest, site)

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        return tuple(resolve_image_path(e.dest, site) for e in extensions(step))

    def provides(self, step: Step) -> tuple[str, ...]:
        return tuple(e.dest.lstrip("./") for e in extensions(step) if e.python and not e.dest.startswith("/"))

    def preflight(self, step: Step, environ: Mapping[str, str]) -> None:
        folder(step, environ)

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        """The pinned files, checked first (pins, unpinned binaries, ELF against the image); never loaded."""
        row = self.row_path(step, ctx.site)
        findings = native_findings(step, fs, ctx.site, ctx.environ)
        if findings:
            raise StepProblem("fails its checks", findings[0].path, "; ".join(f.line() for f in findings)[:400],
                              BuildError(f"native step {step.id!r}: {len(findings)} finding(s)",
                                         location=step.location, key_path=step.key_path,
                                         found="\n".join(f.line() for f in findings),
                                         hint="build on the card's machine and rewrite the pins: imageforge native "
                                              "build --target T --step ID --in-place"),
                              blame="extensions")
        root = folder(step, ctx.environ)
        files: list[FileChange] = []
        same = 0
        for ext in extensions(step):
            dest = resolve_image_path(ext.dest, ctx.site)
            guard_links(step, fs, dest, ctx.site, "destination", blame="extensions")
            data = (root / ext.file).read_bytes()
            files.append(FileChange(dest, data, MODE))
            if ctx.checking and fs.stat(dest) is not None:
                with contextlib.suppress(BuildError):
                    same += fs.read(dest) == data
        n = len(files)
        summary = f"installed {n} pinned extension(s): " + ", ".join(posixpath.basename(f.path) for f in files)
        if same == n:
            return Changes("already applied", row, f"{n} extension(s) have their pinned sha256", summary,
                           files=tuple(files))
        return Changes("applies", row, f"{n} pinned extension(s), ELF checks passed", summary, files=tuple(files))

    def facts(self, step: Step, inputs: Mapping[str, str], site: str) -> Facts:
        """Each installed file's sha256 is its pin (the verify layer hashes the image's file)."""
        return Facts(overlays={resolve_image_path(e.dest, site): e.sha256 for e in extensions(step)})

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        """The applier's ``native`` op: copy each file from the step's folder, refusing one that is not its pin."""
        root = folder(step, ctx.environ)
        entries: list[dict[str, Any]] = []
        files = {}
        for i, ext in enumerate(extensions(step)):
            name = f"{i:02d}-{posixpath.basename(ext.file)}"
            files[f"{ctx.step_dir}/{name}"] = host_file(root / ext.file)
            entries.append({"source": name, "path": resolve_image_path(ext.dest, ctx.base.site),
                            "sha256": ext.sha256, "mode": MODE})
        spec = {"op": "install", "step": step.id, "site": ctx.base.site, "files": entries}
        instructions, context = applier_group(ctx, spec, files)
        return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), context)

