"""The evaluator's metrics over hand-made records; every expected value is worked out by hand in the comments.

The platform's figures of two official evaluator logs (facts note, "The replay's score") are reproduced from
records whose token totals over the wall time give the logged per-minute rates.
"""

from __future__ import annotations

import json

import pytest

from imageforge.bench.evaluator import (
    ERROR_CLASSES,
    TTFT_BUCKETS,
    RequestRecord,
    bucket_of,
    classify_http,
    classify_transport,
    evaluate,
    known_class,
    retryable_status,
)
from imageforge.bench.metrics import from_tpm, percentile, platform_score, score_shares, weighted_tps
from imageforge.bench.redlines import REDLINES, SOURCES, Redline, check, failing, gated_sources

# --------------------------------------------------------------------------- the platform's score


def test_the_weighted_rate_and_the_platforms_factor() -> None:
    assert weighted_tps(1, 0, 0) == pytest.approx(16.796)
    assert weighted_tps(0, 1, 0) == pytest.approx(2.799)
    assert weighted_tps(0, 0, 1) == pytest.approx(0.56)
    assert platform_score(1.0) == pytest.approx(38.582)
    # shares: 16.796 / (16.796 + 2.799 + 0.56) etc.
    shares = score_shares(1, 1, 1)
    assert shares is not None and sum(shares.values()) == pytest.approx(1.0)
    assert shares["output"] == pytest.approx(16.796 / 20.155)
    assert score_shares(0, 0, 0) is None


