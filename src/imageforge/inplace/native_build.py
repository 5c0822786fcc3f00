"""``imageforge native build --target T --step ID --in-place``: a native step's extensions made on this machine.

On the card's machine (compiler, target interpreter and device there; vLLM not needed): the step's ``build:``
command runs in its folder with the caller's environment (``PYTHON`` set to the target interpreter), then what
it made is checked as every face checks it (:func:`imageforge.steps.native.elf_findings` against this machine's
files, the folder's unpinned binaries), each Python extension is imported by the target interpreter after the
modules its ``loaded_before`` libraries belong to (:mod:`imageforge.inimage.import_native`: the functions it
defines, with pybind11's signature line), their functions and signatures are written into the target's vendor API
record (``vendor_api:``; :func:`imageforge.vendor_api.record.record_functions`, the module named by each
extension's ``dest``), so preflight checks every call of them, and the pins in the manifest are rewritten
(``--check``: compared only, exit 3 when a pin differs from the fresh build; neither file is written).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BuildError, ConfigError
from ..inimage import program
from ..manifest.model import Step, resolve_image_path
from ..manifest.resolve import Resolved
from ..manifest.yamldoc import load_yaml
from ..steps.native import Extension, NativeSpec, elf_findings, extensions, folder, pin_findings
from ..vendor_api.elfcheck import Finding, module_name
from ..vendor_api.record import record_functions, signature_from_doc
from .localfs import LocalFS
from .package import discover_local

Log = Callable[[str], None]
MARKER = "IMAGEFORGE-NATIVE "


@dataclass(frozen=True)
class Pin:
    file: str
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass
class NativeBuildReport:
    step: str
    pins: list[Pin] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    imports: dict[str, Any] = field(default_factory=dict)
    rewritten: bool = False
    check: bool = False
    record: str | None = None  # the vendor API record the functions went to
    recorded: bool = False  # whether that file changed

    @property
    def ok(self) -> bool:
        return not self.findings and not (self.check and any(p.changed for p in self.pins))

    def text(self) -> str:
        lines = [f"native step {self.step}:"]
        for p in self.pins:
            state = ("differs from its pin" if self.check else "pin rewritten") if p.changed else "matches its pin"
            lines.append(f"  {p.file} sha256:{p.new} ({state})")
        for m in self.imports.get("modules", []):
            if m.get("ok"):
                funcs = m.get("functions", {})
                lines.append(f"  import {m['name']}: ok, {len(funcs)} function(s)")
                lines += [f"    {sig or name}" for name, sig in funcs.items()]
        if self.record is not None:
            lines.append(f"  vendor API record {self.record}: "
                         + ("functions written" if self.recorded else "already lists these functions"))
        lines += [f"  {f.line()}" for f in self.findings]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "ok": self.ok, "check": self.check, "rewritten": self.rewritten,
                "pins": [{"file": p.file, "old": p.old, "new": p.new, "changed": p.changed} for p in self.pins],
                "findings": [{"code": f.code, "path": f.path, "message": f.message} for f in self.findings],
                "imports": self.imports, "record": self.record, "recorded": self.recorded}


def native_step(resolved: Resolved, step_id: str) -> Step:
    """The target's native step ``step_id`` (a ConfigError naming the native steps otherwise)."""
    natives = [s for s in resolved.steps if isinstance(s.spec, NativeSpec)]
    for s in natives:
        if s.id == step_id:
            return s
    raise ConfigError(f"target {resolved.target.name!r} has no native step {step_id!r}",
                      expected=", ".join(s.id for s in natives) or "a native step", found=step_id)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite_pins(manifest: Path, step: Step, new: Mapping[str, str]) -> bool:
    """Each changed pin written over its old value, on the line of its own ``sha256:`` key (the rest untouched)."""
    doc = load_yaml(manifest)
    text = manifest.read_text()
    lines = text.splitlines(keepends=True)
    kp = _key_path(step.key_path)
    changed = False
    for j, ext in enumerate(extensions(step)):
        want = new.get(ext.file)
        if want is None or want == ext.sha256:
            continue
        line = doc.location((*kp, "extensions", j, "sha256")).line
        if line is None or ext.sha256 not in lines[line - 1]:
            raise BuildError(f"cannot find the pin of {ext.file} in {manifest}", found=f"line {line}")
        lines[line - 1] = lines[line - 1].replace(ext.sha256, want, 1)
        changed = True
    if changed:
        manifest.write_text("".join(lines))
    return changed


def _key_path(key_path: str) -> tuple[str | int, ...]:
    out: list[str | int] = []
    for part in key_path.split("."):
        m = re.fullmatch(r"([^\[]+)((?:\[\d+\])*)", part)
        if m is None:
            out.append(part)
            continue
        out.append(m.group(1))
        out += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    return tuple(out)


