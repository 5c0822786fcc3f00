"""V1 <-> V2 cache layout conversion and the V1/V2 dispatch rule."""

from __future__ import annotations

import paged_attention_layout as lay
import paged_attention_v2 as pa
import prefix_attention
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from overlay_reference import DTYPES, build_paged_cache


def _v1_caches(num_blocks: int, heads: int, head_size: int, block_size: int, dtype: torch.dtype,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = lay.cache_x(dtype)
    k = torch.randn(num_blocks, heads, head_size // x, block_size, x, generator=gen).to(dtype)
    v = torch.randn(num_blocks, heads, head_size, block_size, generator=gen).to(dtype)
    return k, v


def test_partition_size_is_512_everywhere() -> None:
    # The notes found 512 in paged_attn.py and 256 in attention.py; the kernel uses 512.
    assert lay._PARTITION_SIZE == pa._PARTITION_SIZE == 512


@pytest.mark.parametrize(("dtype", "x"), [(torch.float32, 4), (torch.float16, 8), (torch.bfloat16, 8),
                                          (torch.uint8, 16)])
def test_cache_x(dtype: torch.dtype, x: int) -> None:
    assert lay.cache_x(dtype) == x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("block_size", [16, 32])
def test_element_mapping_and_round_trip(dtype: torch.dtype, head_size: int, block_size: int) -> None:
    k1, v1 = _v1_caches(5, 3, head_size, block_size, dtype)
    x = lay.cache_x(dtype)
    k2, v2 = lay.v1_to_v2_key_cache(k1), lay.v1_to_v2_value_cache(v1)
    assert k2.shape == v2.shape == (5, 3, block_size, head_size)
    # Element by element: K2[b,h,t,d] = K1[b,h,d//x,t,d%x], V2[b,h,t,d] = V1[b,h,d,t].
    b_idx, h_idx, t_idx, d_idx = torch.meshgrid(
        torch.arange(5), torch.arange(3), torch.arange(block_size), torch.arange(head_size), indexing="ij")
    assert torch.equal(k2, k1[b_idx, h_idx, d_idx // x, t_idx, d_idx % x])
    assert torch.equal(v2, v1[b_idx, h_idx, d_idx, t_idx])
    assert torch.equal(lay.v2_to_v1_key_cache(k2), k1)
    assert torch.equal(lay.v2_to_v1_value_cache(v2), v1)


@settings(max_examples=30, deadline=None)
@given(
    blocks=st.integers(1, 4), heads=st.integers(1, 3), d_over_x=st.integers(1, 6),
    block_size=st.sampled_from([1, 2, 8, 16]), dtype=st.sampled_from(DTYPES),
)
def test_round_trip_property(blocks: int, heads: int, d_over_x: int, block_size: int,
                             dtype: torch.dtype) -> None:
    head_size = d_over_x * lay.cache_x(dtype)
    k1, v1 = _v1_caches(blocks, heads, head_size, block_size, dtype)
    assert torch.equal(lay.v2_to_v1_key_cache(lay.v1_to_v2_key_cache(k1)), k1)
    assert torch.equal(lay.v2_to_v1_value_cache(lay.v1_to_v2_value_cache(v1)), v1)


def test_key_conversion_copies_unless_trivial() -> None:
    # The notes call the K conversion "view+reshape (no copy if contiguous)": true only when
    # head_size == x or block_size == 1.
    k1, _ = _v1_caches(2, 2, 128, 16, torch.float16)
    assert lay.v1_to_v2_key_cache(k1).data_ptr() != k1.data_ptr()
    k_trivial, _ = _v1_caches(2, 2, 8, 16, torch.float16)  # head_size == x
    assert lay.v1_to_v2_key_cache(k_trivial).data_ptr() == k_trivial.data_ptr()


def test_batch_gather_matches_full_conversion() -> None:
    gen = torch.Generator().manual_seed(5)
    cache = build_paged_cache([40, 17, 1], 2, 128, 16, torch.bfloat16, gen, extra_blocks=6)
    k2_full = lay.v1_to_v2_key_cache(cache.key_cache)
    v2_full = lay.v1_to_v2_value_cache(cache.value_cache)
    k2, v2, table = lay.gather_v2_cache_for_batch(cache.key_cache, cache.value_cache, cache.block_tables,
                                                  cache.seq_lens, 16)
    assert table.dtype == cache.block_tables.dtype
    assert k2.shape[0] == 3 + 2 + 1  # only the distinct blocks in use
    for s, n in enumerate([40, 17, 1]):
        for j in range((n + 15) // 16):
            old = int(cache.block_tables[s, j])
            new = int(table[s, j])
            valid = min(16, n - 16 * j)
            assert torch.equal(k2[new][:, :valid], k2_full[old][:, :valid])
            assert torch.equal(v2[new][:, :valid], v2_full[old][:, :valid])


def test_layout_conversions_reject_wrong_ranks() -> None:
    with pytest.raises(ValueError):
        lay.v1_to_v2_key_cache(torch.zeros(2, 2, 2, 2))
    with pytest.raises(ValueError):
        lay.v1_to_v2_value_cache(torch.zeros(2, 2, 2, 2, 2))
    with pytest.raises(ValueError):
        lay.v2_to_v1_key_cache(torch.zeros(1, 1, 4, 10), x=8)


# (max_seq_len, num_seqs, num_heads, use V1?) at the rule's edges; the rule is vLLM's
# use_v1 = max_seq_len <= 8192 and (partitions == 1 or num_seqs * num_heads > 512).
DISPATCH_CASES = [
    (1, 1, 32, True),  # one partition
    (512, 1, 32, True),  # still one partition
    (513, 1, 32, False),  # two partitions, little parallel work -> V2
    (513, 16, 32, False),  # 512 (seq, head) pairs is not > 512 -> V2
    (513, 17, 32, True),  # 544 pairs -> enough work for V1
    (8192, 17, 32, True),
    (8192, 1, 32, False),
    (8193, 17, 32, False),  # past 8192: always V2 (V1's shared-memory logits)
    (8193, 1000, 64, False),
    (100_000, 1, 4, False),
    (512, 1000, 64, True),
]


@pytest.mark.parametrize(("max_seq_len", "num_seqs", "num_heads", "v1"), DISPATCH_CASES)
def test_dispatch_rule_edges(max_seq_len: int, num_seqs: int, num_heads: int, v1: bool) -> None:
    assert lay.use_v1(max_seq_len, num_seqs, num_heads) is v1
    assert lay.should_use_v2(max_seq_len, num_seqs, num_heads) is (not v1)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200_000), st.integers(0, 300), st.integers(1, 128))
def test_dispatch_rule_matches_vllm_expression(max_seq_len: int, num_seqs: int, num_heads: int) -> None:
    max_num_partitions = (max_seq_len + 512 - 1) // 512
    expected = max_seq_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)
    assert lay.use_v1(max_seq_len, num_seqs, num_heads) is expected


def test_num_partitions() -> None:
    assert [lay.num_partitions(n) for n in (0, 1, 511, 512, 513, 1024, 1025, 20000)] == \
        [0, 1, 1, 1, 2, 2, 3, 40]
    with pytest.raises(ValueError):
        lay.num_partitions(10, 0)


def test_prefix_gather_agrees_with_v2_layout() -> None:
    # prefix_attention.gather_context reads the V1 cache; the V2 conversion must read the same tokens.
    gen = torch.Generator().manual_seed(6)
    cache = build_paged_cache([37], 2, 128, 16, torch.float32, gen)
    k_ctx, v_ctx = prefix_attention.gather_context(cache.key_cache, cache.value_cache,
                                                   cache.block_tables[0, :3], 37)
    k2 = lay.v1_to_v2_key_cache(cache.key_cache)[cache.block_tables[0, :3].long()]  # [3, H, bs, d]
    v2 = lay.v1_to_v2_value_cache(cache.value_cache)[cache.block_tables[0, :3].long()]
    assert torch.equal(k2.permute(1, 0, 2, 3).reshape(2, 48, 128)[:, :37], k_ctx)
    assert torch.equal(v2.permute(1, 0, 2, 3).reshape(2, 48, 128)[:, :37], v_ctx)
    assert torch.equal(k_ctx.transpose(0, 1), cache.dense_k[0])
