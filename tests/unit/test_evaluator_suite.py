"""smoke/evaluator.yaml without a server: the evaluator's 56 keys, its requests and its skip rules.

The keys, the values and the criteria expected below are written from the evaluator's public harness
(modelsphere/llm-bench, bench/tests/functional/functional_acceptance.py and long_output.py) and its logs
(shared/notes/bi100-vendor-facts.md), not read from the suite.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.errors import ConfigError
from imageforge.smoke import Runner, Suite, load_suite, run_suite

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "smoke" / "evaluator.yaml"

PRIMARY = ("dummy-ok", "real-weights", "info", "evaluator-skipped")
SEP = "--"  # NAME--VARIANT: a second form of the evaluator's check NAME

# The harness's 56 keys, in its order, with the tag each must carry here: dummy-ok where its own request
# and criterion hold on random weights, real-weights where they need a trained model's answer.
EVALUATOR: dict[str, str] = {
    "d01_basic_nostream": "real-weights",  # an answer or reasoning: random weights sampled may end on an EOS at once
    "d02_stream_usage": "real-weights",  # 5 lines: random weights sampled may end on an EOS within them
    "d03_tool_call": "real-weights",          # tool_choice auto: the model must decide to call
    "d04_reasoning": "real-weights",          # the answer must name 1 / one
    "d05_multimodal": "real-weights",         # the cpu model is text-only
    "d06_cache_hit": "dummy-ok",
    "d07_reasoning_plus_content": "real-weights",
    "d08_image_url_blocked": "evaluator-skipped",
    "d09_thinking_disable_top": "real-weights",  # the answer must hold "4"
    "d10_thinking_disable_ctk": "real-weights",
    "t1a_thinking_true": "real-weights",  # reasoning: a first token may be an EOS or </think>
    "t1b_thinking_false": "dummy-ok",
    "t1c_thinking_default": "real-weights",  # reasoning: a first token may be an EOS or </think>
    **{f"t2_temperature_{v}": "dummy-ok" for v in ("0_0", "1_0", "1_1", "2_0")},
    **{f"t2_top_p_{v}": "dummy-ok" for v in ("0_0", "0_01", "0_95", "1_0", "1_1")},
    **{f"t2_frequency_penalty_{v}": "dummy-ok" for v in ("neg2", "0", "2")},
    **{f"t2_presence_penalty_{v}": "dummy-ok" for v in ("neg2", "0", "2")},
    "t2_n_1": "dummy-ok",
    "t2_n_2": "dummy-ok",
    "t3_max_tokens_none": "real-weights",     # finish stop: random weights fill the context
    "t3_max_tokens_1": "dummy-ok",
    "t3_max_tokens_64": "real-weights",       # finish length: random weights may stop on an EOS first
    "t3_max_tokens_mid": "real-weights",
    "t3_max_tokens_max": "real-weights",
    "t3_max_tokens_neg1": "dummy-ok",
    "t3_max_tokens_over": "dummy-ok",
    "t4a_no_system": "real-weights",
    "t4b_system_control": "real-weights",
    "t5_function_calling": "real-weights",
    "t6_multi_turn": "real-weights",
    "t7_streaming_sse": "real-weights",  # 5 lines: random weights sampled may end on an EOS within them
    "t8_json_object": "real-weights",
    "t9_json_schema": "real-weights",
    "t10_stop_word": "real-weights",
    "t11a_no_auth": "evaluator-skipped",
    "t11b_wrong_auth": "evaluator-skipped",
    "t12_chinese": "real-weights",
    "t12_japanese": "real-weights",
    "t12_emoji": "real-weights",
    "t13_multimodal_base64": "real-weights",
    "t14_empty_body": "dummy-ok",
    "t15_idempotency_seed": "dummy-ok",
    "t16a_missing_role": "dummy-ok",
    "t16b_missing_content": "evaluator-skipped",
    "t16c_empty_messages": "dummy-ok",
}
# beyond the 56: what the replay sent, and the truncation module
EXTRA = {"max_completion_tokens": "dummy-ok", "reasoning_effort": "dummy-ok", "case_truncation": "dummy-ok"}
VENDOR_DIFFERS = {"t2_n_2", "max_completion_tokens", "reasoning_effort", "d06_cache_hit"}
# checks the harness sends with thinking off, temperature 0 and max_tokens 4096
THINKING_OFF_4096 = ("d03_tool_call", "t4a_no_system", "t4b_system_control", "t5_function_calling",
                     "t6_multi_turn", "t8_json_object", "t9_json_schema", "t12_chinese", "t12_japanese",
                     "t12_emoji", "t13_multimodal_base64", "t15_idempotency_seed")


@pytest.fixture(scope="module")
def suite() -> Suite:
    return load_suite(SUITE)


def test_the_56_keys_each_once_plus_extras_and_variants(suite: Suite) -> None:
    assert len(EVALUATOR) == 56
    plain = [c.id for c in suite.checks if SEP not in c.id]
    assert sorted(plain) == sorted([*EVALUATOR, *EXTRA])
    for c in suite.checks:
        if SEP in c.id:
            assert c.id.split(SEP)[0] in plain, c.id


def test_tags_are_as_documented(suite: Suite) -> None:
    for check in suite.checks:
        primary = [t for t in check.tags if t in PRIMARY]
        assert len(primary) == 1, f"{check.id}: {check.tags}"
        assert set(check.tags) <= {*PRIMARY, "vendor-differs"}, check.id
        if SEP not in check.id:
            assert primary[0] == {**EVALUATOR, **EXTRA}[check.id], check.id
        if "vendor-differs" in check.tags or primary[0] in ("info", "evaluator-skipped"):
            assert check.description, f"{check.id} must say why"
    assert {c.id for c in suite.checks if "vendor-differs" in c.tags} >= VENDOR_DIFFERS
    # every real-weights check has a dummy-ok variant exercising the same path, except the vision checks and d07
    no_variant = ("d05_multimodal", "t13_multimodal_base64", "d07_reasoning_plus_content")
    for name, tag in EVALUATOR.items():
        if tag == "real-weights" and name not in no_variant:
            assert any(c.id.startswith(name + SEP) and "dummy-ok" in c.tags for c in suite.checks), name
    for tag in PRIMARY:
        assert tag in suite.tag_notes


def test_parameters_default_to_the_evaluators(suite: Suite) -> None:
    assert suite.resolve_params() == {"max_context_tokens": 131072, "cache_min_prompt_tokens": 2048,
                                      "multimodal": "on", "truncation_tokens": 8192, "tool_choice_mode": "auto",
                                      "image_timeout_s": 300}
    assert suite.resolve_params(["max_context_tokens=2048", "multimodal=auto"])["max_context_tokens"] == 2048
    with pytest.raises(ConfigError, match="no parameter 'max_context_token'") as info:
        suite.resolve_params(["max_context_token=4"])
    assert "max_context_tokens" in str(info.value)
    with pytest.raises(ConfigError, match="max_context_tokens=12"):
        suite.resolve_params(["max_context_tokens=12"])  # the evaluator's minimum is 1024
    with pytest.raises(ConfigError, match="not NAME=VALUE"):
        suite.resolve_params(["max_context_tokens"])


def png_pixels(data: bytes) -> tuple[int, int, Callable[[int, int], tuple[int, ...]]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    assert (depth, colour) == (8, 2)  # 8-bit RGB
    raw = zlib.decompress(data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8])
    stride = 1 + 3 * width

    def pixel(x: int, y: int) -> tuple[int, ...]:
        assert raw[y * stride] == 0  # filter "none"
        start = y * stride + 1 + 3 * x
        return tuple(raw[start:start + 3])

    return width, height, pixel


def test_the_images_are_the_evaluators(suite: Suite) -> None:
    width, height, pixel = png_pixels(base64.b64decode(str(suite.vars["quadrants_png"])))
    assert (width, height) == (4096, 4096)
    assert [pixel(10, 10), pixel(4085, 10), pixel(10, 4085), pixel(4085, 4085), pixel(2047, 2047),
            pixel(2048, 2048)] == [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 0), (255, 255, 0)]
    width, height, pixel = png_pixels(base64.b64decode(str(suite.vars["red_png"])))
    assert (width, height, pixel(0, 0), pixel(63, 63)) == (64, 64, (255, 0, 0), (255, 0, 0))


# --------------------------------------------------------------------------- a fake server


def chat(content: str | None = "4", reasoning: str | None = None, finish: str = "stop",
         tool_calls: list[Any] | None = None, tokens: int = 3) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"id": "c", "object": "chat.completion", "model": "llm",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}}


class FakeEvaluatorServer:
    """A server named ``model``: /version answers when ``direct``; the thinking switches that work are
    ``switches`` (names as the harness's candidates); ``answer(body)`` may override a chat answer."""

    def __init__(self, model: str = "llm", *, direct: bool = True, thinks: bool = True,
                 switches: tuple[str, ...] = ("chat_template_kwargs.enable_thinking",),
                 answer: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None) -> None:
        self.model, self.direct, self.thinks, self.switches, self.answer = model, direct, thinks, switches, answer
        self.chats: list[dict[str, Any]] = []

    def thinking_off(self, body: dict[str, Any]) -> bool:
        ctk = body.get("chat_template_kwargs") or {}
        top = body.get("thinking")
        said = {"chat_template_kwargs.thinking": ctk.get("thinking") is False,
                "chat_template_kwargs.enable_thinking": ctk.get("enable_thinking") is False,
                "thinking.type": isinstance(top, dict) and top.get("type") == "disabled"}
        return any(said[s] for s in self.switches)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.model, "max_model_len": 131072}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.6.3"}) if self.direct else httpx.Response(404)
        if path == "/tokenize":
            return httpx.Response(200, json={"count": 3, "tokens": [1, 2, 3]})
        if path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content) if request.content else {}
        self.chats.append(body)
        custom = self.answer(body) if self.answer else None
        if custom is not None:
            return httpx.Response(200, json=custom)
        if self.thinks and not self.thinking_off(body):
            return httpx.Response(200, json=chat("4", reasoning="let me think"))
        return httpx.Response(200, json=chat("4"))


