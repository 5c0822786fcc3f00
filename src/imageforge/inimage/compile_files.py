"""Compile Python sources with this interpreter: the target's own verdict on the files preflight checks.

Run by ``imageforge preflight`` with the base image's ``python`` in a throwaway container of the final tree
(network off), once for every file: ``python3 compile_files.py FILES.json``. FILES.json is a JSON list of
``{"path": P, "text": T}`` (``text`` null: P is read from this file system). Each is ``compile``d (``exec`` mode,
``dont_inherit``): every syntax error the interpreter raises, with its grammar, its compiler's checks (``return``
outside a function, ``nonlocal`` at module level, ...) and its own version. One ``IMAGEFORGE-COMPILE {json}``
line: ``{"python": "3.10.12", "executable": ..., "errors": [{"index": I, "msg": ..., "lineno": ..., "offset":
..., "text": ...}]}``. Standard library only, Python 3.10 syntax.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any

MARKER = "IMAGEFORGE-COMPILE "


def compile_one(index: int, entry: dict[str, Any]) -> dict[str, Any] | None:
    """None when the file compiles; else its error."""
    path = str(entry["path"])
    text = entry.get("text")
    try:
        if text is None:
            with open(path, "rb") as handle:
                source: str | bytes = handle.read()
        else:
            source = str(text)
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError are SyntaxErrors
        return {"index": index, "msg": f"{type(exc).__name__}: {exc.msg}", "lineno": exc.lineno,
                "offset": exc.offset, "text": (exc.text or "").strip()}
    except (OSError, ValueError) as exc:  # unreadable, or a NUL byte in the source
        return {"index": index, "msg": f"{type(exc).__name__}: {exc}", "lineno": None, "offset": None, "text": ""}
    return None


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as handle:
        files = json.load(handle)
    errors = [e for e in (compile_one(i, f) for i, f in enumerate(files)) if e is not None]
    print(MARKER + json.dumps({"python": platform.python_version(), "executable": sys.executable,
                               "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
