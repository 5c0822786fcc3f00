"""What running a suite produces: each request's exchange, each check's result, the report."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .suite import Check, Suite

TRUNCATE = 2000  # characters of a body kept in reports


@dataclass
class Exchange:
    """One request and what came back (or why nothing did)."""

    method: str
    url: str
    request_body: Any
    raw_body: str | None
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    text: str = ""
    body: Any = None  # parsed JSON, the assembled stream, or None
    chunks: list[Any] | None = None
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        sent = self.raw_body if self.raw_body is not None else self.request_body
        return {
            "method": self.method,
            "url": self.url,
            "body": _truncate_json(sent),
            "status": self.status,
            "seconds": round(self.seconds, 4),
            "error": self.error,
            "response": truncate(self.text),
        }


def truncate(text: str, limit: int = TRUNCATE) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def _truncate_json(value: Any) -> Any:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= TRUNCATE:
        return value
    return truncate(text)



PASS, FAIL, SKIP = "passed", "failed", "skipped"


@dataclass
class CheckResult:
    check: Check
    status: str = "pending"
    seconds: float = 0.0
    latency: float | None = None  # median request latency
    failures: list[str] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    message: str = ""

    @property
    def id(self) -> str:
        return self.check.id

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.check.id,
            "status": self.status,
            "tags": list(self.check.tags),
            "serial": self.check.serial,
            "description": self.check.description,
            "location": str(self.check.location),
            "seconds": round(self.seconds, 4),
            "latency_ms": None if self.latency is None else round(self.latency * 1000, 1),
            "message": self.message,
            "why": self.message if self.status == SKIP else None,
            "failures": list(self.failures),
            "exchanges": [e.to_json() for e in self.exchanges[:4]],
        }


@dataclass
class SmokeReport:
    run_id: str
    suite: Suite
    url: str
    tags: tuple[str, ...]
    results: list[CheckResult]
    started: float
    seconds: float
    run_dir: Path
    target: str | None = None
    profile: str | None = None
    log_tail: list[str] = field(default_factory=list)
    server_problem: str | None = None
    startup_seconds: float | None = None
    json_path: Path | None = None
    junit_path: Path | None = None
    not_selected: list[CheckResult] = field(default_factory=list)  # listed as skipped, not counted below
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(1 for r in self.results if r.status == PASS)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.status == FAIL)

    @property
    def skipped(self) -> int:
        return sum(1 for r in self.results if r.status == SKIP)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def summary_line(self) -> str:
        return summary_line(self.passed, self.failed, self.skipped)

    def every_check(self) -> list[CheckResult]:
        """The results of every check of the suite in its order: those run, and those the tags left out."""
        by_id = {r.check.id: r for r in (*self.results, *self.not_selected)}
        ordered = [by_id.pop(c.id) for c in self.suite.checks if c.id in by_id]
        return ordered + list(by_id.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite.name,
            "suite_path": str(self.suite.path),
            "url": self.url,
            "target": self.target,
            "profile": self.profile,
            "tags": list(self.tags),
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "not_selected": len(self.not_selected),
            "ok": self.ok,
            "params": dict(self.params),
            "seconds": round(self.seconds, 3),
            "startup_seconds": None if self.startup_seconds is None else round(self.startup_seconds, 3),
            "server_problem": self.server_problem,
            "summary": self.summary_line(),
            "checks": [r.to_json() for r in self.every_check()],
            "log_tail": list(self.log_tail),
        }


def summary_line(passed: int, failed: int, skipped: int = 0) -> str:
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    return line

