"""The evaluator's metrics over hand-made records; every expected value is worked out by hand in the comments."""

from __future__ import annotations

import httpx
import pytest

from imageforge.bench.evaluator import (
    ERROR_CLASSES,
    RequestRecord,
    TargetLine,
    classify_error,
    evaluate,
)
from imageforge.bench.metrics import percentile

# --------------------------------------------------------------------------- the classifier

VLLM_063_CTX = ("This model's maximum context length is 80000 tokens. However, you requested 94467 tokens "
                "(28931 in the messages, 65536 in the completion). Please reduce the length of the messages or "
                "completion.")
EXTRA_FORBIDDEN = ('{"object":"error","message":"[{\'type\': \'extra_forbidden\', \'loc\': (\'body\', '
                   '\'max_completion_tokens\'), \'msg\': \'Extra inputs are not permitted\', \'input\': 512}]",'
                   '"type":"BadRequestError","code":400}')


@pytest.mark.parametrize(("status", "body", "exc", "completed", "expected"), [
    (200, None, None, True, None),
    (400, VLLM_063_CTX, None, True, "ctx_overflow"),
    (400, "'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is "
          "2048 tokens and your request has 120 input tokens", None, True, "ctx_overflow"),
    (400, EXTRA_FORBIDDEN, None, True, "request_validation"),
    (422, '{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}', None, True, "request_validation"),
    (400, '{"message": "top_p must be in (0, 1], got 1.1."}', None, True, "http_400"),
    (404, '{"detail": "Not Found"}', None, True, "http_400"),
    (500, "Internal Server Error", None, True, "server_error"),
    (503, "", None, True, "server_error"),
    (None, None, httpx.ConnectError("[Errno 111] Connection refused"), False, "connection"),
    (None, None, httpx.ConnectTimeout("timed out"), False, "connection"),
    (200, None, httpx.RemoteProtocolError("peer closed connection"), False, "stream_aborted"),
    (200, None, httpx.ReadTimeout("read timed out"), False, "stream_aborted"),
    (200, None, None, False, "stream_aborted"),
    (200, '{"message": "engine dead", "code": 500}', None, True, "stream_aborted"),
    (200, '{"message": "This model\'s maximum context length is 2048 tokens"}', None, True, "ctx_overflow"),
])
def test_classify_error(status: int | None, body: str | None, exc: BaseException | None, completed: bool,
                        expected: str | None) -> None:
    assert classify_error(status, body, exc, completed=completed) == expected


def test_classify_error_needs_something_to_classify() -> None:
    with pytest.raises(ValueError):
        classify_error(None, None, None)


def test_every_class_is_the_evaluators() -> None:
    assert set(ERROR_CLASSES) == {"ctx_overflow", "http_400", "connection", "request_validation", "server_error",
                                  "stream_aborted"}


# --------------------------------------------------------------------------- per request

def test_output_tps_includes_ttft() -> None:
    # 68 tokens over 48.8072 s total (the evaluator's log: out_tok=68 total=48807.2ms tps=1.4)
    r = RequestRecord(0, 200, ttft_s=40.0, total_s=48.8072, prompt_tokens=24546, completion_tokens=68,
                      cached_tokens=20000)
    assert r.output_tps == pytest.approx(1.3932, abs=1e-4)
    assert r.input_tps == pytest.approx(24546 / 48.8072)
    assert r.uncached_input_tps == pytest.approx(4546 / 48.8072)
    assert r.cache_tps == pytest.approx(20000 / 48.8072)


def test_rates_without_cache_figure_or_time() -> None:
    r = RequestRecord(0, 200, total_s=2.0, prompt_tokens=100, completion_tokens=10)
    assert r.cache_tps is None and r.uncached_input_tps is None
    assert RequestRecord(1, None, "connection", total_s=None).output_tps is None


def test_percentile_interpolates() -> None:
    assert percentile([10.0, 20.0, 30.0], 10) == pytest.approx(12.0)  # rank 0.2: 10 + 0.2 * 10
    assert percentile([0.5, 1.0, 2.0], 90) == pytest.approx(1.8)  # rank 1.8: 1 + 0.8 * 1
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


# --------------------------------------------------------------------------- the report

RECORDS = [
    # out 40/2 = 20, in 1000/2 = 500, uncached 400/2 = 200, cache 600/2 = 300
    RequestRecord(0, 200, ttft_s=0.5, total_s=2.0, prompt_tokens=1000, completion_tokens=40, cached_tokens=600),
    # out 40/4 = 10, in 2000/4 = 500, uncached 1000/4 = 250, cache 1000/4 = 250
    RequestRecord(1, 200, ttft_s=1.0, total_s=4.0, prompt_tokens=2000, completion_tokens=40, cached_tokens=1000),
    # out 150/5 = 30, in 3000/5 = 600, uncached 600/5 = 120, cache 2400/5 = 480
    RequestRecord(2, 200, ttft_s=2.0, total_s=5.0, prompt_tokens=3000, completion_tokens=150, cached_tokens=2400),
    RequestRecord(3, 400, "http_400", "bad", total_s=0.1),
]


