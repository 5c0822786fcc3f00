"""paged_attention_v2 (partitioned decode attention) against dense float64 attention.

Tolerances: overlay_reference.ATTN_TOL (fp32 2e-5 abs / 1e-4 rel; fp16 2e-3 / 2e-3; bf16 1.6e-2 / 1.6e-2),
all against a float64 reference computed from the same rounded inputs.
"""

from __future__ import annotations

import math

import paged_attention_v2 as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overlay_reference import ATTN_TOL, DTYPES, assert_close, build_paged_cache, reference_decode

# Partition boundaries (511/512/513, 1024, 1025), a single token, and partial last blocks.
BOUNDARY_LENS = [1, 15, 511, 512, 513, 1024, 1025, 1500]


def _run(seq_lens: list[int], num_kv_heads: int, group: int, head_size: int, dtype: torch.dtype,
         block_size: int = 16, alibi: bool = False, seed: int = 0, modes: tuple[str, ...] = ("ragged", "padded"),
         **kwargs: int) -> None:
    """Both pair enumerations (``ragged``: host sync, ``padded``: max_seq_len given, no sync) vs dense."""
    gen = torch.Generator().manual_seed(seed)
    cache = build_paged_cache(seq_lens, num_kv_heads, head_size, block_size, dtype, gen)
    num_heads = num_kv_heads * group
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=gen).to(dtype)
    scale = 1.0 / math.sqrt(head_size)
    slopes = torch.rand(num_heads, generator=gen) * 0.1 if alibi else None
    want = reference_decode(query, cache.dense_k, cache.dense_v, scale, slopes)
    for mode in modes:
        extra: dict[str, int | bool] = {"ragged": True}
        if mode == "padded":
            extra = {"ragged": False, "max_seq_len": max(seq_lens)}
        got = pa.paged_attention_v2_forward(query, cache.key_cache, cache.value_cache, cache.block_tables,
                                            cache.seq_lens, scale, slopes, **kwargs, **extra)  # type: ignore[arg-type]
        assert got.dtype == dtype and got.shape == query.shape
        assert torch.isfinite(got).all(), f"{mode}: NaN from a poisoned (unowned) cache slot leaked out"
        assert_close(got, want, dtype, ATTN_TOL)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_boundary_lengths_all_dtypes_heads_gqa(dtype: torch.dtype, head_size: int, group: int) -> None:
    # One ragged batch holding every boundary length: exercises the (sequence, partition) enumeration.
    _run(BOUNDARY_LENS, num_kv_heads=2, group=group, head_size=head_size, dtype=dtype)


@pytest.mark.parametrize(("dtype", "head_size", "group"), [
    (torch.float32, 128, 4),
    (torch.bfloat16, 256, 8),
    (torch.float16, 128, 1),
])
def test_long_sequences(dtype: torch.dtype, head_size: int, group: int) -> None:
    # 20000 = 39 full partitions + a partial one; 8193 = just past the V1 limit; 3 = one partial block.
    _run([20000, 8193, 3], num_kv_heads=1, group=group, head_size=head_size, dtype=dtype)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_block_sizes(block_size: int) -> None:
    _run([1, 511, 513, 777], num_kv_heads=2, group=2, head_size=128, dtype=torch.float32,
         block_size=block_size)


def test_alibi() -> None:
    _run([5, 512, 1300], num_kv_heads=2, group=4, head_size=128, dtype=torch.float32, alibi=True)


def test_small_chunks_give_the_same_result() -> None:
    # max_chunk_bytes=1 forces one (sequence, partition) pair per chunk.
    _run([700, 1600, 1], num_kv_heads=2, group=2, head_size=128, dtype=torch.float32, max_chunk_bytes=1)


def test_other_partition_size() -> None:
    _run([100, 256, 257], num_kv_heads=1, group=4, head_size=128, dtype=torch.float32, partition_size=64)


