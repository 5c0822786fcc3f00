"""Images of step subsets: what bisect's cuts and ablate's variants build and serve.

:func:`subset_resolved` is the resolved target with only some of its steps (a prefix for bisect, "all but a step
and its dependents" for ablate), the same verify and serving config on top, tagged in ``<image>-bisect`` /
``<image>-ablate`` so the target's own tags never move.  Cache keys chain from the base and ignore the image name,
so a prefix is all cache hits up to its last step and only its verify + config layers are new (once).
Verification imports only the listed modules the kept steps still provide: a listed module whose file is the
``dest`` of a dropped overlay step is left out (it is not in that image, by design).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, ImageforgeError
from ..steps import kind

if TYPE_CHECKING:
    from ..manifest.model import Step
    from ..manifest.resolve import Resolved

Log = Callable[[str], None]


def provided_module(path: str) -> str | None:
    """The module a package-relative file is (``a/b/c.py`` and ``a/b/c/__init__.py`` -> ``a.b.c``; an extension
    module ``a/b/c.cpython-311-x86_64-linux-gnu.so`` or ``c.abi3.so`` or ``c.so`` -> ``a.b.c``), else None."""
    folder, _, name = path.rpartition("/")
    if name == "__init__.py":
        return folder.replace("/", ".") or None
    stem = name[:-3] if name.endswith(".py") else name.split(".", 1)[0] if name.endswith(".so") else None
    return None if not stem else ".".join([*(folder.split("/") if folder else []), stem])


def kept_imports(imports: Sequence[str], dropped: Sequence[Step]) -> tuple[str, ...]:
    """``imports`` without the modules only a dropped step provides (its kind's ``provides``: an overlay's file, a
    native step's extension modules)."""
    gone = {provided_module(p) for s in dropped for p in kind(s.kind).provides(s)}
    return tuple(m for m in imports if m not in gone)


def subset_resolved(resolved: Resolved, keep: Sequence[str], *, suffix: str) -> Resolved:
    """``resolved`` with only the steps in ``keep`` (manifest order kept), tagged in ``<image>-<suffix>``."""
    known = {s.id for s in resolved.steps}
    unknown = [k for k in keep if k not in known]
    if unknown:
        raise ConfigError(f"unknown step id(s) {', '.join(unknown)}", expected="one of " + ", ".join(known))
    wanted = set(keep)
    dropped = [s for s in resolved.steps if s.id not in wanted]
    target = resolved.target
    verify = dataclasses.replace(target.verify, imports=kept_imports(target.verify.imports, dropped))
    target = dataclasses.replace(target, image=f"{target.image}-{suffix}", verify=verify)
    return dataclasses.replace(
        resolved, target=target,
        shared_steps=tuple(s for s in resolved.shared_steps if s.id in wanted),
        profile_steps=tuple(s for s in resolved.profile_steps if s.id in wanted),
    )


def step_label(step: Step, k: int) -> str:
    return f"after step {k} {step.id} ({step.location})"


def first_line(exc: ImageforgeError) -> str:
    """An error's message and what was found, on one line (a failing cut's or run's reason)."""
    return exc.message + (f" ({exc.found})" if exc.found else "")


def file_log(path: Path) -> Log:
    """A log that appends each line to ``path`` (a cut's, a build's, the servers' log): quiet on the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    return log