def prepared(suite: Suite, server: FakeEvaluatorServer, params: list[str] | None = None) -> Runner:
    runner = Runner(suite, "http://127.0.0.1:9", tags=("dummy-ok",), echo=lambda _: None,
                    transport=httpx.MockTransport(server), params=suite.resolve_params(params or []))
    runner.prepare()
    return runner


def bodies(suite: Suite, server: FakeEvaluatorServer, params: list[str] | None = None) -> dict[str, Any]:
    runner = prepared(suite, server, params)
    try:
        assert runner.setup_problems == []
        return {c.id: runner.render_request(c.request)[1] for c in suite.checks}
    finally:
        runner.close()


@pytest.mark.parametrize(("server", "off"), [
    # the platform's `llm`: probed; chat_template_kwargs.thinking changes nothing, enable_thinking wins
    (FakeEvaluatorServer(), {"chat_template_kwargs": {"enable_thinking": False}}),
    # the first candidate that works wins, alone
    (FakeEvaluatorServer(switches=("chat_template_kwargs.thinking", "chat_template_kwargs.enable_thinking")),
     {"chat_template_kwargs": {"thinking": False}}),
    # a model that does not think by default: no probe result, both spellings
    (FakeEvaluatorServer(thinks=False), {"chat_template_kwargs": {"thinking": False, "enable_thinking": False}}),
    # no candidate works on a bare engine: both spellings
    (FakeEvaluatorServer(switches=()), {"chat_template_kwargs": {"thinking": False, "enable_thinking": False}}),
    # behind a gateway (no /version) the top-level form is tried first
    (FakeEvaluatorServer(direct=False, switches=("thinking.type", "chat_template_kwargs.enable_thinking")),
     {"thinking": {"type": "disabled"}}),
    # by the model's name, no probe needed
    (FakeEvaluatorServer("Qwen3.6-35B", switches=()), {"chat_template_kwargs": {"enable_thinking": False}}),
    (FakeEvaluatorServer("kimi-k3", switches=()), {"chat_template_kwargs": {"thinking": False}}),
])
def test_the_thinking_switch_is_chosen_as_the_evaluator_does(suite: Suite, server: FakeEvaluatorServer,
                                                            off: dict[str, Any]) -> None:
    sent = bodies(suite, server)
    for name in ("t1b_thinking_false", "d09_thinking_disable_top", *THINKING_OFF_4096):
        body = sent[name]
        assert {k: body[k] for k in off} == off, name
        other = {"chat_template_kwargs", "thinking"} - set(off)
        assert not other & set(body), name
    on = json.loads(json.dumps(off).replace("false", "true").replace('"disabled"', '"enabled"'))
    assert {k: sent["t1a_thinking_true"][k] for k in on} == on
    assert not {"chat_template_kwargs", "thinking"} & set(sent["t1c_thinking_default"])


