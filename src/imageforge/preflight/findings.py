"""Findings: one defect each, with where, which check, what was expected and found, which step, and a hint.

The checks are data (:data:`CHECKS`: id -> default severity and what it looks for); a finding names its check
by id. The report renders like ruff or mypy (``path:line:col: severity[check] message``, then indented
``expected`` / ``found`` / ``step`` / ``hint`` lines), or as JSON. Errors fail the run (exit 3); warnings only
with ``--strict``; infos never.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Check:
    id: str
    severity: Severity
    what: str


#: Every check preflight runs, by id (the default severity; a finding may lower it, e.g. a dirty file with
#: --allow-dirty, a vendor name that only the vendor's own code uses).
CHECKS: dict[str, Check] = {c.id: c for c in (
    Check("validate", "error", "the manifest: YAML, schema, files, profiles (imageforge validate)"),
    Check("step", "error", "a step does not apply on the base image (check-patches)"),
    Check("script-failed", "error", "a script step exits non-zero in the sandbox (network off)"),
    Check("script-not-run", "info", "script steps an in-place preflight reads but does not run (it changes nothing)"),
    Check("final-state", "error", "a changed file fails what verify checks without importing"),
    Check("package-version", "error", "the base's package version differs from the manifest"),
    Check("flags", "error", "a serving flag the patched parser does not accept"),
    Check("submission", "error", "the submission tree cannot be made, or differs from what was checked"),
    Check("git-state", "error", "a file the submission ships is untracked or modified in git"),
    Check("py-syntax", "error", "a shipped or run .py does not parse or compile for the target's Python"),
    Check("py-import", "error", "an import that does not resolve in the final tree"),
    Check("py-import-unknown", "info", "an import whose name cannot be told statically (__getattr__, star import)"),
    Check("vendor-name", "error", "a name used on a vendor extension module that the vendor API record lacks"),
    Check("vendor-arity", "error", "a call to a vendor function whose arguments do not fit its recorded signature"),
    Check("call-replaced", "error", "a function installed at run time over a module's (mod.f = g, setattr) that "
          "does not accept a call of f in the final tree"),
    Check("vendor-latent", "warning", "the vendor's own code uses names the vendor API record lacks, where no changed "
          "code reaches them (one finding lists them all)"),
    Check("vendor-versions", "warning", "the base's versions differ from the vendor API record's"),
    Check("dead-file", "info", "a shipped .py that nothing imports and no step runs"),
    Check("sh-syntax", "error", "bash -n: a shell script that does not parse"),
    Check("shellcheck", "error", "a shellcheck finding that breaks builds (unset variable, cd without guard, ...)"),
    Check("crlf", "error", "a shipped text file with CRLF line endings"),
    Check("cp-source", "error", "the source of a cp/install line is not in the shipped folder"),
    Check("pin-stale", "error", "a pinned file's sha256 differs from its pin"),
    Check("pin-missing", "error", "a shipped binary (wheel, .so) without a pin"),
    Check("so-elf", "error", "a shipped .so the loader would refuse: not an x86-64 shared object, an undefined "
                             "symbol, a DT_NEEDED library or symbol version not found"),
    Check("build-device-import", "error", "a build-time step imports torch or a device library"),
    Check("run-exit-code", "error", "a Dockerfile RUN that throws the exit code of its command away"),
    Check("run-env-diagnostic", "warning", "a serving env variable that only adds logging, tracing or debugging"),
)}


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    path: str = ""
    line: int | None = None
    column: int | None = None
    step: str | None = None  # the step that produced the file
    expected: str | None = None
    found: str | None = None
    hint: str | None = None
    severity: Severity | None = None  # None: the check's default

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"unknown preflight check {self.check!r}")

    @property
    def level(self) -> Severity:
        return self.severity or CHECKS[self.check].severity

    def where(self) -> str:
        out = self.path or "<target>"
        if self.line is not None:
            out += f":{self.line}"
            if self.column is not None:
                out += f":{self.column}"
        return out

    def render(self) -> str:
        lines = [f"{self.where()}: {self.level}[{self.check}] {self.message}"]
        for label, value in (("expected", self.expected), ("found", self.found), ("step", self.step),
                             ("hint", self.hint)):
            if value:
                lines.append(f"    {label + ':':<10}" + value.replace("\n", "\n" + " " * 14))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.level, "message": self.message, "path": self.path,
                "line": self.line, "column": self.column, "step": self.step, "expected": self.expected,
                "found": self.found, "hint": self.hint}


@dataclass(frozen=True)
class PreflightReport:
    target: str
    profile: str | None
    findings: tuple[Finding, ...]
    strict: bool = False
    ran: tuple[str, ...] = ()  # the check groups that ran (what a clean report covered)
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, in order

    def counts(self) -> Counter[str]:
        return Counter(f.level for f in self.findings)

    @property
    def failing(self) -> tuple[Finding, ...]:
        bad: tuple[str, ...] = ("error", "warning") if self.strict else ("error",)
        return tuple(f for f in self.findings if f.level in bad)

    @property
    def ok(self) -> bool:
        return not self.failing

    def text(self) -> str:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        out = [f.render() for f in sorted(self.findings, key=lambda f: (order[f.level], f.path, f.line or 0))]
        out += [f"note: {n}" for n in self.notes]
        c = self.counts()
        facts = ", ".join(f"{v} {k}" for k, v in sorted(self.stats.items()))
        verdict = "ok" if self.ok else "FAILED"
        out.append(f"preflight {self.target}" + (f":{self.profile}" if self.profile else "")
                   + f": {verdict}: {c['error']} error(s), {c['warning']} warning(s), {c['info']} info"
                   + (f" ({facts})" if facts else "") + f" in {self.seconds:.1f} s"
                   + (" [--strict]" if self.strict else ""))
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        c = self.counts()
        return {"target": self.target, "profile": self.profile, "ok": self.ok, "strict": self.strict,
                "counts": {s: c[s] for s in SEVERITIES}, "ran": list(self.ran), "notes": list(self.notes),
                "stats": dict(self.stats), "seconds": round(self.seconds, 3), "phases": dict(self.phases),
                "findings": [f.to_json() for f in self.findings]}


def summary_line(findings: Sequence[Finding]) -> str:
    c = Counter(f.level for f in findings)
    return f"{c['error']} error(s), {c['warning']} warning(s)"


class PhaseClock:
    """A preflight run's clock: the phases done, in order, each with its seconds, and the run's total."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.ran: list[str] = []
        self.phases: dict[str, float] = {}
        self._last = self.start

    def mark(self, phase: str) -> None:
        """A phase done: its name in ``ran``, its seconds in ``phases``."""
        now = time.monotonic()
        self.ran.append(phase)
        self.phases[phase] = round(now - self._last, 2)
        self._last = now

    def elapsed(self) -> float:
        return time.monotonic() - self.start
