"""Paged KV-cache layouts of ixformer's V1 and V2 decode kernels, and the V1/V2 dispatch rule.

Replaces, in the BI-V100 image:

* the dispatch heuristic inside ``vllm.attention.ops.paged_attn.PagedAttention.forward_decode``
  (``use_v1 = max_seq_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)``),
  which the baseline had hard-coded to ``use_v1 = True``; and
* the on-the-fly cache conversion the team put in front of ixformer's native V2 kernel
  (``ixf_F.vllm_single_query_cached_kv_attention_v2``).

Layouts (``x = 16 // element_size``, e.g. 8 for fp16/bf16, 4 for fp32):

* V1 (vLLM's ``PagedAttention`` layout, what the cache holds):
  key cache ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``,
  value cache ``[num_blocks, num_kv_heads, head_size, block_size]``.
* V2 (what ixformer's native V2 kernel expects):
  key cache ``[num_blocks, num_kv_heads, block_size, head_size]``,
  value cache ``[num_blocks, num_kv_heads, block_size, head_size]``.

Both conversions copy: the team's note that the key conversion is "a view+reshape, no copy if
contiguous" holds only when ``x == head_size`` or ``block_size == 1``; for a contiguous V1 key cache
the permute moves ``block_size`` in front of ``head_size // x``, so ``reshape`` must copy. Converting
the whole cache on every decode step copies the whole cache, so :func:`gather_v2_cache_for_batch`
converts only the blocks a batch's block tables reference and returns the remapped block tables.

Imports only torch and the standard library: the build copies this file into the image's vllm package.
"""

from __future__ import annotations

import torch

__all__ = [
    "V1_MAX_SEQ_LEN",
    "V1_MIN_PARALLEL_WORK",
    "_PARTITION_SIZE",
    "cache_x",
    "gather_v2_cache_for_batch",
    "num_partitions",
    "should_use_v2",
    "use_v1",
    "v1_to_v2_key_cache",
    "v1_to_v2_value_cache",
    "v2_to_v1_key_cache",
    "v2_to_v1_value_cache",
]

# Must equal PARTITION_SIZE in the compiled paged_attention_v2 launcher (vLLM's default is 512). The
# baseline's attention.py carried 256, which would split partitions differently from the kernel.
_PARTITION_SIZE = 512
# Sequences longer than this always take V2: V1 keeps one fp32 logit per token in shared memory
# (8192 * 4 B = 32 KiB of the BI-V100's 48 KiB per block).
V1_MAX_SEQ_LEN = 8192
# Above this many (sequence, head) pairs, V1's one block per pair already fills the GPU.
V1_MIN_PARALLEL_WORK = 512


def num_partitions(max_seq_len: int, partition_size: int = _PARTITION_SIZE) -> int:
    """Number of ``partition_size`` partitions that cover ``max_seq_len`` tokens (ceil division)."""
    if partition_size <= 0:
        raise ValueError(f"partition_size must be positive, got {partition_size}")
    if max_seq_len < 0:
        raise ValueError(f"max_seq_len must be >= 0, got {max_seq_len}")
    return (max_seq_len + partition_size - 1) // partition_size


def use_v1(
    max_seq_len: int,
    num_seqs: int,
    num_heads: int,
    partition_size: int = _PARTITION_SIZE,
) -> bool:
    """vLLM's V1/V2 choice in ``PagedAttention.forward_decode``: True selects V1.

    V1 iff ``max_seq_len <= 8192`` and (one partition covers the longest sequence, or there are more
    than 512 (sequence, head) pairs to spread over the GPU). Equivalently, V2 iff
    ``max_seq_len > 8192`` or (``max_num_partitions > 1`` and ``num_seqs * num_heads <= 512``).

    Note: a shorter summary of the rule reads "V2 when max_seq_len > 8192 and partitions > 1 and
    num_seqs*num_heads <= 512"; that conjunction is not vLLM's rule (it would send a batch of long
    sequences with many heads to V1, whose shared-memory logits overflow past 8192 tokens, and would
    send short multi-partition batches to V1). The notes ask for "vllm's heuristic", which is this.
    """
    if num_seqs < 0 or num_heads < 0:
        raise ValueError(f"num_seqs and num_heads must be >= 0, got {num_seqs}, {num_heads}")
    partitions = num_partitions(max_seq_len, partition_size)
    return max_seq_len <= V1_MAX_SEQ_LEN and (
        partitions == 1 or num_seqs * num_heads > V1_MIN_PARALLEL_WORK
    )


