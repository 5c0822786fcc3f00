"""Import native extensions with the target interpreter and list what they define (``python3 -c TEXT SPEC``).

Run by ``imageforge native build`` on the card's machine (the device is there): argv[1] is a JSON object
``{"before": [module, ...], "modules": [{"name": N, "path": P}, ...]}``. The ``before`` modules are imported first
(``torch``: the libraries an extension needs are loaded by it), then each extension from its file, by its module
name. One ``IMAGEFORGE-NATIVE {json}`` line: per module ``ok``, the error when not, and its functions with the
first line of each one's docstring (pybind11 writes the signature there), or ``name(signature)`` from
``inspect.signature`` when the docstring does not start with one (a C function's ``__text_signature__``).
Standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import sys

MARKER = "IMAGEFORGE-NATIVE "


def load(name: str, path: str) -> dict[str, object]:
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return {"name": name, "ok": False, "error": f"no loader for {path}"}
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # every failure of an import is the finding
        return {"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    functions = {}
    for attr in sorted(dir(module)):
        value = getattr(module, attr)
        if attr.startswith("_") or not callable(value):
            continue
        doc = (getattr(value, "__doc__", None) or "").strip().splitlines()
        first = doc[0] if doc else ""
        if not first.startswith(attr + "("):
            with contextlib.suppress(TypeError, ValueError):  # no signature readable: the docstring line as it is
                first = f"{attr}{inspect.signature(value)}"
        functions[attr] = first
    return {"name": name, "ok": True, "functions": functions}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    before = []
    for name in spec.get("before", []):
        try:
            importlib.import_module(name)
            before.append({"name": name, "ok": True})
        except Exception as exc:  # the finding
            before.append({"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    modules = [load(m["name"], m["path"]) for m in spec["modules"]]
    print(MARKER + json.dumps({"before": before, "modules": modules}), flush=True)
    return 0 if all(m["ok"] for m in [*before, *modules]) else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
