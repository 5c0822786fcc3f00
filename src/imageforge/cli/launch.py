"""The `imageforge` console script's entry: standard library only, so that it runs before anything a caller's
``PYTHONPATH`` could shadow (on the card's machine corex's ``PYTHONPATH`` holds its own yaml, numpy, ...).

Run with a ``PYTHONPATH`` holding more than imageforge's own folder, it runs itself again without it, the
caller's value kept in IMAGEFORGE_CALLER_PYTHONPATH (:class:`imageforge.settings.Settings` gives it back as
``PYTHONPATH`` to the target interpreter, scripts and server); then :func:`imageforge.cli.commands.main`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_CALLER_PYTHONPATH = "IMAGEFORGE_CALLER_PYTHONPATH"  # the same name as imageforge.settings'


def without_caller_pythonpath(environ: Mapping[str, str], own: str) -> dict[str, str] | None:
    """The environment to run imageforge itself in when the caller's ``PYTHONPATH`` holds more than ``own`` (the
    folder imageforge was imported from): ``PYTHONPATH`` cut to ``own`` (or dropped), the caller's value kept in
    IMAGEFORGE_CALLER_PYTHONPATH for the target interpreter, scripts and server. None: nothing to do."""
    value = environ.get("PYTHONPATH", "")
    if not value or ENV_CALLER_PYTHONPATH in environ:
        return None
    entries = [e for e in value.split(os.pathsep) if e]
    kept = [e for e in entries if os.path.realpath(e) == os.path.realpath(own)]
    if kept == entries:
        return None
    env = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
    env[ENV_CALLER_PYTHONPATH] = value
    if kept:
        env["PYTHONPATH"] = kept[0]
    return env


def main() -> None:
    own = str(Path(__file__).resolve().parents[2])
    env = without_caller_pythonpath(os.environ, own)
    if env is not None:
        script = sys.argv[0] if os.path.isfile(sys.argv[0]) else None  # the console script (else -m)
        os.execve(sys.executable, [sys.executable, *([script] if script else ["-m", "imageforge.cli.launch"]),
                                   *sys.argv[1:]], env)
    from .commands import main as run

    run()


if __name__ == "__main__":
    main()