def native_build(resolved: Resolved, step_id: str, *, root: Path, python: str, environ: Mapping[str, str],
                 check: bool = False, log: Log = print) -> NativeBuildReport:
    step = native_step(resolved, step_id)
    spec = NativeSpec.of(step)
    if spec.build is None:
        raise ConfigError(f"native step {step.id!r} has no build command", key_path=f"{step.key_path}.build",
                          hint="add `build:` (the command that makes the extensions, run in its directory)")
    where = folder(step, environ)
    pkg = discover_local(resolved.target, root, python, environ, check_version=False)
    log(f"+ (cd {where} && {spec.build})")
    env = {**environ, "PYTHON": pkg.python}
    # its output is a log: stderr (stdout holds the command's result, the JSON document with --json)
    done = subprocess.run(["/bin/sh", "-c", spec.build], cwd=where, env=env, check=False, stdout=sys.stderr)
    if done.returncode != 0:
        raise BuildError(f"the build of native step {step.id!r} exited with code {done.returncode}",
                         location=step.where("build"), key_path=f"{step.key_path}.build", found=spec.build)
    report = NativeBuildReport(step.id, check=check)
    new: dict[str, str] = {}
    for ext in extensions(step):
        path = where / ext.file
        if not path.is_file():
            report.findings.append(Finding("file-missing", ext.file, f"the build made no {path}"))
            continue
        new[ext.file] = _sha256(path)
        report.pins.append(Pin(ext.file, ext.sha256, new[ext.file]))
    report.findings += [f for f in pin_findings(step, environ) if f.code == "unpinned"]
    report.findings += elf_findings(step, LocalFS(root), pkg.site, environ)
    before = sorted({p.split("/")[0] for p in spec.loaded_before if not p.startswith("/")})
    python_exts = [e for e in extensions(step) if e.python and (where / e.file).is_file()]
    modules = [{"name": module_name(e.file), "path": str(where / e.file)} for e in python_exts]
    if modules:
        report.imports = import_extensions(pkg.python, before, modules, environ)
        for m in [*report.imports.get("before", []), *report.imports.get("modules", [])]:
            if not m.get("ok"):
                report.findings.append(Finding("import-failed", str(m["name"]), str(m.get("error"))))
    if not check and not report.findings:
        record = resolved.target.vendor_api
        if record is not None and report.imports:
            report.record = str(record)
            report.recorded = record_functions(record, pkg.python_version,
                                               recorded_functions(python_exts, report.imports, pkg.site))
        report.rewritten = rewrite_pins(Path(resolved.manifest.path), step, new)
    return report


def dotted_module(dest: str, site: str) -> str | None:
    """The module an extension installed at ``dest`` (site-relative or absolute) is imported as, or None when it
    lies outside the site directory."""
    path = posixpath.normpath(resolve_image_path(dest, site))
    prefix = site.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    parts = [*path[len(prefix):].split("/")[:-1], module_name(path)]
    return ".".join(parts) if all(p.isidentifier() for p in parts) else None


def recorded_functions(exts: list[Extension], imports: Mapping[str, Any], site: str
                       ) -> dict[str, dict[str, str | None]]:
    """Dotted module -> function -> signature text (None where the docstring gave none), from what the target
    interpreter listed of each imported extension."""
    listed = {m["name"]: m.get("functions", {}) for m in imports.get("modules", []) if m.get("ok")}
    out: dict[str, dict[str, str | None]] = {}
    for ext in exts:
        module = dotted_module(ext.dest, site)
        functions = listed.get(module_name(ext.file))
        if module is None or functions is None:
            continue
        out[module] = {name: signature_from_doc(name, line) for name, line in functions.items()}
    return out


def import_extensions(python: str, before: list[str], modules: list[dict[str, str]],
                      environ: Mapping[str, str]) -> dict[str, Any]:
    """:mod:`imageforge.inimage.import_native` run by the target interpreter; its JSON line."""
    done = subprocess.run([python, "-c", program("import_native"), json.dumps({"before": before, "modules": modules})],
                          env=dict(environ), capture_output=True, text=True, timeout=300, check=False)
    marks = [ln for ln in done.stdout.splitlines() if ln.startswith(MARKER)]
    if not marks:
        raise BuildError(f"importing the extensions with {python} printed no result (exit {done.returncode})",
                         log_tail=tuple((done.stdout + done.stderr).splitlines()[-20:]))
    result: dict[str, Any] = json.loads(marks[-1][len(MARKER):])
    return result

