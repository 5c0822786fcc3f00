"""``imageforge probe --in-place``: take the vendor API record on the machine that has the vendor's Python.

:mod:`imageforge.inimage.probe_api` runs with the target interpreter (standard library only; pyelftools never
goes into the vendor's Python) and lists the modules' names, kinds and signatures, the distributions and the
shared objects behind the extension modules; this process then reads those libraries' ELF facts (soname,
DT_NEEDED, exported dynamic symbols) with :mod:`.elf` and writes the record in the fixed format.
"""

from __future__ import annotations

import glob
import json
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InfraError
from ..inimage import program
from .elf import read_elf
from .record import record_from_json, record_to_json

#: What the card's vendor image is probed for when nothing is named (facts note: ixformer backs _custom_ops).
DEFAULT_WALK = ("ixformer",)
DEFAULT_MODULES = ("vllm._C", "vllm._moe_C")
DEFAULT_OPS = ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar")
PROBE_TIMEOUT_S = 600


@dataclass(frozen=True)
class ProbeResult:
    out: Path
    modules: int
    names: int
    libraries: int
    errors: dict[str, str]

    def text(self) -> str:
        lines = [f"wrote {self.out}: {self.modules} module(s), {self.names} name(s), {self.libraries} library(ies)"]
        lines += [f"  not recorded: {mod}: {why}" for mod, why in sorted(self.errors.items())]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "modules": self.modules, "names": self.names, "libraries": self.libraries,
                "errors": self.errors}


def run_probe(python: str, *, modules: Sequence[str] = DEFAULT_MODULES, walk: Sequence[str] = DEFAULT_WALK,
              ops: Sequence[str] = DEFAULT_OPS) -> dict[str, Any]:
    """The probe program's JSON object, run with ``python`` (the target interpreter)."""
    with tempfile.TemporaryDirectory(prefix="imageforge-probe-") as tmp:
        script = Path(tmp) / "probe_api.py"
        script.write_text(program("probe_api"), encoding="utf-8")
        interpreter = str(Path(python).absolute()) if "/" in python else python  # it runs in the scratch folder
        argv = [interpreter, str(script), *modules, "--walk", *walk, "--ops", *ops]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
                                  cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InfraError(f"the probe could not run with {python}: {exc}",
                             hint="--python names the target interpreter (the vendor's python3)") from exc
    if proc.returncode != 0:
        raise InfraError(f"the probe exited with code {proc.returncode} under {python}",
                         log_tail=(proc.stdout + proc.stderr).splitlines()[-20:])
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise InfraError(f"the probe's output is not JSON ({exc})", log_tail=proc.stdout.splitlines()[-5:]) from exc
    return data


def probe(out: Path, *, python: str = "python3", modules: Sequence[str] = DEFAULT_MODULES,
          walk: Sequence[str] = DEFAULT_WALK, ops: Sequence[str] = DEFAULT_OPS,
          libraries: Sequence[str] = ()) -> ProbeResult:
    """Run the probe, add the ELF facts of its libraries and of ``libraries`` (globs), write the record to ``out``."""
    data = run_probe(python, modules=modules, walk=walk, ops=ops)
    extra = [p for pattern in libraries for p in sorted(glob.glob(pattern))]
    return write_record(data, out, extra_libraries=extra, local=Path)


def write_record(data: dict[str, Any], out: Path, *, extra_libraries: Sequence[str] = (),
                 local: Callable[[str], Path]) -> ProbeResult:
    """The probe program's output plus the ELF facts of its libraries, written as a record to ``out``.

    ``local`` gives a readable local file for a library path of the probed machine (in place: the path itself;
    a rehearsal in a container: a copy read out of it)."""
    files = list(dict.fromkeys([*data.pop("library_files", []), *extra_libraries]))
    errors: dict[str, str] = dict(data.pop("errors", {}))
    found: dict[str, Any] = {}
    for path in files:
        try:
            facts = read_elf(local(path))
        except InfraError as exc:
            errors[path] = exc.message
            continue
        found[path] = {"soname": facts.soname, "needed": list(facts.needed), "exports": list(facts.exports)}
    data["libraries"] = found
    api = record_from_json(data, str(out))  # the probe's own output meets the format it promises
    text = json.dumps(record_to_json(api), indent=1, sort_keys=False) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return ProbeResult(out, len(api.modules), sum(len(m) for m in api.modules.values()), len(found), errors)
