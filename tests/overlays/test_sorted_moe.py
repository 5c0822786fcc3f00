"""sorted_moe.fused_experts (grouped-GEMM and sorted-loop paths) against a per-(token, slot) float64 loop.

Tolerances: overlay_reference.MOE_TOL (fp32 1e-4 / 1e-4; fp16 3e-3 / 3e-3; bf16 2.5e-2 abs / 2e-2 rel;
about 4x the largest error seen on O(1) outputs).
The low-precision paths round the gate/up output, the activation and the down output to the dtype
(as vLLM's fused MoE does), so bf16 carries three roundings of 2^-8 on O(1) values before the fp32
weighted sum.
"""

from __future__ import annotations

import pytest
import sorted_moe
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overlay_reference import DTYPES, MOE_TOL, assert_close, random_moe, reference_moe

IMPLS = ["grouped", "loop"]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "grouped" and not sorted_moe.grouped_mm_supported("cpu", torch.float32):
        pytest.skip(f"torch._grouped_mm unavailable on CPU in torch {torch.__version__}")
    return name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("num_tokens", "hidden", "inter", "num_experts", "top_k"), [
    (1, 64, 32, 256, 8),  # one token, 256 experts top-8: 248 empty experts
    (7, 128, 64, 256, 8),
    (40, 64, 48, 256, 8),
    (33, 32, 16, 8, 2),  # few experts, every expert busy
    (16, 64, 128, 4, 4),  # top-k == number of experts
])
def test_matches_reference(impl: str, dtype: torch.dtype, num_tokens: int, hidden: int, inter: int,
                           num_experts: int, top_k: int) -> None:
    gen = torch.Generator().manual_seed(num_tokens * 1000 + num_experts)
    x, w1, w2, weights, ids = random_moe(num_tokens, hidden, inter, num_experts, top_k, dtype, gen)
    got = sorted_moe.fused_experts(x, w1, w2, weights, ids, impl=impl)
    assert got.dtype == dtype and got.shape == x.shape
    assert_close(got, reference_moe(x, w1, w2, weights, ids), dtype, MOE_TOL)


def test_duplicate_routing_and_all_tokens_on_one_expert(impl: str) -> None:
    gen = torch.Generator().manual_seed(11)
    x, w1, w2, _, _ = random_moe(6, 64, 32, 256, 8, torch.float32, gen)
    ids = torch.full((6, 8), 255, dtype=torch.int32)  # every slot -> the last expert
    ids[0] = torch.tensor([3, 3, 3, 0, 0, 255, 3, 0])  # the same expert several times in one row
    weights = torch.rand(6, 8, generator=gen)
    got = sorted_moe.fused_experts(x, w1, w2, weights, ids, impl=impl)
    assert_close(got, reference_moe(x, w1, w2, weights, ids), torch.float32, MOE_TOL)


def test_grouped_and_loop_agree_bf16() -> None:
    if not sorted_moe.grouped_mm_supported("cpu", torch.bfloat16):
        pytest.skip("no CPU _grouped_mm")
    gen = torch.Generator().manual_seed(12)
    x, w1, w2, weights, ids = random_moe(24, 64, 32, 256, 8, torch.bfloat16, gen)
    a = sorted_moe.fused_experts(x, w1, w2, weights, ids, impl="grouped")
    b = sorted_moe.fused_experts(x, w1, w2, weights, ids, impl="loop")
    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_expert_map_drops_non_local_experts(impl: str) -> None:
    # Expert parallelism: 8 global experts, this rank holds global 2, 5, 6, 7 as local 0..3.
    gen = torch.Generator().manual_seed(13)
    x, w1, w2, weights, ids = random_moe(20, 64, 32, 8, 3, torch.float32, gen)
    expert_map = torch.full((8,), -1, dtype=torch.int32)
    expert_map[torch.tensor([2, 5, 6, 7])] = torch.arange(4, dtype=torch.int32)
    local_w1, local_w2 = w1[[2, 5, 6, 7]].contiguous(), w2[[2, 5, 6, 7]].contiguous()
    got = sorted_moe.fused_experts(x, local_w1, local_w2, weights, ids, global_num_experts=8,
                                   expert_map=expert_map, impl=impl)
    want = reference_moe(x, local_w1, local_w2, weights, ids, expert_map=expert_map)
    assert_close(got, want, torch.float32, MOE_TOL)
    # A token routed only to remote experts gets exactly 0.
    ids_remote = torch.tensor([[0, 1, 3]], dtype=torch.int32)
    out = sorted_moe.fused_experts(x[:1], local_w1, local_w2, weights[:1], ids_remote,
                                   expert_map=expert_map, impl=impl)
    assert torch.all(out == 0)


def test_router_weight_on_input_gelu_and_inplace(impl: str) -> None:
    gen = torch.Generator().manual_seed(14)
    x, w1, w2, weights, ids = random_moe(9, 64, 32, 16, 1, torch.float32, gen)
    weights = torch.rand(9, 1, generator=gen) + 0.5
    got = sorted_moe.fused_experts(x, w1, w2, weights, ids, activation="gelu",
                                   apply_router_weight_on_input=True, impl=impl)
    # Weight on the input: act(g(w x)) * u(w x), not w * act(g x) * u(x).
    want = reference_moe(x * weights, w1, w2, torch.ones_like(weights), ids, activation="gelu")
    assert_close(got, want, torch.float32, MOE_TOL)
    buf = x.clone()
    res = sorted_moe.fused_experts(buf, w1, w2, weights, ids, inplace=True, impl=impl)
    assert res.data_ptr() == buf.data_ptr()
    assert_close(buf, reference_moe(x, w1, w2, weights, ids), torch.float32, MOE_TOL)


