"""equiv: the pure comparison and the gate, with expectations computed by hand; the client on a fake transport."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from imageforge.equiv import (
    EquivError,
    Evidence,
    Position,
    PromptEvidence,
    collect_against,
    collect_reference,
    compare,
    first_divergence,
    gate,
    position,
    raise_if_failed,
)
from imageforge.equiv.compare import compare_position, nearest_rank
from imageforge.errors import EXIT_SMOKE, SmokeError
from imageforge.manifest.tolerances import DEFAULT_TOLERANCES, Tolerance

LN = math.log


def pos(token: int, probs: dict[int, float]) -> Position:
    return position(token, {t: LN(p) for t, p in probs.items()})


def evidence(url: str, positions: list[list[Position]], greedy: list[tuple[int, ...]], k: int = 2) -> Evidence:
    prompts = []
    for i, (ps, g) in enumerate(zip(positions, greedy, strict=True)):
        seq = (1, *(p.token_id for p in ps))
        prompts.append(PromptEvidence(f"p{i}", (1,), seq, tuple(ps), g))
    return Evidence(url, "m", k, tuple(prompts))


# --------------------------------------------------------------------------- one position


def test_identical_positions_have_zero_deltas_full_agreement_and_zero_kl() -> None:
    p = pos(7, {7: 0.5, 8: 0.3, 9: 0.1})
    d = compare_position(p, p, 2)
    assert d.deltas == (0.0, 0.0)
    assert d.missing == 0 and d.top1_agree
    assert d.kl == 0.0


def test_deltas_over_the_reference_top_k_and_the_lumped_kl_by_hand() -> None:
    ref = pos(7, {7: 0.5, 8: 0.3, 9: 0.1})  # top-2: 7 (0.5), 8 (0.3); tail 0.2
    cand = pos(7, {7: 0.4, 8: 0.4, 9: 0.1})  # tie for first between 7 and 8; tail 0.2
    d = compare_position(ref, cand, 2)
    assert d.deltas == pytest.approx((abs(LN(0.5) - LN(0.4)), abs(LN(0.3) - LN(0.4))))
    # KL over {7, 8, tail}: 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2)
    assert d.kl == pytest.approx(0.5 * LN(1.25) + 0.3 * LN(0.75))
    assert d.top1_agree  # 7 ties for the candidate's best: agreement
    swapped = pos(7, {7: 0.3, 8: 0.5, 9: 0.1})
    assert not compare_position(ref, swapped, 2).top1_agree


def test_a_reference_token_the_candidate_did_not_return_is_scored_at_its_smallest_logprob() -> None:
    ref = pos(7, {7: 0.6, 8: 0.2})
    cand = pos(7, {7: 0.6, 5: 0.3})  # 8 missing; the candidate's smallest returned prob is 0.3
    d = compare_position(ref, cand, 2)
    assert d.missing == 1
    assert d.deltas == pytest.approx((0.0, abs(LN(0.2) - LN(0.3))))


def test_nearest_rank_percentile() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20: ceil(0.95 * 20) = 19th smallest
    assert nearest_rank(values, 0.95) == 19.0
    assert nearest_rank([3.0], 0.95) == 3.0
    assert nearest_rank([5.0, 1.0, 3.0], 0.5) == 3.0


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([4], [5]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2


# --------------------------------------------------------------------------- whole comparison


def two_prompts() -> tuple[Evidence, Evidence]:
    ref = evidence("http://ref", [
        [pos(7, {7: 0.5, 8: 0.3}), pos(8, {8: 0.9, 7: 0.05})],
        [pos(3, {3: 0.7, 4: 0.2})],
    ], [(7, 8), (3,)])
    cand = evidence("http://cand", [
        [pos(7, {7: 0.5, 8: 0.3}), pos(8, {8: 0.9, 7: 0.05})],  # identical
        [pos(3, {3: 0.35, 4: 0.4})],  # the top-1 flips; |d| = ln 2 and ln 2
    ], [(7, 8), (4,)])
    return ref, cand


def test_compare_aggregates_per_prompt_and_pooled() -> None:
    ref, cand = two_prompts()
    c = compare(ref, cand)
    p0, p1 = c.prompts
    assert p0.stats.max_abs == 0.0 and p0.stats.top1 == 1.0 and p0.first_divergence is None
    assert p1.stats.max_abs == pytest.approx(LN(2))
    assert p1.stats.top1_agree == 0 and p1.first_divergence == 0
    assert p1.worst_position == 1
    o = c.overall
    assert o.positions == 3 and o.pairs == 6
    assert o.mean_abs == pytest.approx(2 * LN(2) / 6)
    assert o.p95_abs == pytest.approx(LN(2))  # ceil(0.95*6) = 6th smallest of 6 = the largest
    assert o.top1_agree == 2 and o.top1 == pytest.approx(2 / 3)
    kl1 = 0.7 * LN(0.7 / 0.35) + 0.2 * LN(0.2 / 0.4) + 0.1 * LN(0.1 / 0.25)
    assert o.kl_mean == pytest.approx(kl1 / 3)
    assert c.diverged == 1


def test_compare_refuses_different_sequences() -> None:
    ref, cand = two_prompts()
    other = Evidence(cand.url, "m", 2, (cand.prompts[0], PromptEvidence("p1", (1,), (1, 9), cand.prompts[1].positions,
                                                                        (4,))))
    with pytest.raises(EquivError) as info:
        compare(ref, other)
    assert "p1" in str(info.value) and info.value.exit_code == EXIT_SMOKE
    empty = Evidence("r", "m", 2, ())
    with pytest.raises(EquivError, match="compared nothing"):
        compare(empty, empty)


# --------------------------------------------------------------------------- the gate


def test_float32_gate_is_tight_on_the_max() -> None:
    ref, cand = two_prompts()
    verdict = gate(compare(ref, ref), DEFAULT_TOLERANCES["float32"], "float32")
    assert verdict.passed and {c.name for c in verdict.checks} == {"max_abs", "mean_abs", "p95_abs", "top1"}
    verdict = gate(compare(ref, cand), DEFAULT_TOLERANCES["float32"], "float32")
    assert not verdict.passed
    failed = {c.name for c in verdict.checks if not c.passed}
    assert failed == {"max_abs", "mean_abs", "p95_abs", "top1"}
    with pytest.raises(EquivError) as info:
        raise_if_failed(verdict)
    assert isinstance(info.value, SmokeError) and info.value.exit_code == EXIT_SMOKE
    assert "max_abs" in info.value.render() and "top1" in info.value.render()


def bf16_like(n: int, outlier: float, flips: int) -> tuple[Evidence, Evidence]:
    """n positions; the candidate differs by 0.01 everywhere, once by ``outlier``, with ``flips`` top-1 flips."""
    ref_ps, cand_ps = [], []
    for i in range(n):
        ref_ps.append(position(5, {5: -0.5, 6: -1.5}))
        d = outlier if i == 0 else 0.01
        if i < flips:
            cand_ps.append(position(5, {5: -1.5 + 0.01, 6: -0.5 + 0.01}))
        else:
            cand_ps.append(position(5, {5: -0.5 - d, 6: -1.5 + 0.01}))
    return evidence("r", [ref_ps], [(5,)]), evidence("c", [cand_ps], [(5,)])


def test_bf16_gate_ignores_one_large_outlier_but_not_a_shifted_mean_or_flips() -> None:
    tol = DEFAULT_TOLERANCES["bfloat16"]
    assert tol.max_abs is None
    ref, cand = bf16_like(100, outlier=0.67, flips=0)  # the measured bf16 max between two correct kernels
    verdict = gate(compare(ref, cand), tol, "bfloat16")
    assert verdict.passed, verdict.text()
    assert verdict.comparison.overall.max_abs == pytest.approx(0.67)
    ref, cand = bf16_like(100, outlier=0.67, flips=10)  # 90% top-1 agreement
    verdict = gate(compare(ref, cand), tol, "bfloat16")
    assert not verdict.passed
    assert {c.name for c in verdict.checks if not c.passed} >= {"top1"}


def test_a_scaled_softmax_is_caught_by_both_gates() -> None:
    # logits scaled by 1.5 (a "temperature" bug): p' = softmax(1.5 * logits)
    logits = [2.0, 1.0, 0.5, -1.0]

    def dist(scale: float) -> dict[int, float]:
        z = sum(math.exp(scale * x) for x in logits)
        return {t: scale * x - math.log(z) for t, x in enumerate(logits)}

    ref = evidence("r", [[position(0, dist(1.0)) for _ in range(8)]], [(0,)], k=3)
    cand = evidence("c", [[position(0, dist(1.5)) for _ in range(8)]], [(0,)], k=3)
    for dtype in ("float32", "bfloat16"):
        verdict = gate(compare(ref, cand), DEFAULT_TOLERANCES[dtype], dtype)
        assert not verdict.passed, verdict.text()
    assert compare(ref, cand).overall.top1 == 1.0  # the argmax survives: only the deltas catch it


def test_reports() -> None:
    ref, cand = two_prompts()
    verdict = gate(compare(ref, cand), Tolerance(mean_abs=1.0), "bfloat16")
    assert verdict.passed
    data = verdict.to_json()
    json.dumps(data)
    assert data["passed"] is True and data["overall"]["pairs"] == 6
    assert [p["name"] for p in data["prompts"]] == ["p0", "p1"]
    assert data["prompts"][1]["first_divergence"] == 0
    text = verdict.text()
    assert "overall" in text and "PASS mean_abs" in text and "equiv PASSED" in text
    assert "top-1 agreement 2/3" in text
    assert "no gate configured" in gate(compare(ref, cand), Tolerance(), "float32").text()


def test_evidence_round_trips_through_json() -> None:
    ref, _ = two_prompts()
    again = Evidence.from_json(json.loads(json.dumps(ref.to_json())))
    assert again == ref


# --------------------------------------------------------------------------- the client (fake server)


class FakeVllm:
    """Answers /v1/models, /tokenize and /v1/completions the way vLLM does; logprobs from ``dist``."""

    def __init__(self, dist: Callable[[tuple[int, ...]], dict[int, float]], vocab: int = 10) -> None:
        self.dist = dist
        self.vocab = vocab
        self.bodies: list[dict[str, Any]] = []

    def greedy_next(self, prefix: tuple[int, ...]) -> int:
        d = self.dist(prefix)
        return max(d, key=lambda t: (d[t], -t))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        body = json.loads(request.content)
        self.bodies.append(body)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [ord(c) % self.vocab for c in body["prompt"]]})
        ids = tuple(body["prompt"])
        if body.get("prompt_logprobs") is not None:
            k = body["prompt_logprobs"]
            out: list[Any] = [None]
            for i in range(1, len(ids)):
                d = self.dist(ids[:i])
                ranked = sorted(d, key=lambda t: (-d[t], t))
                entry = {str(t): {"logprob": d[t], "rank": r + 1, "decoded_token": "x"}
                         for r, t in enumerate(ranked) if r < k or t == ids[i]}
                out.append(entry)
            return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": out}]})
        seq = list(ids)
        for _ in range(body["max_tokens"]):
            seq.append(self.greedy_next(tuple(seq)))
        gen = seq[len(ids):]
        return httpx.Response(200, json={"choices": [{"text": "", "logprobs": {
            "tokens": [f"token_id:{t}" for t in gen]}}]})


def model_dist(scale: float) -> Callable[[tuple[int, ...]], dict[int, float]]:
    def dist(prefix: tuple[int, ...]) -> dict[int, float]:
        logits = {t: scale * math.sin(sum(prefix) * 0.7 + t * 1.3) for t in range(10)}
        z = math.log(sum(math.exp(v) for v in logits.values()))
        return {t: v - z for t, v in logits.items()}

    return dist


def test_client_collects_teacher_forced_evidence_and_the_same_model_passes() -> None:
    ref_server, cand_server = FakeVllm(model_dist(2.0)), FakeVllm(model_dist(2.0))
    ref = collect_reference("http://ref", ["hello", [3, 4, 5]], top_k=3, greedy_tokens=4,
                            transport=httpx.MockTransport(ref_server))
    first = ref.prompts[0]
    assert first.prompt_ids == tuple(ord(c) % 10 for c in "hello")
    assert len(first.greedy) == 4 and first.sequence == first.prompt_ids + first.greedy
    assert len(first.positions) == len(first.sequence) - 1
    assert ref.prompts[1].prompt_ids == (3, 4, 5)
    # what was asked: greedy at temperature 0 with EOS ignored, then prompt_logprobs over prompt + continuation
    greedy_body, lp_body = ref_server.bodies[1], ref_server.bodies[2]
    assert greedy_body["temperature"] == 0.0 and greedy_body["ignore_eos"] is True and greedy_body["max_tokens"] == 4
    assert lp_body["prompt_logprobs"] == 3 and lp_body["max_tokens"] == 1 and lp_body["prompt"] == list(first.sequence)
    cand = collect_against("http://cand", ref, transport=httpx.MockTransport(cand_server))
    assert [p.sequence for p in cand.prompts] == [p.sequence for p in ref.prompts]
    assert not any("prompt" in b and isinstance(b["prompt"], str) for b in cand_server.bodies)  # ids only
    verdict = gate(compare(ref, cand), DEFAULT_TOLERANCES["float32"], "float32")
    assert verdict.passed and verdict.comparison.overall.max_abs == 0.0


def test_client_against_a_changed_model_fails_the_gate() -> None:
    ref = collect_reference("http://ref", ["hello world"], top_k=3, greedy_tokens=6,
                            transport=httpx.MockTransport(FakeVllm(model_dist(2.0))))
    cand = collect_against("http://cand", ref, transport=httpx.MockTransport(FakeVllm(model_dist(2.2))))
    verdict = gate(compare(ref, cand), DEFAULT_TOLERANCES["float32"], "float32")
    assert not verdict.passed


def test_client_errors_are_smoke_errors() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(400, json={"error": "prompt_logprobs not allowed"})

    with pytest.raises(SmokeError) as info:
        collect_reference("http://x", [[1, 2, 3]], top_k=2, greedy_tokens=0, transport=httpx.MockTransport(broken))
    assert "400" in str(info.value)

    def no_logprobs(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": None}]})

    with pytest.raises(SmokeError) as info:
        collect_reference("http://x", [[1, 2, 3]], top_k=2, greedy_tokens=0,
                          transport=httpx.MockTransport(no_logprobs))
    assert "prompt_logprobs" in str(info.value)


def test_float32_noise_of_a_pure_retune_passes_the_float32_gate() -> None:
    # two correct MoE kernels in float32 differ by ~4e-6 (measured): a retune must not be flagged
    ref_ps = [position(5, {5: -0.2, 6: -2.0, 7: -3.0}) for _ in range(50)]
    cand_ps = [position(5, {5: -0.2 + 4e-6 * (-1) ** i, 6: -2.0 - 3e-6, 7: -3.0 + 1e-6}) for i in range(50)]
    verdict = gate(compare(evidence("r", [ref_ps], [(5,)], k=3), evidence("c", [cand_ps], [(5,)], k=3)),
                   DEFAULT_TOLERANCES["float32"], "float32")
    assert verdict.passed, verdict.text()
    assert verdict.comparison.overall.max_abs == pytest.approx(4e-6, rel=1e-3)


# --------------------------------------------------------------------------- equiv_target's orchestration (fakes)


@pytest.mark.parametrize("scale", [2.0, 2.2])  # the same model (passes), a changed one (fails: reported, no raise)
def test_equiv_target_builds_the_candidate_serves_both_sides_compares_and_removes_both(
        scale: float, write_manifest: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``equiv --against base`` in Docker mode with the daemon faked at the runner's boundary (build, start, wait,
    remove; the two servers answer through fake transports): what is built, how each side is started, the order,
    the reports and the removal of both. The comparison on real servers: tests/integration/test_forensics_run.py."""
    from types import SimpleNamespace

    from imageforge.equiv import runner
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve

    resolved = resolve(load_manifest(write_manifest()), "t", "small", environ={})
    assert resolved.serving_args().get("dtype") is None
    events: list[tuple[str, Any]] = []
    servers = {"http://ref:1": FakeVllm(model_dist(2.0)), "http://cand:2": FakeVllm(model_dist(scale))}

    def build(res: Any, **kw: Any) -> Any:
        events.append(("build", (res.target.image, res.serving_args()["dtype"])))
        return SimpleNamespace(image_id="sha256:cand", tags=("t-equiv:small",), steps=(), built=0)

    def start(res: Any, *, base: bool = False, image: str | None = None, run_id: str = "", **kw: Any) -> Any:
        side = "ref" if run_id.endswith("-ref") else "cand"
        events.append(("start", (side, base, image, res.serving_args()["dtype"])))
        return SimpleNamespace(url=f"http://{side}:{1 if side == 'ref' else 2}", side=side)

    from imageforge.serve import container

    monkeypatch.setattr(container, "build_target", build)  # the container runtime's prepare builds
    monkeypatch.setattr(container, "image_for", lambda res, environ, log, base=False: "vllm-base:1")
    monkeypatch.setattr(container, "start_server", start)
    monkeypatch.setattr(container, "wait_ready", lambda server, **kw: events.append(("ready", server.side)))
    monkeypatch.setattr(container, "remove_server", lambda server, **kw: events.append(("remove", server.side)))
    monkeypatch.setattr(runner, "collect_reference", lambda url, *a, **kw: collect_reference(
        url, *a, **kw, transport=httpx.MockTransport(servers[url])))
    monkeypatch.setattr(runner, "collect_against", lambda url, ref, **kw: collect_against(
        url, ref, **kw, transport=httpx.MockTransport(servers[url])))
    settings = dataclasses.replace(resolved.target.equiv, prompts=("hello", "abc def"), top_k=3, greedy_tokens=4)
    lines: list[str] = []
    result = runner.equiv_target(resolved, container.ContainerRuntime(), settings=settings, echo=lines.append)
    image = resolved.target.image
    # the candidate is built in float32 under <image>-equiv; the base side is not built; reference started first
    assert events == [("build", (f"{image}-equiv", "float32")), ("start", ("ref", True, "vllm-base:1", "float32")),
                      ("start", ("cand", False, "sha256:cand", "float32")), ("ready", "ref"), ("ready", "cand"),
                      ("remove", "ref"), ("remove", "cand")]
    assert result.reference.url == "http://ref:1" and result.candidate.url == "http://cand:2"
    assert result.verdict.passed is (scale == 2.0) and result.verdict.dtype == "float32"
    assert result.labels == ("t:small", "base image (serving config only)")
    assert result.run_dir is not None and result.run_dir.parent == resolved.manifest.root / ".imageforge" / "runs"
    saved = json.loads((result.run_dir / "equiv.json").read_text())
    assert saved["passed"] is (scale == 2.0) and saved["dtype"] == "float32"
    assert {p.name for p in result.run_dir.iterdir()} == {"equiv.txt", "equiv.json", "evidence-reference.json",
                                                          "evidence-candidate.json"}
    assert lines[0].startswith("equiv t:small vs base image (serving config only): 2 prompts, top-3, 4 greedy")
    assert any(line.startswith("reports: ") for line in lines)


