"""What a target interpreter said of the ``.py`` files it compiled: ``inimage/compile_files.py``'s
``IMAGEFORGE-COMPILE {json}`` line, read back. Run by preflight in a throwaway container of the base (its
interpreter), and by ``apply --in-place --dry-run`` with the target interpreter on this machine. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Compiled:
    python: str  # the interpreter's version, 3.10.12
    executable: str
    errors: tuple[tuple[int, str, int | None, int | None, str], ...]  # (index, message, line, column, text)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Compiled:
        errors = data.get("errors") or []
        assert isinstance(errors, list)
        return cls(str(data.get("python") or "?"), str(data.get("executable") or "?"),
                   tuple((int(e["index"]), str(e["msg"]), e.get("lineno"), e.get("offset"), str(e.get("text") or ""))
                         for e in errors))

    @classmethod
    def from_output(cls, output: str, marker: str) -> Compiled | None:
        """The program's result line in ``output``; None when it printed none (the interpreter did not run it)."""
        line = next((x for x in output.splitlines() if x.startswith(marker)), None)
        return None if line is None else cls.from_json(json.loads(line[len(marker):]))
