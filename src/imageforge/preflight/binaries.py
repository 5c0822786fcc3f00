"""Every shared object a script step's folder ships (``*.so``, ``*.so.N``, any ELF file), checked without the device
as a native step's extensions are (:func:`imageforge.vendor_api.elfcheck.check_extension`, one
:class:`~imageforge.vendor_api.elfcheck.Resolver` for the run): ELF 64-bit x86-64 shared object, every undefined
symbol provided by its ``DT_NEEDED`` closure (found in the final tree, else among the vendor API record's
``libraries``) or by what is loaded before it (the interpreter, torch's libraries: ``import torch`` comes first),
every symbol version met; ``PyInit_<name>`` for a file named as a Python extension (``*.cpython-*.so``,
``*.abi3.so``).

The object is checked where the script put it (a file of the final tree with the same bytes: its ``$ORIGIN`` and
RUNPATH are those of that place), else at its place in the shipped folder. Pins are :func:`.shell.pins`' findings.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..vendor_api.elfcache import default_store
from ..vendor_api.elfcheck import Files, Resolver, check_extension, recorded_libraries
from ..vendor_api.record import VendorApi
from .findings import Finding
from .tree import ShippedFolder

#: torch's libraries (relative to the site directory) loaded before any extension of a process that imported torch.
TORCH_LIBS = ("torch/lib/libc10.so", "torch/lib/libtorch_cpu.so", "torch/lib/libtorch.so",
              "torch/lib/libtorch_python.so")
#: elfcheck's codes that are pins: :func:`.shell.pins` reports those.
_PIN_CODES = frozenset({"pin-mismatch", "unpinned", "file-missing"})
_ELF = b"\x7fELF"


def shared_objects(folder: ShippedFolder) -> dict[str, Path]:
    """The folder's shared objects: named ``*.so`` / ``*.so.N``, or starting with the ELF magic."""
    out: dict[str, Path] = {}
    for rel, path in folder.files().items():
        name = posixpath.basename(rel)
        if name.endswith(".so") or ".so." in name:
            out[rel] = path
            continue
        with path.open("rb") as fh:
            if fh.read(4) == _ELF:
                out[rel] = path
    return out


def python_extension(name: str) -> bool:
    """A file name a Python ``import`` loads (then it must export ``PyInit_<module>``)."""
    return ".cpython-" in name or name.endswith(".abi3.so") or ".pypy" in name


def shipped_so_findings(folders: Sequence[ShippedFolder], files: Files, *, site: str,
                        deployed: Mapping[str, str] | None = None, interpreter: str | None = None,
                        library_path: Sequence[str] = (), api: VendorApi | None = None) -> list[Finding]:
    """The ELF checks of every shared object the folders ship, against the final tree ``files``.

    ``deployed``: sha256 -> image path of the files the scripts added or changed (where an object went);
    ``interpreter``: the target's Python (absolute); ``library_path``: LD_LIBRARY_PATH of the serving process.
    """
    if not any(shared_objects(f) for f in folders):
        return []
    resolver = Resolver(files, tuple(library_path), recorded=recorded_libraries(api.libraries) if api else {},
                        store=default_store())
    before = [p for p in (posixpath.join(site, lib) for lib in TORCH_LIBS) if files.stat(p) is not None]
    interpreter = interpreter if interpreter and interpreter.startswith("/") and files.stat(interpreter) else None
    out: list[Finding] = []
    for folder in folders:
        for rel, host in shared_objects(folder).items():
            data = host.read_bytes()
            shipped = f"{folder.dest.rstrip('/')}/{rel}"
            where = (deployed or {}).get(hashlib.sha256(data).hexdigest(), shipped)
            for f in check_extension(where, data, files, python_extension=python_extension(rel),
                                     interpreter=interpreter, loaded_before=before, library_path=library_path,
                                     resolver=resolver):
                if f.code in _PIN_CODES:
                    continue
                out.append(Finding(
                    "so-elf", f"{f.code}: {f.message}", shipped, step=folder.step,
                    expected="an x86-64 shared object the image's loader accepts",
                    found=f"checked at {where}" + (" (where the script installed it)" if where != shipped else ""),
                    hint=_HINTS.get(f.code, "rebuild it against the base's libraries (on the card's machine)")))
    return out


_HINTS = {
    "undefined-symbol": "the symbol is in no library the object needs or torch loads: rebuild it against the "
                        "vendor's libraries as the record lists them (imageforge probe --in-place), or link the "
                        "library that defines it",
    "needed-missing": "ship the library, add its folder to LD_LIBRARY_PATH / RUNPATH, or take the vendor API record "
                      "again so it lists the card's libraries",
    "version-missing": "built on a newer toolchain than the base has: build it in the base (imageforge native build)",
    "wrong-arch": "an object for another machine: build it for x86-64",
}
