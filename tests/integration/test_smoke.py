"""The smoke runner against real vLLM servers of the cpu target (and the faults it must report).

vLLM starts (30-50 s each on 2 cores): the session's shared server (conftest ``cpu_server``), which
``invoke smoke --target cpu`` end to end reuses (--reuse-servers), and a short one for the overlay that stops
``vllm serve`` from starting. "A patch that breaks tool-call parsing" (the suite on its image: FAIL
tools-required, its report) is test_forensics_run.py::test_bisect_finds_a_planted_break_within_the_bound's,
on bisect's failing probe (no start of its own). "A server
killed mid-suite" (``helpers.kill_mid_suite``) kills a server another claim has finished with:
test_forensics_run's planted image (scaled softmax) after its equiv comparison (no start of its own).
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.labels import L_RUN
from imageforge.smoke import load_suite, run_suite, target_vars
from tests.integration.helpers import free_port, hooks_for, labelled

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.M)


def summary(output: str) -> tuple[int, int, int]:
    found = SUMMARY.findall(output)
    assert found, "no closing line `N passed, N failed` in the output"
    passed, failed, skipped = found[-1]
    return int(passed), int(failed), int(skipped or 0)


# ----------------------------------------------------------------------------- the shared server


def test_dummy_suite_passes_on_the_cpu_image(cpu_server: Any, cpu_resolved: Any, tmp_path: Path) -> None:
    from junitparser import JUnitXml

    suite = load_suite(REPO / "smoke" / "dummy.yaml")
    lines: list[str] = []
    report = run_suite(suite, cpu_server.url, tags=("dummy-ok",), run_dir=tmp_path / "run",
                       vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lines.append, live=False)
    failures = [f"{r.check.id}: {r.failures}" for r in report.results if r.status != "passed"]
    assert report.ok, failures
    assert report.passed >= 30 and report.failed == 0 and report.skipped == 0
    assert f"{report.passed} passed, 0 failed" in lines
    assert report.seconds <= 60, f"health OK to verdict took {report.seconds:.1f}s"
    data = json.loads((tmp_path / "run" / "smoke.json").read_text())
    assert data["summary"] == f"{report.passed} passed, 0 failed"
    xml = next(iter(JUnitXml.fromfile(str(tmp_path / "run" / "smoke-junit.xml"))))
    assert xml.tests == report.passed and xml.failures == 0 and xml.errors == 0


def test_invoke_smoke_url_against_a_running_server(cpu_server: Any, invoke_cli: Callable[..., Any]) -> None:
    cli = invoke_cli("smoke", "--url", cpu_server.url, "--target", "cpu")
    assert cli.code == 0, cli.output
    passed, failed, _ = summary(cli.output)
    assert passed >= 30 and failed == 0
    match = re.search(r"report: (\S+/smoke\.json)\s+junit: (\S+\.xml)", cli.output)
    assert match and Path(match.group(1)).is_file() and Path(match.group(2)).is_file()


def test_check_exceeding_its_timeout(cpu_server: Any, tmp_path: Path) -> None:
    suite_path = tmp_path / "slow.yaml"
    suite_path.write_text(textwrap.dedent("""\
        version: 1
        setup:
          - {id: models, request: {endpoint: /v1/models}, bind: {model: "$.data[0].id"}}
        checks:
          - id: too-slow
            request:
              endpoint: /v1/completions
              body: {model: "${model}", prompt: "long", max_tokens: 1500, ignore_eos: true}
              timeout: 0.5
            expect: {status: 200}
          - id: still-fine
            request: {endpoint: /health}
            expect: {status: 200}
        """))
    lines: list[str] = []
    t0 = time.monotonic()
    report = run_suite(load_suite(suite_path), cpu_server.url, run_dir=tmp_path / "run", echo=lines.append,
                       live=False)
    assert time.monotonic() - t0 < 30
    by_id = {r.check.id: r for r in report.results}
    assert by_id["too-slow"].status == "failed" and by_id["still-fine"].status == "passed"
    assert "timed out after" in by_id["too-slow"].failures[0]
    assert "timeout is 0.5s" in by_id["too-slow"].failures[0]
    assert "1 passed, 1 failed" in lines
    assert httpx.get(f"{cpu_server.url}/health", timeout=10).status_code == 200


# ----------------------------------------------------------------------------- no vLLM needed


def test_unreachable_url(invoke_cli: Callable[..., Any]) -> None:
    port = free_port()
    cli = invoke_cli("smoke", "--url", f"http://127.0.0.1:{port}", "--suite", "smoke/dummy.yaml")
    assert cli.code == 4
    assert f"no server answers at http://127.0.0.1:{port}" in cli.output
    assert "Connection refused" in cli.output and "invoke run" in cli.output
    assert "Traceback" not in cli.output


@pytest.fixture
def stub_500() -> Iterator[str]:
    """A local stub that answers every request with HTTP 500 (for the 500 test only)."""

    class Handler(BaseHTTPRequestHandler):
        def _fail(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            payload = b'{"error": {"message": "stub: internal error", "code": 500}}'
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _fail

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_server_answering_500s(stub_500: str, invoke_cli: Callable[..., Any]) -> None:
    cli = invoke_cli("smoke", "--url", stub_500, "--suite", "smoke/dummy.yaml", timeout=120)
    assert cli.code == 4
    passed, failed, skipped = summary(cli.output)
    assert passed == 0 and failed >= 30
    assert "warning: setup models (GET /v1/models) failed: HTTP 500" in cli.output
    assert "status 500, expected 200" in cli.output
    assert "the server is down: GET /health -> HTTP 500" in cli.output
    assert "response: HTTP 500" in cli.output and "stub: internal error" in cli.output
    report = Path(re.findall(r"report: (\S+/smoke\.json)", cli.output)[-1])
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["failed"] == failed
    # the smoke command's error path for failing checks (a vLLM whose patch broke tool calls: test_forensics_run's
    # bisect): the count and the failing checks' ids after "smoke failure:"
    error = cli.output.split("smoke failure:")[1]
    assert re.match(rf" {failed} of {passed + failed + skipped} smoke checks failed: \W?health, version, ", error)
    assert "Traceback" not in cli.output


@pytest.mark.parametrize("text, line, fragment", [
    ("version: 1\nchecks:\n  - id: x\n    request: {endpoint: /health}\n    expect: {staus: 200}\n",
     5, "did you mean"),
    ("version: 1\nchecks:\n  - id: x\n    request: {endpoint: /health\n", 5, "invalid YAML"),
    ("version: 1\nchecks:\n  - id: x\n    request: {endpoint: /health}\n    expect:\n"
     "      relations: ['status ==']\n", 6, "invalid expression"),
])
def test_bad_suite_file(invoke_cli: Callable[..., Any], tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    cli = invoke_cli("smoke", "--url", "http://127.0.0.1:9", "--suite", str(path))
    assert cli.code == 2, cli.output
    assert re.search(rf"{re.escape(str(path))}:{line}(:\d+)?:", cli.output), cli.output
    assert fragment in cli.output
    assert "Traceback" not in cli.output


# ----------------------------------------------------------------------------- servers of their own


def test_invoke_smoke_target_end_to_end(cpu_server: Any, invoke_cli: Callable[..., Any]) -> None:
    """`smoke --target cpu` as a user runs it: resolve, build (cached), a server, the target's whole suite, in
    float32 with --reuse-servers: the server is the session's ``cpu_server`` (the same image ID and run options),
    reused and left running (it costs no vLLM start of its own). A start of `smoke`'s own that reaches /health
    ("ready ... after Ns") and is removed after its suite is the sweep's first point's
    (test_bench.py::test_two_point_sweep_of_the_cpu_target: the same ``serving()``); `smoke`'s own start that is
    interrupted, or that stops before /health, is test_run.py's and this module's next test."""
    cli = invoke_cli("smoke", "--target", "cpu", "--profile", "conservative", "--set", "dtype=float32",
                     "--reuse-servers")
    assert cli.code == 0, cli.output
    passed, failed, _ = summary(cli.output)
    assert passed >= 30 and failed == 0
    assert f"reusing {cpu_server.name} on {cpu_server.url}" in cli.output
    assert f"ready: {cpu_server.url}/health OK ({cpu_server.name} reused)" in cli.output
    assert f"left {cpu_server.name} running" in cli.output and cpu_server.running()
    # A start that reached /health (cpu_server's, at the session's start) recorded the served content's
    # imports as verified.
    from imageforge.docker_engine import client
    from imageforge.verify import verified_contents, verified_label_content

    content = verified_label_content(client().images.get(cpu_server.container.image.id).labels)
    assert content is not None and content in verified_contents()


def test_overlay_that_stops_vllm_serve_from_starting(cpu_variant: Callable[..., Path], invoke_cli: Callable[..., Any],
                                                     remove_images: list[str]) -> None:
    image = "imageforge-test/cpu-no-serve"
    remove_images.append(image)
    manifest = cpu_variant(image, steps=[{
        "id": "break-serve",
        "kind": "overlay",
        "why": "fault test: the API server module raises when imported",
        "source": "faults/entry.py",
        "dest": "vllm/entrypoints/launchers/api_server/entry.py",
    }], files={"faults/entry.py": 'raise RuntimeError("imageforge fault test: the API server cannot start")\n'})
    cli = invoke_cli("smoke", "--manifest", str(manifest), "--target", "cpu", timeout=600)
    assert cli.code == 4, cli.output
    assert "stopped before it was ready" in cli.output
    assert re.search(r"found:\s+status exited, exit code [1-9]", cli.output)
    assert "last log lines:" in cli.output
    assert "RuntimeError: imageforge fault test: the API server cannot start" in cli.output
    assert "hint:" in cli.output and "server.log" in cli.output
    assert "step 'break-serve' (overlay, " in cli.output
    # The build did not import (built now: "imports: at first start"; or a cached layer), the start names
    # the step.
    assert "imports ok" not in cli.output
    assert re.search(r"smoke failure: \S+build\.yaml:\d+(?::\d+)?: targets\.cpu\.steps\[\d+\]: vLLM did not "
                     r"start: RuntimeError in vllm/entrypoints/launchers/api_server/entry\.py line 1, written by "
                     r"step 'break-serve' \(overlay\)", cli.output), cli.output
    name = re.search(r"started imageforge-cpu-(\S+) from", cli.output)
    assert name and labelled({L_RUN: name.group(1)}) == []
    assert "Traceback (most recent call last)" not in cli.output.split("last log lines:")[0]


# test_patch_that_breaks_tool_call_parsing moved (its claims, on bisect's failing probe) to
# test_forensics_run.py::test_bisect_finds_a_planted_break_within_the_bound: one vLLM start fewer.