def test_the_evaluators_request_values(suite: Suite) -> None:
    sent = bodies(suite, FakeEvaluatorServer())
    for name in THINKING_OFF_4096:
        assert sent[name]["max_tokens"] == 4096 and sent[name]["temperature"] == 0, name
    assert sent["t15_idempotency_seed"]["seed"] == 42
    for name in ("d03_tool_call", "t5_function_calling"):
        assert sent[name]["tool_choice"] == "auto"
        assert all("strict" not in t["function"] for t in sent[name]["tools"])
    assert all("strict" not in json.dumps(b) for b in sent.values() if isinstance(b, dict))
    # t3 from max_context_tokens = 131072: reserve 2048
    assert "max_tokens" not in sent["t3_max_tokens_none"]
    assert [sent[f"t3_max_tokens_{k}"]["max_tokens"] for k in ("1", "64", "mid", "max", "neg1", "over")] == [
        1, 64, 65536, 129024, -1, 131073]
    assert sent["t10_stop_word"]["stop"] == ["15"] and sent["t10_stop_word"]["max_tokens"] == 100
    assert sent["t14_empty_body"] == {"model": "llm"}
    assert sent["t2_top_p_1_1"]["top_p"] == 1.1 and sent["t2_frequency_penalty_neg2"]["frequency_penalty"] == -2
    assert sent["t2_n_2"]["n"] == 2 and sent["t2_temperature_0_0"]["max_tokens"] == 20
    # the truncation case: 8192 tokens asked and forced
    truncation = sent["case_truncation"]
    assert truncation["max_tokens"] == truncation["min_tokens"] == 8192 and truncation["ignore_eos"] is True
    assert truncation["stream"] is True and truncation["stream_options"] == {"include_usage": True}
    # t13: the 4096x4096 image, 300 s (image_timeout_s)
    t13 = next(c for c in suite.checks if c.id == "t13_multimodal_base64")
    runner = prepared(suite, FakeEvaluatorServer())
    try:
        assert runner.timeout_of(t13.request) == 300.0
    finally:
        runner.close()
    url = sent["t13_multimodal_base64"]["messages"][0]["content"][1]["image_url"]["url"]
    assert url == "data:image/png;base64," + str(suite.vars["quadrants_png"])
    # d06: streamed, the second request 5 s after the first
    d06 = next(c for c in suite.checks if c.id == "d06_cache_hit")
    assert d06.reference is not None and d06.reference.delay == 5 and d06.request.stream and d06.serial


