"""Print, one per line, the ``uv pip install`` options that make uv install what pip would on this machine.

pip's own configuration (its files and ``PIP_*`` variables, as ``pip config list`` shows them; a variable wins
over a file, as in pip) becomes uv's flags: index URLs, find-links and constraints. ``bootstrap.sh`` reads them; it
adds ``--index-strategy unsafe-best-match`` (pip's: the best version across every index, not the first index's).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
ORDER = (":env:", "site", "user", "global")  # pip's precedence, highest first


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=False).stdout
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if not sep or name not in FLAGS:
            continue
        rank = next((i for i, s in enumerate(ORDER) if scope.startswith(s)), len(ORDER))
        if name not in found or rank < found[name][0]:
            found[name] = (rank, " ".join(shlex.split(value)).split())
    for name, (_, values) in sorted(found.items()):
        for value in values:
            print(FLAGS[name])
            print(value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
