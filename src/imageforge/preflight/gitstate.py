"""What the submission would ship from git: a file it needs that is untracked or modified is a finding."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from .findings import Finding

_STATES = {"??": "untracked", "!!": "ignored", "A": "added, not committed", "M": "modified, not committed",
           "D": "deleted", "R": "renamed, not committed"}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)


def git_findings(files: Iterable[tuple[Path, str | None]], *, allow_dirty: bool) -> list[Finding]:
    """``files``: (host file the submission ships, the step it serves). Grouped by work tree; one warning per
    folder outside a git work tree. With ``allow_dirty`` the findings are warnings."""
    by_root: dict[Path, list[tuple[Path, str | None]]] = {}
    outside: dict[Path, str | None] = {}
    for path, step in files:
        path = path.resolve()
        top = _git(path.parent, "rev-parse", "--show-toplevel")
        if top.returncode != 0:
            outside.setdefault(path.parent, step)
            continue
        by_root.setdefault(Path(top.stdout.strip()), []).append((path, step))
    out: list[Finding] = []
    for folder, step in sorted(outside.items()):
        out.append(Finding("git-state", "shipped files outside a git work tree: what the platform gets is not known",
                           str(folder), step=step, severity="warning",
                           hint="keep the folder in the submission's repository (git add, commit)"))
    for root, entries in sorted(by_root.items()):
        rels = {p.relative_to(root).as_posix(): (p, step) for p, step in entries}
        status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored", "--",
                      *sorted(rels))
        for record in status.stdout.split("\0"):
            if len(record) < 4:
                continue
            code, rel = record[:2], record[3:]
            if rel not in rels:
                continue
            state = _STATES.get(code) or _STATES.get(code.strip()[:1], f"git status {code.strip()}")
            path, step = rels[rel]
            out.append(Finding("git-state", f"the submission needs this file, and it is {state}", str(path),
                               step=step, expected="committed, unchanged", found=f"git status {code.strip()}",
                               hint=f"git add {rel} && git commit (or --allow-dirty to go on)",
                               severity="warning" if allow_dirty else None))
    return out