def test_equiv_target_removes_both_servers_when_one_never_gets_ready(write_manifest: Callable[..., Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from imageforge.equiv import runner
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve

    resolved = resolve(load_manifest(write_manifest()), "t", "small", environ={})
    removed: list[str] = []

    def ready(server: Any, **kw: Any) -> None:
        if server.side == "cand":
            raise SmokeError("the candidate's server did not start")

    from imageforge.serve import container

    monkeypatch.setattr(container, "build_target", lambda res, **kw: SimpleNamespace(
        image_id="sha256:cand", tags=("t-equiv:small",), steps=(), built=0))

    def start(res: Any, *, run_id: str = "", **kw: Any) -> Any:
        return SimpleNamespace(url="http://x", side="ref" if run_id.endswith("-ref") else "cand")

    monkeypatch.setattr(container, "image_for", lambda res, environ, log, base=False: "vllm-base:1")
    monkeypatch.setattr(container, "start_server", start)
    monkeypatch.setattr(container, "wait_ready", ready)
    monkeypatch.setattr(container, "remove_server", lambda server, **kw: removed.append(server.side))
    with pytest.raises(SmokeError, match="did not start"):
        runner.equiv_target(resolved, container.ContainerRuntime(), echo=lambda _: None)
    assert removed == ["ref", "cand"]