@pytest.mark.parametrize(("params", "t3", "repeats"), [
    ([], [65536, 129024, 131073], (2048 + 11) // 12),
    (["max_context_tokens=2048"], [1536, 1536, 2049], (1024 + 11) // 12),          # d06 capped at ctx - 1024
    (["max_context_tokens=4096", "cache_min_prompt_tokens=256"], [3072, 3072, 4097], (256 + 11) // 12),
    (["max_context_tokens=262144"], [65536, 260096, 262145], (2048 + 11) // 12),
    (["max_context_tokens=1100", "cache_min_prompt_tokens=64"], [825, 825, 1101], (64 + 11) // 12),
])
def test_parameters_set_t3_and_d06(suite: Suite, params: list[str], t3: list[int], repeats: int) -> None:
    sent = bodies(suite, FakeEvaluatorServer(), params)
    assert [sent[f"t3_max_tokens_{k}"]["max_tokens"] for k in ("mid", "max", "over")] == t3
    # t15: the evaluator's 4096 where the context is above it, else half the context
    assert sent["t15_idempotency_seed"]["max_tokens"] == (4096 if t3[2] - 1 > 4096 else (t3[2] - 1) // 2)
    prompt = sent["d06_cache_hit"]["messages"][0]["content"]
    sentence = str(suite.vars["cache_sentence"])
    assert prompt == sentence * repeats


# tool_choice_mode: the harness's _tool_call_check sends "auto" unless the mode is "named", which forces the one
# tool by name; it has no third mode
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(("params", "sent_choice"), [
    ([], "auto"),
    (["tool_choice_mode=auto"], "auto"),
    (["tool_choice_mode=named"], NAMED_WEATHER),
])
def test_tool_choice_mode_sets_what_d03_and_t5_send(suite: Suite, params: list[str], sent_choice: Any) -> None:
    sent = bodies(suite, FakeEvaluatorServer(), params)
    for name in ("d03_tool_call", "t5_function_calling"):
        assert sent[name]["tool_choice"] == sent_choice, name
        assert [t["function"]["name"] for t in sent[name]["tools"]] == ["get_weather"]
        assert all("strict" not in t["function"] for t in sent[name]["tools"])
    # the variants keep their own forms whatever the mode
    assert sent["d03_tool_call--named-no-think"]["tool_choice"] == NAMED_WEATHER
    assert sent["t5_function_calling--required-no-think"]["tool_choice"] == "required"
    with pytest.raises(ConfigError, match="tool_choice_mode=required"):
        suite.resolve_params(["tool_choice_mode=required"])  # not one of the harness's modes


def test_named_tool_choice_runs_d03_and_t5(suite: Suite, tmp_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Beijing"}'}}

    def answer(body: dict[str, Any]) -> dict[str, Any] | None:
        # a server that calls the tool only when forced by name
        forced = body.get("tool_choice") == NAMED_WEATHER
        return chat(None if forced else "It is sunny.", tool_calls=[call] if forced else [],
                    finish="tool_calls" if forced else "stop") if "tools" in body else None

    for check_id in ("d03_tool_call", "t5_function_calling"):
        named = run_one(suite, tmp_path / check_id / "named", check_id, answer, params=["tool_choice_mode=named"])
        auto = run_one(suite, tmp_path / check_id / "auto", check_id, answer)
        assert [r.status for r in named.results] == ["passed"], named.results[0].failures
        assert named.results[0].exchanges[0].request_body["tool_choice"] == NAMED_WEATHER
        assert [r.status for r in auto.results] == ["failed"]  # auto: this server answers in prose
        assert auto.results[0].exchanges[0].request_body["tool_choice"] == "auto"


def test_image_timeout_s_is_t13s_timeout(suite: Suite, tmp_path: Path) -> None:
    import time

    runner = prepared(suite, FakeEvaluatorServer(), ["image_timeout_s=600"])
    t13 = next(c for c in suite.checks if c.id == "t13_multimodal_base64")
    try:
        assert runner.timeout_of(t13.request) == 600.0
    finally:
        runner.close()
    with pytest.raises(ConfigError, match="image_timeout_s=0"):
        suite.resolve_params(["image_timeout_s=0"])

    def slow(body: dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(body.get("messages", [{}])[0].get("content"), list):
            time.sleep(0.6)  # the image request outlasts a 0.3 s timeout, not a 5 s one
            return chat("red, green, blue, yellow")
        return None

    quick = run_one(suite, tmp_path / "quick", "t13_multimodal_base64", slow, params=["image_timeout_s=0.3"])
    [result] = quick.results
    assert result.status == "failed" and "the check's timeout is 0.3s" in result.message
    patient = run_one(suite, tmp_path / "patient", "t13_multimodal_base64", slow, params=["image_timeout_s=5"])
    assert [r.status for r in patient.results] == ["passed"], patient.results[0].failures


# --------------------------------------------------------------------------- the evaluator's skip rules


def run_one(suite: Suite, tmp_path: Path, check_id: str, answer: Callable[[dict[str, Any]], dict[str, Any] | None],
            *, tags: tuple[str, ...] = ("real-weights",), params: list[str] | None = None) -> Any:
    one = Suite(path=suite.path, name=suite.name, description=None, vars=suite.vars, setup=suite.setup,
                checks=tuple(c for c in suite.checks if c.id == check_id), concurrency=1, schemas=suite.schemas,
                params=suite.params, tag_notes=suite.tag_notes)
    report = run_suite(one, "http://127.0.0.1:9", tags=tags, run_dir=tmp_path / "run", echo=lambda _: None,
                       live=False, transport=httpx.MockTransport(FakeEvaluatorServer(answer=answer)),
                       params=params)
    return report


def only_for(max_tokens: int, response: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    return lambda body: response if body.get("max_tokens") == max_tokens and body.get("temperature") == 0.3 else None


D07_CASES = [
    # reasoning and answer split by the parser: passed
    (chat("They meet after 2 hours, 120 miles from NYC.", reasoning="Closing speed 100 mph over 200 miles."),
     "passed", ""),
    # cut by max_tokens while reasoning: skipped, as the evaluator does
    (chat(None, reasoning="Let me think about trains " * 40, finish="length"), "skipped", "truncated before"),
    # no reasoning parser: the thinking stays inline in the content
    (chat("<think>Closing speed 100 mph.</think>They meet after 2 hours."), "skipped", "no parser split"),
    # a normal stop that lacks the answer: failed
    (chat("", reasoning="Closing speed is 100 mph, so two hours."), "failed", ""),
]


@pytest.mark.parametrize(("response", "status", "why"), D07_CASES)
def test_d07_skip_rules(suite: Suite, tmp_path: Path, response: dict[str, Any], status: str, why: str) -> None:
    report = run_one(suite, tmp_path, "d07_reasoning_plus_content", only_for(4096, response))
    result = report.results[0]
    assert result.status == status, result.failures
    assert why in result.message
    data = json.loads(report.json_path.read_text())
    listed = {c["id"]: c for c in data["checks"]}
    assert listed["d07_reasoning_plus_content"]["status"] == status
    if status == "skipped":
        assert why in listed["d07_reasoning_plus_content"]["why"]
        assert report.skipped == 1 and report.ok


def test_vision_checks_skip_when_multimodal_is_off_and_json_lists_every_check(suite: Suite, tmp_path: Path) -> None:
    report = run_one(suite, tmp_path, "t13_multimodal_base64", lambda body: None, params=["multimodal=off"])
    assert report.results[0].status == "skipped" and "vision off (multimodal=off)" in report.results[0].message
    sent = [b for b in report.results[0].exchanges]
    assert sent == []  # skipped before anything was sent
    # the whole suite, one tag: every check is in the JSON, the others skipped with why
    full = run_suite(suite, "http://127.0.0.1:9", tags=("info",), run_dir=tmp_path / "all", echo=lambda _: None,
                     live=False, transport=httpx.MockTransport(FakeEvaluatorServer()))
    assert full.json_path is not None
    data = json.loads(full.json_path.read_text())
    assert [c["id"] for c in data["checks"]] == [c.id for c in suite.checks]
    assert data["not_selected"] == len(suite.checks) - len(suite.select(["info"]))
    t2 = next(c for c in data["checks"] if c["id"] == "t2_n_2")
    assert t2["status"] == "skipped" and t2["why"].startswith("not selected: tagged dummy-ok, vendor-differs")
    d08 = next(c for c in data["checks"] if c["id"] == "d08_image_url_blocked")
    assert "skip_tests" in d08["why"]
    assert data["params"]["max_context_tokens"] == 131072


def test_t11_skips_on_a_bare_engine_without_a_key(suite: Suite, tmp_path: Path) -> None:
    report = run_one(suite, tmp_path, "t11a_no_auth", lambda body: None, tags=("evaluator-skipped",))
    assert report.results[0].status == "skipped" and "without --api-key" in report.results[0].message


def test_t10_and_d09_rules(suite: Suite, tmp_path: Path) -> None:
    only_reasoning = chat("", reasoning="1 2 3 4 5 6 7 8 9 10 11 12 13 14")
    report = run_one(suite, tmp_path / "a", "t10_stop_word", lambda body: only_reasoning)
    assert report.results[0].status == "skipped" and "no visible answer" in report.results[0].message
    counted = chat("1 2 3 4 5 6 7 8 9 10 11 12 13 14 ")
    assert run_one(suite, tmp_path / "b", "t10_stop_word", lambda body: counted).results[0].status == "passed"
    leaked = chat("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16")
    assert run_one(suite, tmp_path / "c", "t10_stop_word", lambda body: leaked).results[0].status == "failed"
    long_four = chat("The answer is 4. " * 10)
    result = run_one(suite, tmp_path / "d", "d09_thinking_disable_top", lambda body: long_four).results[0]
    assert result.status == "skipped" and "ambiguous" in result.message
    inline = chat("<think>two plus two</think>4")
    result = run_one(suite, tmp_path / "e", "d10_thinking_disable_ctk", lambda body: inline).results[0]
    assert result.status == "failed"  # inline thinking is reasoning: the switch was not honoured
    assert run_one(suite, tmp_path / "f", "d10_thinking_disable_ctk",
                   lambda body: chat("4")).results[0].status == "passed"


@pytest.mark.parametrize(("completion", "status"), [(7782, "passed"), (7781, "failed"), (8192, "passed")])
def test_case_truncation_passes_at_95_percent(suite: Suite, tmp_path: Path, completion: int, status: str) -> None:
    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions" and b"min_tokens" in request.content:
            events = [{"id": "c", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": "word"}, "finish_reason": None}]},
                {"id": "c", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {}, "finish_reason": "length"}]},
                {"id": "c", "object": "chat.completion.chunk", "choices": [],
                 "usage": {"prompt_tokens": 20, "completion_tokens": completion, "total_tokens": 20 + completion}}]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return FakeEvaluatorServer()(request)

    one = Suite(path=suite.path, name=suite.name, description=None, vars=suite.vars, setup=suite.setup,
                checks=tuple(c for c in suite.checks if c.id == "case_truncation"), concurrency=1,
                schemas=suite.schemas, params=suite.params, tag_notes=suite.tag_notes)
    report = run_suite(one, "http://127.0.0.1:9", tags=("dummy-ok",), run_dir=tmp_path / "run", echo=lambda _: None,
                       live=False, transport=httpx.MockTransport(server))
    assert report.results[0].status == status, report.results[0].failures