def should_use_v2(
    max_seq_len: int,
    num_seqs: int,
    num_heads: int,
    partition_size: int = _PARTITION_SIZE,
) -> bool:
    """The negation of :func:`use_v1`: True selects the partitioned V2 path."""
    return not use_v1(max_seq_len, num_seqs, num_heads, partition_size)


def cache_x(dtype: torch.dtype) -> int:
    """vLLM's ``x``: how many elements of ``dtype`` make 16 bytes (the innermost key-cache dim)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if 16 % itemsize != 0:
        raise ValueError(f"element size {itemsize} of {dtype} does not divide 16")
    return 16 // itemsize


def v1_to_v2_key_cache(key_cache: torch.Tensor) -> torch.Tensor:
    """V1 key cache ``[B, H, d/x, bs, x]`` -> V2 ``[B, H, bs, d]`` (``permute(0,1,3,2,4).reshape``)."""
    if key_cache.dim() != 5:
        raise ValueError(f"V1 key cache must be 5-D [B, H, d/x, bs, x], got shape {tuple(key_cache.shape)}")
    b, h, d_over_x, bs, x = key_cache.shape
    return key_cache.permute(0, 1, 3, 2, 4).reshape(b, h, bs, d_over_x * x)


def v1_to_v2_value_cache(value_cache: torch.Tensor) -> torch.Tensor:
    """V1 value cache ``[B, H, d, bs]`` -> V2 ``[B, H, bs, d]`` (``permute(0,1,3,2).contiguous``)."""
    if value_cache.dim() != 4:
        raise ValueError(f"V1 value cache must be 4-D [B, H, d, bs], got shape {tuple(value_cache.shape)}")
    return value_cache.permute(0, 1, 3, 2).contiguous()


def v2_to_v1_key_cache(key_cache: torch.Tensor, x: int | None = None) -> torch.Tensor:
    """V2 key cache ``[B, H, bs, d]`` -> V1 ``[B, H, d/x, bs, x]`` (inverse of :func:`v1_to_v2_key_cache`)."""
    if key_cache.dim() != 4:
        raise ValueError(f"V2 key cache must be 4-D [B, H, bs, d], got shape {tuple(key_cache.shape)}")
    if x is None:
        x = cache_x(key_cache.dtype)
    b, h, bs, d = key_cache.shape
    if d % x != 0:
        raise ValueError(f"head_size {d} is not a multiple of x={x}")
    return key_cache.reshape(b, h, bs, d // x, x).permute(0, 1, 3, 2, 4).contiguous()


def v2_to_v1_value_cache(value_cache: torch.Tensor) -> torch.Tensor:
    """V2 value cache ``[B, H, bs, d]`` -> V1 ``[B, H, d, bs]`` (inverse of :func:`v1_to_v2_value_cache`)."""
    if value_cache.dim() != 4:
        raise ValueError(f"V2 value cache must be 4-D [B, H, bs, d], got shape {tuple(value_cache.shape)}")
    return value_cache.permute(0, 1, 3, 2).contiguous()


def gather_v2_cache_for_batch(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Convert only the blocks a decode batch uses from V1 to V2 layout.

    Returns ``(key_cache_v2, value_cache_v2, block_tables_v2)`` where the caches hold just the
    referenced blocks (``[U, H, bs, d]``, ``U`` = number of distinct blocks in use) and
    ``block_tables_v2`` indexes into them. Entries of ``block_tables`` past a sequence's last block
    are ignored (mapped to 0). Costs one ``torch.unique`` (a host sync) and copies of ``U`` blocks,
    instead of a copy of the whole cache per step.
    """
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D [num_seqs, max_blocks], got {tuple(block_tables.shape)}")
    num_seqs, max_blocks = block_tables.shape
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must have shape ({num_seqs},), got {tuple(seq_lens.shape)}")
    blocks_needed = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    cols = torch.arange(max_blocks, device=block_tables.device)
    used = cols[None, :] < blocks_needed[:, None]
    table = torch.where(used, block_tables.to(torch.int64), torch.zeros_like(block_tables, dtype=torch.int64))
    if bool(used.any()):
        uniq, inverse = torch.unique(table[used], return_inverse=True)
    else:
        uniq = torch.zeros(1, dtype=torch.int64, device=block_tables.device)
        inverse = torch.zeros(0, dtype=torch.int64, device=block_tables.device)
    new_table = torch.zeros_like(table)
    new_table[used] = inverse
    key_v2 = v1_to_v2_key_cache(key_cache.index_select(0, uniq))
    value_v2 = v1_to_v2_value_cache(value_cache.index_select(0, uniq))
    return key_v2, value_v2, new_table.to(block_tables.dtype)