def test_phase1_statistics_match_a_per_partition_computation() -> None:
    gen = torch.Generator().manual_seed(3)
    lens = [1030, 40]
    cache = build_paged_cache(lens, 1, 128, 16, torch.float32, gen)
    query = torch.randn(2, 2, 128, generator=gen)
    scale = 0.1
    exp_sums, max_logits, tmp_out = pa.paged_attention_v2_partitions(
        query, cache.key_cache, cache.value_cache, cache.block_tables, cache.seq_lens, scale)
    padded = pa.paged_attention_v2_partitions(
        query, cache.key_cache, cache.value_cache, cache.block_tables, cache.seq_lens, scale, max_seq_len=1030)
    for a, b in zip((exp_sums, max_logits, tmp_out), padded, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # same values, -inf/0 past the ends too
    assert exp_sums.shape == max_logits.shape == (2, 2, 3) and tmp_out.shape == (2, 2, 3, 128)
    for s, n in enumerate(lens):
        k, v = cache.dense_k[s][:, 0].double(), cache.dense_v[s][:, 0].double()
        for p in range(3):
            lo, hi = p * 512, min(n, (p + 1) * 512)
            if lo >= n:  # partition wholly past the end
                assert torch.all(exp_sums[s, :, p] == 0) and torch.all(max_logits[s, :, p] == float("-inf"))
                assert torch.all(tmp_out[s, :, p] == 0)
                continue
            logits = query[s].double() @ k[lo:hi].T * scale  # [H, n_p]
            m = logits.max(dim=-1).values
            e = torch.exp(logits - m[:, None])
            torch.testing.assert_close(max_logits[s, :, p].double(), m, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(exp_sums[s, :, p].double(), e.sum(-1), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(tmp_out[s, :, p].double(), (e @ v[lo:hi]) / e.sum(-1)[:, None],
                                       rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    logits=st.lists(st.floats(-30, 30), min_size=1, max_size=64),
    partition=st.integers(1, 16),
)
def test_merge_equals_one_softmax(logits: list[float], partition: int) -> None:
    # Merging per-partition (max, exp-sum, normalised partial) equals the softmax over everything.
    n = len(logits)
    lg = torch.tensor(logits, dtype=torch.float64)
    vals = torch.linspace(-1, 1, n * 3, dtype=torch.float64).view(n, 3)
    parts = math.ceil(n / partition)
    es = torch.zeros(1, 1, parts, dtype=torch.float64)
    ml = torch.zeros(1, 1, parts, dtype=torch.float64)
    to = torch.zeros(1, 1, parts, 3, dtype=torch.float64)
    for p in range(parts):
        seg = lg[p * partition:(p + 1) * partition]
        m = seg.max()
        e = torch.exp(seg - m)
        es[0, 0, p], ml[0, 0, p] = e.sum(), m
        to[0, 0, p] = (e @ vals[p * partition:(p + 1) * partition]) / e.sum()
    got = pa.merge_partitions(es, ml, to, torch.tensor([n]), partition)
    want = torch.softmax(lg, 0) @ vals
    torch.testing.assert_close(got[0, 0].double(), want, rtol=1e-5, atol=1e-6)


def test_merge_ignores_partitions_past_the_sequence() -> None:
    # vLLM's kernel leaves unused partitions unwritten; whatever they hold must not matter.
    es = torch.tensor([[[2.0, float("nan"), 7.0]]])
    ml = torch.tensor([[[1.0, float("inf"), 50.0]]])
    to = torch.tensor([[[[3.0], [float("nan")], [9.0]]]])
    got = pa.merge_partitions(es, ml, to, torch.tensor([512]), 512)
    torch.testing.assert_close(got, torch.tensor([[[3.0]]]))


def test_zero_length_sequence_gives_zero() -> None:
    gen = torch.Generator().manual_seed(1)
    cache = build_paged_cache([600, 1], 1, 128, 16, torch.float32, gen)
    seq_lens = torch.tensor([600, 0], dtype=torch.int32)
    query = torch.randn(2, 2, 128, generator=gen)
    want = reference_decode(query[:1], cache.dense_k[:1], cache.dense_v[:1], 0.1)
    for max_seq_len in (None, 600):  # ragged, padded
        out = pa.paged_attention_v2_forward(query, cache.key_cache, cache.value_cache, cache.block_tables,
                                            seq_lens, 0.1, max_seq_len=max_seq_len)
        assert torch.all(out[1] == 0)
        assert_close(out[:1], want, torch.float32, ATTN_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vllm_op_signature_fills_buffers_and_out(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    lens = [9000, 513, 1]
    num_kv_heads, group, head_size, block_size = 2, 4, 128, 16
    cache = build_paged_cache(lens, num_kv_heads, head_size, block_size, dtype, gen)
    num_heads = num_kv_heads * group
    query = torch.randn(3, num_heads, head_size, generator=gen).to(dtype)
    max_seq_len = max(lens)
    parts = math.ceil(max_seq_len / pa._PARTITION_SIZE)
    # Buffers allocated the way vLLM's PagedAttention.forward_decode allocates them (garbage inside).
    out = torch.full_like(query, float("nan"))
    exp_sums = torch.full((3, num_heads, parts), float("nan"))
    max_logits = torch.full((3, num_heads, parts), float("nan"))
    tmp_out = torch.full((3, num_heads, parts, head_size), float("nan"), dtype=dtype)
    result = pa.paged_attention_v2(
        out, exp_sums, max_logits, tmp_out, query, cache.key_cache, cache.value_cache, num_kv_heads,
        1 / math.sqrt(head_size), cache.block_tables, cache.seq_lens, block_size, max_seq_len, None, "auto",
        torch.tensor(1.0), torch.tensor(1.0))  # type: ignore[func-returns-value]  # vLLM's op: fills out, returns None
    assert result is None
    want = reference_decode(query, cache.dense_k, cache.dense_v, 1 / math.sqrt(head_size))
    assert_close(out, want, dtype, ATTN_TOL)
    # The buffers' valid partitions, merged again, give the same output.
    again = pa.merge_partitions(exp_sums, max_logits, tmp_out, cache.seq_lens)
    assert_close(again, want, dtype, ATTN_TOL)
    assert torch.isfinite(exp_sums[0]).all() and torch.isfinite(tmp_out[0]).all()
    assert torch.all(exp_sums[2, :, 1:] == 0)  # partitions past a 1-token sequence


def test_op_rejects_what_it_does_not_implement() -> None:
    gen = torch.Generator().manual_seed(4)
    cache = build_paged_cache([5], 1, 128, 16, torch.float16, gen)
    q = torch.randn(1, 1, 128).half()
    bufs = (torch.empty_like(q), torch.empty(1, 1, 1), torch.empty(1, 1, 1), torch.empty(1, 1, 1, 128))
    args = (*bufs, q, cache.key_cache, cache.value_cache, 1, 0.1, cache.block_tables, cache.seq_lens, 16, 5, None)
    with pytest.raises(NotImplementedError):
        pa.paged_attention_v2(*args, "fp8")
    with pytest.raises(NotImplementedError):
        pa.paged_attention_v2(*args, "auto", 1.0, 1.0, 0, 1, 8)
    with pytest.raises(ValueError, match="num_kv_heads"):
        pa.paged_attention_v2(*bufs, q, cache.key_cache, cache.value_cache, 2, 0.1, cache.block_tables,
                              cache.seq_lens, 16, 5, None, "auto")
    with pytest.raises(ValueError, match="longer than max_seq_len"):
        pa.paged_attention_v2_forward(q, cache.key_cache, cache.value_cache, cache.block_tables,
                                      torch.tensor([600]), 0.1, max_seq_len=512, ragged=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(1, 1100), min_size=1, max_size=3),
    block_size=st.sampled_from([8, 16, 32]),
    parts_in_blocks=st.integers(1, 6),
    num_kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 2, 4]),
    head_size=st.sampled_from([16, 32, 64]),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["ragged", "padded"]),
)
def test_property_random_shapes(lens: list[int], block_size: int, parts_in_blocks: int, num_kv_heads: int,
                                group: int, head_size: int, seed: int, mode: str) -> None:
    _run(lens, num_kv_heads, group, head_size, torch.float32, block_size=block_size, seed=seed,
         partition_size=block_size * parts_in_blocks, modes=(mode,))


def test_padded_with_a_larger_max_seq_len() -> None:
    # vLLM may pass a max_seq_len above every sequence (e.g. after one finished): extra partitions are empty.
    gen = torch.Generator().manual_seed(8)
    cache = build_paged_cache([700, 5], 2, 128, 16, torch.float32, gen, extra_cols=70)
    query = torch.randn(2, 4, 128, generator=gen)
    got = pa.paged_attention_v2_forward(query, cache.key_cache, cache.value_cache, cache.block_tables,
                                        cache.seq_lens, 0.1, max_seq_len=1700)
    assert_close(got, reference_decode(query, cache.dense_k, cache.dense_v, 0.1), torch.float32, ATTN_TOL)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_both_gather_paths_agree(dtype: torch.dtype) -> None:
    # The fused permute+cast copy is what CUDA runs; check it here against the CPU's two-step path.
    gen = torch.Generator().manual_seed(7)
    cache = build_paged_cache([100, 40], 2, 128, 16, dtype, gen, poison=False)
    blocks = cache.block_tables[:, :7].reshape(-1).long()
    for c, perm in ((cache.key_cache, (1, 0, 3, 2, 4)), (cache.value_cache, (1, 0, 3, 2))):
        fused = pa._gather_f32(c, blocks, perm, fused_cast=True)
        split = pa._gather_f32(c, blocks, perm, fused_cast=False)
        assert fused.dtype == split.dtype == torch.float32 and fused.is_contiguous()
        assert torch.equal(fused, split)
        assert torch.equal(split, c[blocks].float().permute(perm))


def test_forward_through_the_fused_gather_path(monkeypatch: pytest.MonkeyPatch) -> None:
    original = pa._gather_f32
    monkeypatch.setattr(pa, "_gather_f32", lambda c, b, p, fused_cast=None: original(c, b, p, True))
    _run([1, 513, 2000], num_kv_heads=2, group=4, head_size=128, dtype=torch.bfloat16)