def test_zero_tokens(impl: str) -> None:
    x = torch.zeros(0, 32)
    w1, w2 = torch.randn(4, 16, 32), torch.randn(4, 32, 8)
    out = sorted_moe.fused_experts(x, w1, w2, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64),
                                   impl=impl)
    assert out.shape == (0, 32)


def test_sort_pairs_is_stable_and_contiguous() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    weights = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    pairs = sorted_moe.sort_pairs(weights, ids, num_experts=4)
    # Expert 0: tokens 0, 2; expert 1: token 1; expert 2: tokens 0, 1, 2; expert 3: none.
    assert pairs.token_idx.tolist() == [0, 2, 1, 0, 1, 2]
    assert pairs.weights.tolist() == pytest.approx([0.2, 0.5, 0.4, 0.1, 0.3, 0.6])
    assert pairs.expert_ends.tolist() == [2, 3, 6, 6]
    assert bool(pairs.valid.all())


def test_feature_detection_and_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    has = hasattr(torch, "_grouped_mm")
    expected = has and any(sorted_moe.grouped_mm_supported("cpu", dt) for dt in DTYPES)
    assert expected == sorted_moe.GROUPED_MM_AVAILABLE
    x = torch.zeros(2, 64)
    w1, w2 = torch.zeros(4, 64, 64), torch.zeros(4, 64, 32)
    assert sorted_moe.select_impl(x, w1, w2, "loop") == "loop"
    expected_auto = "grouped" if sorted_moe.grouped_mm_supported("cpu", torch.float32) else "loop"
    assert sorted_moe.select_impl(x, w1, w2, "auto") == expected_auto
    # Unaligned rows (30 fp32 = 120 bytes, not a multiple of 16) keep "auto" on the loop.
    assert sorted_moe.select_impl(torch.zeros(2, 30), torch.zeros(4, 8, 30), torch.zeros(4, 30, 4)) == "loop"
    # Pretend the running torch lacks it: auto falls back, forcing "grouped" raises.
    monkeypatch.setitem(sorted_moe._GROUPED_MM_CACHE, ("cpu", None, torch.float32), False)
    assert sorted_moe.select_impl(x, w1, w2, "auto") == "loop"
    with pytest.raises(RuntimeError, match="_grouped_mm"):
        sorted_moe.select_impl(x, w1, w2, "grouped")
    with pytest.raises(ValueError):
        sorted_moe.select_impl(x, w1, w2, "fast")


def test_probe_fails_closed_without_grouped_mm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    assert sorted_moe._probe_grouped_mm(torch.device("cpu"), torch.float32) is False


def test_rejects_bad_shapes() -> None:
    x = torch.zeros(2, 64)
    with pytest.raises(ValueError):
        sorted_moe.fused_experts(x, torch.zeros(4, 64, 32), torch.zeros(4, 64, 16), torch.zeros(2, 1),
                                 torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(ValueError):
        sorted_moe.fused_experts(x, torch.zeros(4, 64, 64), torch.zeros(4, 64, 32), torch.zeros(2, 2),
                                 torch.zeros(2, 2, dtype=torch.int64), apply_router_weight_on_input=True)
    with pytest.raises(ValueError, match="activation"):
        sorted_moe.fused_experts(x, torch.zeros(4, 64, 64), torch.zeros(4, 64, 32), torch.zeros(2, 1),
                                 torch.zeros(2, 1, dtype=torch.int64), activation="relu")


GROUPED_SKIP = pytest.mark.skipif(not sorted_moe.grouped_mm_supported("cpu", torch.float32),
                                  reason=f"torch._grouped_mm unavailable on CPU in torch {torch.__version__}")


@pytest.mark.parametrize("impl_name", [pytest.param("grouped", marks=GROUPED_SKIP), "loop"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_tokens=st.integers(1, 24),
    num_experts=st.integers(1, 40),
    top_k=st.integers(1, 8),
    inter=st.sampled_from([4, 8, 24]),
    hidden=st.sampled_from([8, 16, 40]),
    seed=st.integers(0, 2**16),
)
def test_property_random_routing(impl_name: str, num_tokens: int, num_experts: int, top_k: int, inter: int,
                                 hidden: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, w1, w2, _, _ = random_moe(num_tokens, hidden, inter, num_experts, 1, torch.float32, gen)
    # Arbitrary routing, duplicates allowed (top_k may exceed num_experts).
    ids = torch.randint(0, num_experts, (num_tokens, top_k), generator=gen)
    weights = torch.rand(num_tokens, top_k, generator=gen)
    got = sorted_moe.fused_experts(x, w1, w2, weights, ids, impl=impl_name)
    assert_close(got, reference_moe(x, w1, w2, weights, ids), torch.float32, MOE_TOL)
