"""One exception root for imageforge, with one exit code per kind of failure.

Every user-facing failure is an :class:`ImageforgeError` subclass.  The error carries
structured context (where, which key, what was expected, what was found, a hint) and
renders itself into a few readable lines; ``tasks.py`` prints that and exits with
``exit_code``.  Tracebacks are shown only with ``IMAGEFORGE_TRACEBACK=1`` / ``--traceback``.

Exit codes (also in the README):

====  ==========================================================
0     ok
2     config error: manifest, smoke suite, ``--set`` values
3     build error: patch anchors, script steps, verification
4     smoke or bench failure
5     infrastructure: no Docker daemon, a refused daemon request, missing base image, disk
130   interrupted (Ctrl-C)
====  ==========================================================
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_BUILD = 3
EXIT_SMOKE = 4
EXIT_INFRA = 5
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Location:
    """A place in a source file (1-based line and column)."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        out = self.file
        if self.line is not None:
            out += f":{self.line}"
            if self.column is not None:
                out += f":{self.column}"
        return out


@dataclass(frozen=True)
class Problem:
    """One problem inside an error that may report several (e.g. all schema errors)."""

    message: str
    location: Location | None = None
    key_path: str | None = None
    expected: str | None = None
    found: str | None = None
    hint: str | None = None

    def render(self) -> str:
        head = ""
        if self.location is not None:
            head += f"{self.location}: "
        if self.key_path:
            head += f"{self.key_path}: "
        lines = [head + self.message]
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found:    {self.found}")
        if self.hint:
            lines.append(f"  hint:     {self.hint}")
        return "\n".join(lines)


#: what a Problem says, and what every ImageforgeError carries under the same names
PROBLEM_FIELDS = tuple(f.name for f in dataclasses.fields(Problem))


class ImageforgeError(Exception):
    """Root of every error imageforge reports to a user."""

    exit_code: int = 1
    kind: str = "error"

    def __init__(
        self,
        message: str,
        *,
        location: Location | None = None,
        key_path: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        hint: str | None = None,
        problems: Sequence[Problem] = (),
        log_tail: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.location = location
        self.key_path = key_path
        self.expected = expected
        self.found = found
        self.hint = hint
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.log_tail: tuple[str, ...] = tuple(log_tail)

    def render(self) -> str:
        """Human-readable, multi-line description (no traceback)."""
        main = Problem(**{name: getattr(self, name) for name in PROBLEM_FIELDS}).render()
        out = [f"{self.kind}: {main}"]
        for problem in self.problems:
            out.append("  - " + problem.render().replace("\n", "\n    "))
        if self.log_tail:
            out.append("  last log lines:")
            out.extend("    | " + line for line in self.log_tail)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class ConfigError(ImageforgeError):
    """The manifest, a smoke suite or a CLI override is invalid (exit 2)."""

    exit_code = EXIT_CONFIG
    kind = "config error"


class BuildError(ImageforgeError):
    """A build step, a patch anchor or the verification failed (exit 3).

    ``log_tail`` carries the last lines of the failing step's output.
    """

    exit_code = EXIT_BUILD
    kind = "build error"


class SmokeError(ImageforgeError):
    """A smoke check, readiness wait or benchmark failed (exit 4)."""

    exit_code = EXIT_SMOKE
    kind = "smoke failure"


class InfraError(ImageforgeError):
    """Infrastructure is missing: Docker daemon, base image, disk space (exit 5)."""

    exit_code = EXIT_INFRA
    kind = "infrastructure error"


def require_extra(module: str, extra: str, what: str) -> None:
    """Fail (exit 5) naming the install extra when ``module`` (an optional dependency) is not installed."""
    if importlib.util.find_spec(module) is None:
        raise InfraError(f"{what} needs the Python package {module!r}, which is not installed",
                         hint=f"pip install 'imageforge[{extra}]' (the {extra!r} extra)")


@dataclass
class ErrorCollector:
    """Collects problems so validation can report all of them at once."""

    problems: list[Problem] = field(default_factory=list)

    def add(self, problem: Problem) -> None:
        self.problems.append(problem)

    def raise_if_any(self, message: str) -> None:
        if not self.problems:
            return
        if len(self.problems) == 1:
            raise ConfigError(**{name: getattr(self.problems[0], name) for name in PROBLEM_FIELDS})
        raise ConfigError(f"{message} ({len(self.problems)} problems)", problems=self.problems)
