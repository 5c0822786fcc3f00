"""prefix_attention (new tokens over paged context + themselves) against dense float64 attention.

Tolerances: overlay_reference.ATTN_TOL (fp32 2e-5 abs / 1e-4 rel; fp16 2e-3 / 2e-3; bf16 1.6e-2 / 1.6e-2).
"""

from __future__ import annotations

import math

import prefix_attention as pf
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overlay_reference import ATTN_TOL, DTYPES, assert_close, build_paged_cache, reference_prefix


def _run(ctx_lens: list[int], new_lens: list[int], num_kv_heads: int, group: int, head_size: int,
         dtype: torch.dtype, block_size: int = 16, seed: int = 0, alibi: bool = False,
         sliding_window: int | None = None, **kwargs: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cache = build_paged_cache(ctx_lens, num_kv_heads, head_size, block_size, dtype, gen)
    num_heads = num_kv_heads * group
    total = sum(new_lens)
    query = torch.randn(total, num_heads, head_size, generator=gen).to(dtype)
    key = torch.randn(total, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(total, num_kv_heads, head_size, generator=gen).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32)
    slopes = torch.rand(num_heads, generator=gen) * 0.1 if alibi else None
    got = pf.context_attention(query, key, value, cache.key_cache, cache.value_cache, cache.block_tables,
                               qsl, cache.seq_lens, alibi_slopes=slopes, sliding_window=sliding_window,
                               **kwargs)
    assert got.dtype == dtype and got.shape == query.shape
    assert torch.isfinite(got).all(), "NaN from a poisoned (unowned) cache slot leaked into the output"
    want = reference_prefix(query, key, value, cache.dense_k, cache.dense_v, new_lens,
                            1 / math.sqrt(head_size), slopes, sliding_window)
    assert_close(got, want, dtype, ATTN_TOL)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_dtypes_heads_gqa(dtype: torch.dtype, head_size: int, group: int) -> None:
    # No context; a context ending mid-block; a context on a block/partition boundary with 1 new token.
    _run([0, 37, 512], [9, 70, 1], num_kv_heads=2, group=group, head_size=head_size, dtype=dtype,
         tile_size=32)


@pytest.mark.parametrize(("dtype", "head_size", "group"), [(torch.float32, 128, 8), (torch.bfloat16, 256, 4)])
def test_long_context(dtype: torch.dtype, head_size: int, group: int) -> None:
    # 20000 cached tokens (last block partial), 200 new ones in many tiles.
    _run([20000], [200], num_kv_heads=1, group=group, head_size=head_size, dtype=dtype, tile_size=48)


@pytest.mark.parametrize("tile_size", [1, 7, 64, None])
def test_tile_size_does_not_change_the_result(tile_size: int | None) -> None:
    _run([100, 3], [50, 20], num_kv_heads=2, group=2, head_size=128, dtype=torch.float32,
         tile_size=tile_size)  # type: ignore[arg-type]


def test_auto_tiles_under_a_small_budget() -> None:
    _run([300], [90], num_kv_heads=1, group=2, head_size=128, dtype=torch.float32, max_tile_bytes=20_000)


def test_alibi_and_sliding_window() -> None:
    _run([200, 0], [40, 25], num_kv_heads=2, group=2, head_size=128, dtype=torch.float32, alibi=True,
         tile_size=16)
    _run([200, 0, 33], [40, 25, 5], num_kv_heads=2, group=2, head_size=128, dtype=torch.float32,
         sliding_window=50, tile_size=16)


def test_context_is_gathered_once_per_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = pf.gather_context

    def counting(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pf, "gather_context", counting)
    _run([500, 60], [100, 30], num_kv_heads=1, group=2, head_size=128, dtype=torch.float32, tile_size=8)
    assert len(calls) == 2  # one per sequence, not one per tile (13 + 4 tiles)


def test_forward_prefix_signature() -> None:
    gen = torch.Generator().manual_seed(9)
    cache = build_paged_cache([40, 0], 2, 128, 16, torch.float16, gen)
    q = torch.randn(13, 4, 128, generator=gen).half()
    k = torch.randn(13, 2, 128, generator=gen).half()
    v = torch.randn(13, 2, 128, generator=gen).half()
    qsl = torch.tensor([0, 10, 13], dtype=torch.int32)
    ctx = cache.seq_lens
    seq_lens = ctx + torch.tensor([10, 3], dtype=torch.int32)
    out = pf.forward_prefix(q, k, v, "auto", cache.key_cache, cache.value_cache, cache.block_tables, qsl,
                            seq_lens, ctx, 10, None, None, 1.0, 1.0)
    want = reference_prefix(q, k, v, cache.dense_k, cache.dense_v, [10, 3], 1 / math.sqrt(128))
    assert_close(out, want, torch.float16, ATTN_TOL)
    with pytest.raises(ValueError, match="seq_lens_tensor"):
        pf.forward_prefix(q, k, v, "auto", cache.key_cache, cache.value_cache, cache.block_tables, qsl,
                          seq_lens + 1, ctx, 10, None, None)
    with pytest.raises(NotImplementedError):
        pf.forward_prefix(q, k, v, "fp8", cache.key_cache, cache.value_cache, cache.block_tables, qsl,
                          seq_lens, ctx, 10, None, None)


def test_empty_query_slices_are_skipped() -> None:
    _run([30, 5, 64], [4, 0, 6], num_kv_heads=1, group=1, head_size=128, dtype=torch.float32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ctx_lens=st.lists(st.integers(0, 300), min_size=1, max_size=3),
    data=st.data(),
    block_size=st.sampled_from([8, 16, 32]),
    group=st.sampled_from([1, 2, 4]),
    head_size=st.sampled_from([16, 64]),
    tile=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_property_random_shapes(ctx_lens: list[int], data: st.DataObject, block_size: int, group: int,
                                head_size: int, tile: int, seed: int) -> None:
    new_lens = data.draw(st.lists(st.integers(1, 60), min_size=len(ctx_lens), max_size=len(ctx_lens)))
    _run(ctx_lens, new_lens, num_kv_heads=2, group=group, head_size=head_size, dtype=torch.float32,
         block_size=block_size, seed=seed, tile_size=tile)
