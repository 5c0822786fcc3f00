"""The benchmarks' naive twins and dense references (benchmarks/overlays_naive.py) against the float64 references,
so a benchmark never compares an optimised module with something wrong. fp32 inputs; ATTN_TOL / MOE_TOL.
"""

from __future__ import annotations

import math

import overlays_naive as naive
import torch
from overlay_reference import (
    ATTN_TOL,
    MOE_TOL,
    assert_close,
    build_paged_cache,
    random_moe,
    reference_decode,
    reference_moe,
    reference_prefix,
)


def test_naive_moe() -> None:
    gen = torch.Generator().manual_seed(21)
    x, w1, w2, weights, ids = random_moe(12, 64, 32, 256, 8, torch.float32, gen)
    ids[0, :3] = 7  # duplicate routing
    got = naive.naive_fused_experts(x, w1, w2, weights, ids)
    assert_close(got, reference_moe(x, w1, w2, weights, ids), torch.float32, MOE_TOL)


def test_naive_and_dense_decode() -> None:
    gen = torch.Generator().manual_seed(22)
    lens = [1, 512, 513, 1300]
    cache = build_paged_cache(lens, 2, 128, 16, torch.float32, gen, poison=False)
    query = torch.randn(4, 8, 128, generator=gen)
    scale = 1 / math.sqrt(128)
    want = reference_decode(query, cache.dense_k, cache.dense_v, scale)
    args = (query, cache.key_cache, cache.value_cache, cache.block_tables, cache.seq_lens, scale)
    assert_close(naive.naive_paged_attention_v2(*args), want, torch.float32, ATTN_TOL)
    assert_close(naive.dense_decode_reference(*args), want, torch.float32, ATTN_TOL)


def test_naive_and_dense_prefix() -> None:
    gen = torch.Generator().manual_seed(23)
    ctx, new = [0, 100, 37], [5, 70, 1]
    cache = build_paged_cache(ctx, 2, 128, 16, torch.float32, gen, poison=False)
    total = sum(new)
    q = torch.randn(total, 4, 128, generator=gen)
    k = torch.randn(total, 2, 128, generator=gen)
    v = torch.randn(total, 2, 128, generator=gen)
    qsl = torch.tensor([0, 5, 75, 76])
    want = reference_prefix(q, k, v, cache.dense_k, cache.dense_v, new, 1 / math.sqrt(128))
    args = (q, k, v, cache.key_cache, cache.value_cache, cache.block_tables, qsl, cache.seq_lens)
    assert_close(naive.naive_context_attention(*args, tile_size=16), want, torch.float32, ATTN_TOL)
    assert_close(naive.dense_prefix_reference(*args), want, torch.float32, ATTN_TOL)
