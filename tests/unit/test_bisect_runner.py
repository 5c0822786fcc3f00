"""bisect_target end to end with the Docker boundary faked (the build, the server): what bisect shows of its first
failing probe -- the failing checks' lines and the summary as ``smoke`` prints them, the paths of that probe's
smoke.json and log -- in its text, its JSON and bisect.json. The real builds and servers are
tests/integration/test_forensics_run.py's; the pure search is test_bisect.py's."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from imageforge.errors import EXIT_SMOKE, BuildError, SmokeError
from imageforge.forensics import bisect_runner, raise_for
from imageforge.forensics.bisect_runner import BisectRun, bisect_target
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.serve import container
from imageforge.smoke import run_suite

PORT = 9000  # the fake server of the image after step k answers on 127.0.0.1:PORT+k (no traffic: a MockTransport)

SUITE = """\
version: 1
name: probe
defaults: {tags: [dummy-ok]}
checks:
  - id: health
    request: {endpoint: /health}
    expect: {status: 200}
  - id: tools-required
    request:
      endpoint: /v1/chat/completions
      body: {model: m, messages: [{role: user, content: "Weather in Oslo?"}], tool_choice: required}
    expect:
      json:
        - {path: "$.choices[0].message.tool_calls", min_length: 1}
        - {path: "$.choices[0].message.tool_calls[0].function.name", equals: get_weather}