def test_evaluate_hand_computed() -> None:
    rep = evaluate(RECORDS)
    assert (rep.attempted, rep.succeeded) == (4, 3)
    assert rep.success_rate == pytest.approx(0.75)
    assert rep.errors["http_400"] == 1 and sum(rep.errors.values()) == 1
    assert rep.output_tps_mean == pytest.approx(20.0)  # (20 + 10 + 30) / 3
    assert rep.output_tps_p10 == pytest.approx(12.0)  # sorted 10, 20, 30; rank 0.2
    assert rep.input_tps_mean == pytest.approx(1600 / 3)  # (500 + 500 + 600) / 3
    assert rep.uncached_input_tps_mean == pytest.approx(190.0)  # (200 + 250 + 120) / 3
    assert rep.cache_tps_mean == pytest.approx(1030 / 3)  # (300 + 250 + 480) / 3
    assert rep.cache_hit_rate == pytest.approx(4000 / 6000)  # (600 + 1000 + 2400) / (1000 + 2000 + 3000)
    assert rep.ttft_p50_s == pytest.approx(1.0)
    assert rep.ttft_p90_s == pytest.approx(1.8)
    # every request with a time counts: 100, 2000, 4000, 5000 ms; p99 rank 2.97 -> 4000 + 0.97 * 1000
    assert rep.total_p99_ms == pytest.approx(4970.0)
    assert rep.total_p50_ms == pytest.approx(3000.0)
    assert (rep.prompt_tokens, rep.cached_tokens, rep.completion_tokens) == (6000, 4000, 230)
    # 16.796 * 20 + 2.799 * 533.333 + 0.56 * 343.333 = 335.92 + 1492.8 + 192.2667
    assert rep.score_estimate == pytest.approx(2020.9867, abs=1e-3)
    # with Output TPS p10 (12): 201.552 + 1492.8 + 192.2667
    assert rep.score_estimate_p10 == pytest.approx(1886.6187, abs=1e-3)
    verdicts = {t.name: t.verdict for t in rep.targets}
    assert verdicts == {"Output TPS p10": "FAIL", "TTFT p90": "PASS", "cache hit rate": "PASS",
                        "success rate": "FAIL", "total time p99": "PASS"}
    assert not rep.passed


def test_report_lines_state_definitions_and_targets() -> None:
    text = "\n".join(evaluate(RECORDS).lines())
    assert "ESTIMATE" in text and "Output TPS mean" in text
    assert "total time incl. TTFT" in text and "uncached only: 190.00" in text
    assert "FAIL  Output TPS p10 >= 20.00 tok/s: 12.00 tok/s" in text
    assert "PASS  TTFT p90 <= 5.000 s: 1.800 s" in text
    assert "FAIL  success rate >= 99.00%: 75.00%" in text
    assert "PASS  total time p99 <= 999,999 ms: 4,970 ms" in text
    assert "http_400=1" in text


def test_no_cache_figure_means_unknown_not_zero() -> None:
    records = [RequestRecord(0, 200, ttft_s=0.1, total_s=1.0, prompt_tokens=100, completion_tokens=30)]
    rep = evaluate(records)
    assert rep.cache_hit_rate is None and rep.cache_tps_mean is None and rep.score_estimate is None
    assert {t.name: t.verdict for t in rep.targets}["cache hit rate"] == "N/A"
    assert not rep.passed  # N/A is not a pass
    assert "Cache TPS unknown" in "\n".join(rep.lines())


def test_all_pass() -> None:
    records = [RequestRecord(i, 200, ttft_s=0.2, total_s=1.0, prompt_tokens=1000, completion_tokens=25,
                             cached_tokens=600) for i in range(100)]
    rep = evaluate(records)
    assert rep.passed
    assert rep.score_estimate == pytest.approx(25 * 16.796 + 1000 * 2.799 + 600 * 0.56)


def test_redline_and_success_edges() -> None:
    assert TargetLine("total time p99", 999_999.0, "<=", 999_999.0, "ms").verdict == "PASS"
    assert TargetLine("total time p99", 1_026_064.0, "<=", 999_999.0, "ms").verdict == "FAIL"
    assert TargetLine("success rate", 0.99, ">=", 0.99, "%").verdict == "PASS"
    assert TargetLine("x", None, ">=", 1.0, "").verdict == "N/A"


def test_record_json_round_trip() -> None:
    r = RECORDS[3]
    assert RequestRecord.from_json(r.to_json()) == r
    with pytest.raises(ValueError):
        RequestRecord.from_json({**r.to_json(), "error_class": "nope"})