def _records_for(output_tpm: float, uncached_tpm: float, cached_tpm: float, minutes: float) -> list[RequestRecord]:
    """Two successful requests whose token totals over ``minutes`` give the three per-minute rates."""
    out, unc, cac = (round(x * minutes) for x in (output_tpm, uncached_tpm, cached_tpm))
    half = cac // 2
    return [RequestRecord(0, 200, ttft_s=30.0, total_s=60.0, prompt_tokens=unc // 2 + half,
                          completion_tokens=out // 2, cached_tokens=half),
            RequestRecord(1, 200, ttft_s=30.0, total_s=60.0, prompt_tokens=unc - unc // 2 + cac - half,
                          completion_tokens=out - out // 2, cached_tokens=cac - half)]


@pytest.mark.parametrize(("tpm", "weighted", "platform"), [
    ((697.7, 7415.1, 7759.2), 613.6, 23675.78),  # Sub 655 (the team's "600 points")
    ((420.0, 9356.5, 12918.2), 674.6, 26028.01),  # Sub 694
])
def test_the_official_logs_are_reproduced(tpm: tuple[float, float, float], weighted: float, platform: float) -> None:
    assert from_tpm(*tpm) == pytest.approx(weighted, rel=1e-3)
    assert platform_score(from_tpm(*tpm)) == pytest.approx(platform, rel=1e-3)
    # the same through evaluate(): 600 min of wall time, the tokens those rates make
    report = evaluate(_records_for(*tpm, minutes=600), wall_s=600 * 60)
    m = report.metrics
    assert (m["output_tpm"], m["uncached_input_tpm"], m["cached_tpm"]) == pytest.approx(tpm, rel=1e-4)
    assert m["weighted_tps"] == pytest.approx(weighted, rel=1e-3)
    assert m["platform_score"] == pytest.approx(platform, rel=1e-3)
    assert m["input_tpm"] == pytest.approx(tpm[1] + tpm[2], rel=1e-4)  # input = uncached + cached, never both


def test_sub_694_shares_prefill_dominates() -> None:
    m = evaluate(_records_for(420.0, 9356.5, 12918.2, minutes=600), wall_s=36000).metrics
    # 2.799 x 9356.5 / 40477.35 = 64.7 %; 0.56 x 12918.2 / ... = 17.9 %; 16.796 x 420 / ... = 17.4 %
    assert m["score_shares"]["uncached_input"] == pytest.approx(0.647, abs=0.001)
    assert m["score_shares"]["cached"] == pytest.approx(0.179, abs=0.001)
    assert m["score_shares"]["output"] == pytest.approx(0.174, abs=0.001)


# --------------------------------------------------------------------------- per request and aggregates


def test_per_request_rates_are_the_harness_definitions() -> None:
    r = RequestRecord(0, 200, ttft_s=40.0, total_s=48.8072, prompt_tokens=24546, completion_tokens=68,
                      cached_tokens=24000)
    assert r.output_tps == pytest.approx(68 / 48.8072)  # TTFT included
    assert r.input_tps == pytest.approx(24546 / 40.0)  # prompt / TTFT: a prefill rate, cached included
    assert r.uncached_tokens == 546
    assert RequestRecord(1, 200, total_s=2.0, prompt_tokens=100, completion_tokens=10).input_tps == 0.0  # no TTFT
    assert RequestRecord(2, None, "connection").output_tps == 0.0


RECORDS = [
    # ok: out 40/2 = 20 tok/s, in 1000/0.5 = 2000 tok/s
    RequestRecord(0, 200, ttft_s=0.5, total_s=2.0, prompt_tokens=1000, completion_tokens=40, cached_tokens=600),
    # ok, unfinished: out 40/4 = 10, in 8000/1 = 8000 (bucket 6k_16k)
    RequestRecord(1, 200, ttft_s=1.0, total_s=4.0, prompt_tokens=8000, completion_tokens=40, cached_tokens=1000,
                  finished=False),
    # ok, no cached_tokens reported (counts 0): out 150/5 = 30, in 3000/2 = 1500
    RequestRecord(2, 200, ttft_s=2.0, total_s=5.0, prompt_tokens=3000, completion_tokens=150),
    # failures: not in any rate or percentile, but in uptime and the error counts
    RequestRecord(3, 400, "http_400", "bad", total_s=0.1),
    RequestRecord(4, 503, "server_error", "down", total_s=900.0, attempts=4, retry_wait_s=35.0),
]


def test_evaluate_over_fixed_records() -> None:
    report = evaluate(RECORDS, wall_s=20.0, not_started=2)
    m = report.metrics
    assert (m["attempted_requests"], m["successful_requests"], m["not_started_requests"]) == (5, 3, 2)
    assert m["total_requests"] == 7 and m["uptime"] == pytest.approx(3 / 5)
    assert m["unfinished_requests"] == 1 and m["unfinished_rate"] == pytest.approx(1 / 5)
    assert m["error_class_counts"] == {"http_400": 1, "server_error": 1} and m["retried_requests"] == 1
    # per request, successful only: Output TPS 20, 10, 30; Input TPS 2000, 8000, 1500
    assert m["output_tps_mean"] == pytest.approx(20.0)
    assert m["output_tps_p10"] == pytest.approx(12.0)  # sorted 10, 20, 30: rank 0.2 -> 10 + 0.2 x 10
    assert m["input_tps_mean"] == pytest.approx(11500 / 3)
    # percentiles over the successful requests only (the 900 s failure is not in total_time_p99)
    assert m["ttft_p50_ms"] == pytest.approx(1000.0)
    assert m["total_time_p99_ms"] == pytest.approx(4000 + 0.98 * 1000)  # sorted 2, 4, 5 s: rank 1.98
    # aggregates over the wall time: prompt 12000 (cached 1600, the missing one 0), output 230
    assert (m["total_input_tokens"], m["total_cached_tokens"], m["total_uncached_input_tokens"]) == (
        12000, 1600, 10400)
    assert m["cached_tokens_missing"] == 1
    assert m["output_tokens_per_s"] == pytest.approx(230 / 20) and m["output_tpm"] == pytest.approx(230 * 3)
    assert m["uncached_input_tpm"] == pytest.approx(10400 * 3) and m["cached_tpm"] == pytest.approx(1600 * 3)
    expected = 16.796 * 11.5 + 2.799 * 520 + 0.56 * 80
    assert m["weighted_tps"] == pytest.approx(expected)
    assert m["platform_score"] == pytest.approx(expected * 38.582)
    assert m["cache_hit_rate"] == pytest.approx(1600 / 12000)
    # TTFT per input-length bucket: 1000 and 3000 tokens are < 6K, 8000 is 6K-16K
    assert m["ttft_lt_6k_count"] == 2 and m["ttft_lt_6k_avg_ms"] == pytest.approx(1250.0)
    assert m["ttft_6k_16k_count"] == 1 and m["ttft_6k_16k_p90_ms"] == pytest.approx(1000.0)
    assert m["ttft_ge_256k_count"] == 0 and m["ttft_ge_256k_p90_ms"] is None
    text = "\n".join(report.lines())
    assert "PLATFORM'S SCORE: weighted_tps" in text and "1 successful responses carried no cached_tokens" in text
    assert "unfinished 1" in text and "6k_16k n=1" in text


def test_no_key_but_the_platforms_ends_in_score() -> None:
    data = evaluate(RECORDS, wall_s=20.0).to_json()
    assert [k for k in data if k.endswith("score")] == ["platform_score"]
    assert {"weighted_tps", "platform_score", "score_shares", "output_tpm", "uncached_input_tpm", "cached_tpm",
            "input_tps_mean", "output_tps_p10", "ttft_p99_ms", "total_time_p99_ms", "unfinished_rate",
            "uptime"} <= set(data)
    json.dumps(data)  # plain JSON


def test_wall_time_is_the_denominator_not_the_sum_of_request_times() -> None:
    records = [RequestRecord(i, 200, ttft_s=1.0, total_s=2.0, prompt_tokens=100, completion_tokens=20,
                             cached_tokens=0) for i in range(3)]
    # 3 requests of 2 s each, but 60 s of wall time (gaps, back-off): 60 output tokens / 60 s
    assert evaluate(records, wall_s=60.0).metrics["output_tokens_per_s"] == pytest.approx(1.0)
    assert evaluate([], wall_s=0.0).metrics["weighted_tps"] == 0.0


def test_percentile_is_linear_between_ranks() -> None:
    assert percentile([10.0, 20.0, 30.0, 40.0], 10) == pytest.approx(13.0)  # rank 0.3
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None


def test_buckets_are_the_harnesss() -> None:
    assert [b[0] for b in TTFT_BUCKETS] == ["lt_6k", "6k_16k", "16k_32k", "32k_64k", "64k_128k", "128k_256k",
                                            "ge_256k"]
    assert bucket_of(6 * 1024 - 1) == "lt_6k" and bucket_of(6 * 1024) == "6k_16k"
    assert bucket_of(300_000) == "ge_256k" and bucket_of(0) is None


# --------------------------------------------------------------------------- error classes

VLLM_063_CTX = ("This model's maximum context length is 80000 tokens. However, you requested 94467 tokens "
                "(28931 in the messages, 65536 in the completion). Please reduce the length of the messages or "
                "completion.")


@pytest.mark.parametrize(("status", "body", "expected"), [
    (400, json.dumps({"object": "error", "message": VLLM_063_CTX}), "ctx_overflow"),
    (400, '{"error": {"message": "System message must be at the beginning."}}', "multi_system_template"),
    (400, '{"message": "1 validation error for ChatCompletionRequest: Extra inputs are not permitted"}',
     "request_validation"),
    (400, "Error in loading image data", "image_load"),
    (400, '{"message": "Invalid tool definition"}', "tool_schema"),
    (422, '{"detail": "nope"}', "request_validation"),
    (401, "", "auth"), (404, '{"detail": "Not Found"}', "not_found"), (413, "", "payload_too_large"),
    (429, "", "rate_limited"), (503, "", "server_error"),
    (400, '{"message": "top_p must be in (0, 1], got 1.1."}', "http_400"),
    (409, "", "http_409"),
])
def test_classify_http(status: int, body: str, expected: str) -> None:
    assert classify_http(status, body) == expected
    assert known_class(expected)


def test_transport_classes_and_what_is_retried() -> None:
    assert classify_transport(timed_out=True, got_response=False) == "timeout"
    assert classify_transport(timed_out=False, got_response=False) == "connection"
    assert classify_transport(timed_out=False, got_response=True) == "stream_aborted"
    assert {"ctx_overflow", "connection", "stream_aborted", "server_error", "timeout"} <= set(ERROR_CLASSES)
    assert [s for s in (200, 400, 404, 429, 500, 503) if retryable_status(s)] == [429, 500, 503]
    assert not known_class("nonsense") and not known_class("http_x")


def test_record_round_trips_and_rejects_unknown_classes() -> None:
    r = RECORDS[1]
    assert RequestRecord.from_json(r.to_json()) == r
    with pytest.raises(ValueError, match="unknown error class"):
        RequestRecord.from_json({**r.to_json(), "error_class": "nope"})


# --------------------------------------------------------------------------- redlines


def test_every_redline_names_its_source_and_reads_a_report_key() -> None:
    keys = set(evaluate(RECORDS, wall_s=20.0).metrics)
    assert {r.source for r in REDLINES} == set(SOURCES)
    assert all(r.key in keys for r in REDLINES)
    competition = [r for r in REDLINES if r.source == "competition"]
    assert [(r.key, r.threshold) for r in competition] == [("total_time_p99_ms", 999_999.0)]
    harness = {(r.key, r.op, r.threshold) for r in REDLINES if r.source == "harness"}
    assert harness == {("uptime", ">=", 0.95), ("ttft_p99_ms", "<=", 10_000.0),
                       ("total_time_p99_ms", "<=", 120_000.0), ("unfinished_rate", "<=", 0.05)}


def test_redline_verdicts_and_which_gate() -> None:
    # Sub 694-like: one request of 1,026,064 ms among fast ones, every one successful
    records = [RequestRecord(i, 200, ttft_s=1.0, total_s=5.0, prompt_tokens=100, completion_tokens=50,
                             cached_tokens=60) for i in range(20)]
    records.append(RequestRecord(20, 200, ttft_s=900.0, total_s=1026.064 * 1000, prompt_tokens=200_000,
                                 completion_tokens=5, cached_tokens=0))
    report = evaluate(records, wall_s=3600.0)
    verdicts = {(r.line.source, r.line.name): r.verdict for r in report.redlines}
    # p99 over 21 values: rank 19.8 -> 5 s + 0.8 x (1,026,064 - 5) s: far above both limits
    assert verdicts[("competition", "total time p99")] == "FAIL"
    assert verdicts[("harness", "total time p99")] == "FAIL" and verdicts[("harness", "uptime")] == "PASS"
    assert verdicts[("organisers", "Output TPS p10")] == "FAIL"  # rates ~0 and 20 x 10 tok/s: p10 (rank 2) = 10
    assert [r.line.source for r in failing(report.redlines, ["competition"])] == ["competition"]
    assert failing(report.redlines, []) == []
    assert gated_sources(["competition"], require_targets=False) == ("competition",)
    assert gated_sources(["competition"], require_targets=True) == ("competition", "organisers")
    assert gated_sources([], require_targets=False) == ()
    # a missing value is N/A: neither a pass nor a failure
    na = check({}, [Redline("x", "missing", ">=", 1.0, "", "harness")])
    assert na[0].verdict == "N/A" and failing(na, ["harness"]) == []
    assert "[competition]" in report.redlines[0].render()
