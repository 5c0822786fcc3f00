"""Record the vendor's Python API: run with the target interpreter, standard library only.

``python3 probe_api.py MODULE... [--ops NAMESPACE...] [--walk PACKAGE...]`` prints one JSON object on stdout:
``python`` (the interpreter's version), ``versions`` (torch, vllm and the modules' distributions), ``modules``
(each module's public names: ``kind`` function | class | module | other, ``signature`` from
``inspect.signature``, ``__text_signature__`` or a pybind docstring's first line, else null), ``distributions``
(installed distributions with their top-level modules), ``library_files`` (the shared objects behind the
extension modules named or loaded by the imports: imageforge reads their ELF facts in its own process) and
``errors`` (a module that did not import, with the exception). ``--walk`` adds every submodule of a package;
``--ops NS`` records ``torch.ops.NS``'s operators with their schemas. Nothing here needs a device: a module
that needs one is listed under ``errors``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import pkgutil
import sys
from typing import Any

KIND_OF = (("module", inspect.ismodule), ("class", inspect.isclass),
           ("function", lambda o: inspect.isroutine(o) or type(o).__name__ in ("OpOverloadPacket", "builtin_function")))


def kind_of(obj: Any) -> str:
    for name, test in KIND_OF:
        if test(obj):
            return name
    return "other"


def signature_of(name: str, obj: Any) -> Any:
    """The call signature as text, or None when neither inspect nor the docstring tells it."""
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        pass
    text = getattr(obj, "__text_signature__", None)
    if isinstance(text, str) and text.startswith("("):
        return text.replace("($module, ", "(").replace("($module)", "()").replace("($self, ", "(self, ")
    doc = getattr(obj, "__doc__", None) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    if first.startswith(name + "("):  # pybind11: "name(arg0: int, arg1: at::Tensor) -> None"
        return first[len(name):]
    return None


def members(module: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = getattr(module, "__all__", None)
    for name in sorted(set(dir(module)) | set(names or ())):
        if name.startswith("_") and not (names and name in names):
            continue
        try:
            obj = getattr(module, name)
        except Exception:  # a lazy attribute that fails: it exists, of unknown kind
            out[name] = {"kind": "other", "signature": None}
            continue
        kind = kind_of(obj)
        out[name] = {"kind": kind, "signature": signature_of(name, obj) if kind in ("function", "class") else None}
    return out


def torch_ops(namespace: str) -> dict[str, Any]:
    """``torch.ops.NS``'s operators with their schemas (the dispatcher's registry; nothing is called)."""
    torch = importlib.import_module("torch")  # like every probed module: by name, only when asked

    out: dict[str, Any] = {}
    prefix = namespace + "::"
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith(prefix):
            op = schema.name[len(prefix):]
            text = str(schema)
            out[op] = {"kind": "function", "signature": text[text.find("("):] if "(" in text else None,
                       "schema": text}
    return out


def distributions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        top = (dist.read_text("top_level.txt") or "").split()
        if not top:
            files = dist.files or []
            top = sorted({str(f).split("/", 1)[0].removesuffix(".py") for f in files
                          if not str(f).split("/", 1)[0].endswith((".dist-info", ".egg-info", ".data"))
                          and not str(f).startswith("..")})
        out[name] = {"version": dist.version, "top_level": top}
    return out


def loaded_libraries(tops: set[str]) -> list[str]:
    """Shared objects the imports loaded from inside the probed packages' folders: extension modules in
    ``sys.modules`` and libraries loaded with ``torch.ops.load_library`` or ctypes (``/proc/self/maps``)."""
    folders: list[str] = []
    for top in sorted(tops):
        module = sys.modules.get(top)
        for folder in getattr(module, "__path__", None) or ():
            folders.append(str(folder).rstrip("/") + "/")
    paths = [getattr(m, "__file__", None) or "" for n, m in sorted(sys.modules.items()) if n.split(".", 1)[0] in tops]
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths += [line.split()[-1] for line in maps if len(line.split()) >= 6]
    except OSError:
        pass
    found = [p for p in paths if ".so" in p.rsplit("/", 1)[-1] and any(p.startswith(f) for f in folders)]
    return list(dict.fromkeys(found))


def main(argv: list[str]) -> int:
    modules: list[str] = []
    ops: list[str] = []
    walk: list[str] = []
    into = modules
    for arg in argv:
        if arg == "--ops":
            into = ops
        elif arg == "--walk":
            into = walk
        else:
            into.append(arg)
    record: dict[str, Any] = {"format": 1, "python": ".".join(map(str, sys.version_info[:3])), "versions": {},
                              "modules": {}, "distributions": distributions(), "library_files": [], "errors": {}}
    for package in walk:
        try:
            pkg = importlib.import_module(package)
        except Exception as exc:
            record["errors"][package] = f"{type(exc).__name__}: {exc}"
            continue
        modules.append(package)
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=package + "."):
            modules.append(info.name)
    for name in dict.fromkeys(modules):
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            record["errors"][name] = f"{type(exc).__name__}: {exc}"
            continue
        record["modules"][name] = members(module)
        path = getattr(module, "__file__", None) or ""
        if path.endswith(".so"):
            record["library_files"].append(path)
    for namespace in ops:
        try:
            record["modules"][f"torch.ops.{namespace}"] = torch_ops(namespace)
        except Exception as exc:
            record["errors"][f"torch.ops.{namespace}"] = f"{type(exc).__name__}: {exc}"
    tops = {m.split(".", 1)[0] for m in modules} | {p.split(".", 1)[0] for p in walk}
    for path in loaded_libraries(tops):
        if path not in record["library_files"]:
            record["library_files"].append(path)
    for dist in ("torch", "vllm", *sorted(tops)):
        try:
            record["versions"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    json.dump(record, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
