"""Run inside an image of the cpu target: the native step's extension against torch's stable sort.

Imports vLLM's copy of ``imageforge_moe_group`` (the pinned file the image build installed) after torch, and
``sorted_moe.sort_pairs`` with ``GROUP_BY_EXPERT`` set to it (as the cpu target's cpu_moe.py patch sets it);
checks both against ``torch.sort(stable=True)`` + ``searchsorted`` on seeded routings, dropped pairs (sentinel
id) included. Prints one JSON line.
"""

from __future__ import annotations

import json

import torch
from vllm.model_executor.layers.fused_moe import imageforge_moe_group, sorted_moe


def reference(ids: torch.Tensor, buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = ids.reshape(-1).to(torch.int64)
    sorted_ids, order = torch.sort(flat, stable=True)
    starts = torch.searchsorted(sorted_ids, torch.arange(buckets + 1, dtype=torch.int64))
    return order, starts


def main() -> None:
    gen = torch.Generator().manual_seed(7)
    sorted_moe.GROUP_BY_EXPERT = imageforge_moe_group.group_by_expert
    cases = 0
    for tokens, top_k, experts in ((1, 2, 4), (37, 2, 8), (256, 8, 64), (3, 4, 128)):
        ids = torch.randint(0, experts + 1, (tokens, top_k), generator=gen, dtype=torch.int32)  # experts: dropped
        order, offsets = imageforge_moe_group.group_by_expert(ids, experts + 1)
        want_order, want_offsets = reference(ids, experts + 1)
        assert torch.equal(order, want_order) and torch.equal(offsets, want_offsets), (tokens, top_k, experts)
        weights = torch.rand(tokens, top_k, generator=gen)
        mapped = torch.where(ids.to(torch.int64) >= experts, -1, ids.to(torch.int64))
        pairs = sorted_moe.sort_pairs(weights, mapped, experts)
        assert torch.equal(pairs.token_idx, want_order // top_k)
        assert torch.equal(pairs.expert_ends, want_offsets[1:experts + 1])
        assert torch.equal(pairs.valid, ids.reshape(-1)[want_order] < experts)
        cases += 1
    try:
        imageforge_moe_group.group_by_expert(torch.tensor([[0, 9]]), 4)
        refused = False
    except RuntimeError as exc:
        refused = "outside [0, 4)" in str(exc)
    print(json.dumps({"cases": cases, "refuses_out_of_range": refused, "file": imageforge_moe_group.__file__,
                      "doc": imageforge_moe_group.group_by_expert.__doc__.splitlines()[0]}))


if __name__ == "__main__":
    main()
