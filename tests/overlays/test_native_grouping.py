"""sorted_moe with the cpu target's native grouping kernel: the pinned binary itself (overlays/cpu/native), loaded
after torch as the image loads it, against ``torch.sort(stable=True)`` + ``searchsorted`` and against the overlay's
torch path end to end (``fused_experts``), dropped pairs (expert_map -1) included.

The binary was built in the cpu base (torch 2.13.0+cpu, CPython 3.11); the dev venv has the same torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import sorted_moe
import torch

SO = Path(__file__).resolve().parents[2] / "overlays/cpu/native/imageforge_moe_group.cpython-311-x86_64-linux-gnu.so"


@pytest.fixture(scope="module")
def kernel() -> ModuleType:
    spec = importlib.util.spec_from_file_location("imageforge_moe_group", SO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("tokens", "top_k", "experts"), [(1, 1, 1), (5, 2, 4), (64, 8, 16), (300, 8, 128)])
def test_group_by_expert_is_the_stable_sort_and_its_offsets(kernel: ModuleType, tokens: int, top_k: int,
                                                            experts: int) -> None:
    ids = torch.randint(0, experts, (tokens, top_k), dtype=torch.int32)
    order, offsets = kernel.group_by_expert(ids, experts)
    sorted_ids, want = torch.sort(ids.reshape(-1).to(torch.int64), stable=True)
    assert torch.equal(order, want)
    assert torch.equal(offsets, torch.searchsorted(sorted_ids, torch.arange(experts + 1)))
    assert order.dtype == offsets.dtype == torch.int64


def test_an_id_outside_the_buckets_is_refused(kernel: ModuleType) -> None:
    with pytest.raises(RuntimeError, match=r"expert id 7 at pair 1 is outside \[0, 4\)"):
        kernel.group_by_expert(torch.tensor([[1, 7]]), 4)
    with pytest.raises(RuntimeError, match="num_experts must be positive"):
        kernel.group_by_expert(torch.tensor([[0]]), 0)


def test_sort_pairs_and_fused_experts_through_the_kernel_equal_the_torch_path(
        kernel: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens, top_k, experts, hidden, inter = 40, 4, 8, 32, 16
    x = torch.randn(tokens, hidden)
    w1, w2 = torch.randn(experts, 2 * inter, hidden) / 8, torch.randn(experts, hidden, inter) / 8
    weights = torch.rand(tokens, top_k)
    ids = torch.randint(0, experts, (tokens, top_k))
    expert_map = torch.tensor([0, 1, 2, -1, 3, 4, -1, 5])  # two experts not local: their pairs dropped
    plain = sorted_moe.sort_pairs(weights, ids, 6, expert_map)
    plain_out = sorted_moe.fused_experts(x, w1[:6], w2[:6], weights, ids, expert_map=expert_map, impl="loop")
    monkeypatch.setattr(sorted_moe, "GROUP_BY_EXPERT", kernel.group_by_expert)
    native = sorted_moe.sort_pairs(weights, ids, 6, expert_map)
    for field in ("token_idx", "weights", "expert_ends", "valid"):
        assert torch.equal(getattr(native, field), getattr(plain, field)), field
    native_out = sorted_moe.fused_experts(x, w1[:6], w2[:6], weights, ids, expert_map=expert_map, impl="loop")
    assert torch.equal(native_out, plain_out)