"""


def answer(broken_from: int) -> Callable[[httpx.Request], httpx.Response]:
    """A server whose tool-call parser is broken in the images after step ``broken_from`` and later."""

    def handle(request: httpx.Request) -> httpx.Response:
        k = (request.url.port or 0) - PORT
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/chat/completions":
            call = {"function": {"name": "get_weather", "arguments": "{}"}}
            message = ({"role": "assistant", "content": '<tool_call>{"name": "get_weather"}</tool_call>',
                        "tool_calls": []} if k >= broken_from else
                       {"role": "assistant", "content": None, "tool_calls": [call]})
            return httpx.Response(200, json={"choices": [{"index": 0, "message": message}]})
        return httpx.Response(404)

    return handle


def fake_docker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, broken_from: int = 2,
                unbuildable: int | None = None) -> None:
    """Builds tag the image after step k ``img-k`` (step ``unbuildable`` fails to build); each serves on its port.
    k = 0 is the base image itself (``base=True``, as `run --base` serves it): nothing is built for it."""

    def build(cut: Any, **kw: Any) -> Any:
        ids = [s.id for s in cut.steps]
        assert ids, "no image is built for k = 0: the base is served as it is"
        if len(ids) == unbuildable:
            raise BuildError(f"step {ids[-1]!r}: the patch's old text is not in the file")
        return SimpleNamespace(image_id=f"img-{len(ids)}", tags=(f"tag-{len(ids)}",), steps=(), built=0)

    @contextlib.contextmanager
    def serving(resolved: Any, *, image: str | None, base: bool, **kw: Any) -> Iterator[Any]:
        assert base == (image == "the-base"), (base, image)
        k = 0 if base else int(str(image).split("-")[1])
        yield SimpleNamespace(url=f"http://127.0.0.1:{PORT + k}", run_id=f"serve-{k}", run_dir=tmp_path / f"serve-{k}",
                              running=lambda: True, describe_state=lambda: "running", logs=lambda n: ["INFO: up"])

    monkeypatch.setattr(container, "build_target", build)  # the container runtime's prepare and serving
    monkeypatch.setattr(container, "image_for", lambda *a, **kw: "the-base")
    monkeypatch.setattr(container, "serving", serving)
    monkeypatch.setattr(bisect_runner, "run_suite", functools.partial(
        run_suite, transport=httpx.MockTransport(answer(broken_from))))


def run_bisect(write_manifest: Callable[..., Path], tmp_path: Path) -> tuple[BisectRun, list[str]]:
    (tmp_path / "probe.yaml").write_text(SUITE)
    resolved = resolve(load_manifest(write_manifest()), "t", "small", environ={})
    assert [s.id for s in resolved.steps] == ["over", "fix"]
    printed: list[str] = []
    run = bisect_target(resolved, container.ContainerRuntime(), suite_path=str(tmp_path / "probe.yaml"), environ={},
                        echo=printed.append)
    return run, printed


def test_the_first_failing_probe_shows_its_failing_checks_summary_report_and_log(
        write_manifest: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_docker(monkeypatch, tmp_path)
    run, printed = run_bisect(write_manifest, tmp_path)
    assert run.result.status == "found" and run.result.first_failing == 2
    assert run.culprit is not None and run.culprit.id == "fix"
    text = run.text()
    assert printed[-2] == text  # what bisect printed
    shown = text.split("probe k=2 (after step 2 fix")[1]  # the failing probe's block, after the culprit's
    assert re.search(r"^  FAIL  tools-required  .*tool_calls: length 0", shown, re.M), text  # as smoke prints it
    # both failure messages: the second one is not on the line
    assert re.search(r"^        - .*function\.name", shown, re.M), text
    assert re.search(r"^1 passed, 1 failed$", shown, re.M), text
    report = tmp_path / "serve-2" / "smoke.json"
    log = run.run_dir / "cut-2.log"
    assert f"report: {report}  log: {log}" in shown.splitlines()
    # short for a long suite: the passing checks' lines are in the log the output names, not in the output
    assert "PASS" not in text
    assert re.search(r"^  PASS  health\b", log.read_text(), re.M)
    assert re.search(r"^  FAIL  tools-required\b", log.read_text(), re.M)
    checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["tools-required"]["status"] == "failed"
    probe = {"k": 2, "report": str(report), "summary": "1 passed, 1 failed", "log": str(log),
             "failed": [{"id": "tools-required", "failures": checks["tools-required"]["failures"]}]}
    assert len(probe["failed"][0]["failures"]) == 2  # type: ignore[index]
    assert run.to_json()["failing_probe"] == probe  # `bisect --json`
    assert json.loads((run.run_dir / "bisect.json").read_text())["failing_probe"] == probe
    assert (run.run_dir / "bisect.txt").read_text() == text + "\n"
    # the error (exit 4) names the culprit and, first in what it found, every failing check of its probe
    with pytest.raises(SmokeError) as info:
        raise_for(run.result, "fix")
    assert info.value.exit_code == EXIT_SMOKE
    assert "found:    1 passed, 1 failed (tools-required)\ntools-required (" in info.value.render()


def test_a_failing_probe_without_a_smoke_run_shows_its_reason_and_log(
        write_manifest: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_docker(monkeypatch, tmp_path, broken_from=3, unbuildable=2)  # every image that builds passes
    run, _ = run_bisect(write_manifest, tmp_path)
    assert run.result.status == "found" and run.result.first_failing == 2
    shown = run.text().split("probe k=2 (after step 2 fix")[1].splitlines()
    assert shown[1] == ("  the image after step 2 did not build: step 'fix': the patch's old text is not in the "
                        "file")
    assert shown[2] == f"log: {run.run_dir / 'cut-2.log'}"
    assert run.to_json()["failing_probe"] == {"k": 2, "report": None, "summary": "", "failed": [],
                                              "log": str(run.run_dir / "cut-2.log")}


def test_a_failing_base_shows_its_probe_and_nothing_passing_does(
        write_manifest: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_docker(monkeypatch, tmp_path, broken_from=0)
    run, _ = run_bisect(write_manifest, tmp_path)
    assert run.result.status == "base-fails" and run.culprit is None
    assert re.search(r"^  FAIL  tools-required\b", run.text().split("probe k=0 (base")[1], re.M)
    assert run.to_json()["failing_probe"]["k"] == 0

    fake_docker(monkeypatch, tmp_path / "later", broken_from=3)
    passing, _ = run_bisect(write_manifest, tmp_path)
    assert passing.result.status == "final-passes"
    assert "probe k=" not in passing.text() and passing.to_json()["failing_probe"] is None
