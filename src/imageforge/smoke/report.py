"""Reports of a smoke run: smoke.json, smoke-junit.xml, the failure texts and the verdict (exit 4)."""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import SmokeError
from ..serve.openai_wire import short
from .results import FAIL, SKIP, CheckResult, SmokeReport, truncate

Log = Callable[[str], None]

LOG_TAIL = 50


_ACCESS_LOG = re.compile(r'^(?:\(APIServer pid=\d+\) )?INFO:\s+\S+:\d+ - "')


def interesting_lines(lines: Sequence[str], n: int = LOG_TAIL) -> list[str]:
    """The last ``n`` log lines without uvicorn's access lines (they bury the traceback)."""
    return [line for line in lines if not _ACCESS_LOG.match(line)][-n:]


def failure_text(result: CheckResult, log_tail: Sequence[str] = ()) -> str:
    """Request, response and the server's last log lines of a failed check."""
    lines = [f"{result.check.id} ({result.check.location})"]
    if result.check.description:
        lines.append(f"  {result.check.description}")
    lines.extend(f"  - {f}" for f in result.failures)
    shown = [e for e in result.exchanges if e.error or e.status not in result.check.expect.status] or \
        result.exchanges[:1]
    for ex in shown[:2]:
        sent = ex.raw_body if ex.raw_body is not None else ex.request_body
        lines.append(f"  request:  {ex.method} {ex.url}")
        if sent is not None:
            body = sent if isinstance(sent, str) else json.dumps(sent, ensure_ascii=False)
            lines.append("    " + truncate(body, 800))
        if ex.error:
            lines.append(f"  response: none ({ex.error})")
        else:
            lines.append(f"  response: HTTP {ex.status} after {ex.seconds * 1000:.0f} ms")
            lines.append("    " + truncate(ex.text.strip(), 1200).replace("\n", "\n    "))
    if log_tail:
        lines.append(f"  server log (last {len(log_tail)} lines):")
        lines.extend("    | " + line for line in log_tail)
    return "\n".join(lines)


def write_reports(report: SmokeReport) -> tuple[Path, Path]:
    """``smoke.json`` and ``smoke-junit.xml`` in the run directory."""
    from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite

    report.run_dir.mkdir(parents=True, exist_ok=True)
    json_path = report.run_dir / "smoke.json"
    json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False, default=str) + "\n")
    suite = TestSuite(report.suite.name)
    suite.timestamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    suite.hostname = report.url
    for result in report.results:
        case = TestCase(result.check.id, classname=f"smoke.{report.suite.name}", time=round(result.seconds, 4))
        if result.status == FAIL:
            failure = Failure(_xml_safe("; ".join(result.failures)[:500]) or "failed")
            failure.text = _xml_safe(failure_text(result, report.log_tail))
            case.result = [failure]
        elif result.status == SKIP:
            case.result = [Skipped(_xml_safe(result.message or "skipped"))]
        case.system_out = _xml_safe(json.dumps([e.to_json() for e in result.exchanges[:2]], ensure_ascii=False))
        suite.add_testcase(case)
    suite.update_statistics()  # type: ignore[no-untyped-call]
    xml = JUnitXml()
    xml.add_testsuite(suite)
    junit_path = report.run_dir / "smoke-junit.xml"
    xml.write(str(junit_path), pretty=True)
    report.json_path, report.junit_path = json_path, junit_path
    return json_path, junit_path


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot carry control characters (random weights produce them)."""
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", text)



def print_failures(report: SmokeReport, echo: Log) -> None:
    failed = [r for r in report.results if r.status == FAIL]
    if not failed:
        return
    echo("")
    echo(f"failures ({len(failed)}):")
    for result in failed:
        echo(failure_text(result))
        echo("")
    if report.server_problem:
        echo(f"the server went away during the suite: {report.server_problem}")
    if report.log_tail:
        echo(f"server log (last {len(report.log_tail)} lines):")
        for line in report.log_tail:
            echo("  | " + line)
        echo("")


def verdict(report: SmokeReport) -> None:
    """Raise SmokeError (exit 4) when any check failed."""
    if report.ok:
        return
    names = ", ".join(r.check.id for r in report.results if r.status == FAIL)
    raise SmokeError(
        f"{report.failed} of {len(report.results)} smoke checks failed: {short(names, 300)}",
        found=report.server_problem,
        hint=f"the request, response and server log of each failure are above and in {report.json_path}",
    )

