"""Partitioned paged decode attention ("paged attention V2") in plain PyTorch.

Replaces ``vllm._custom_ops.paged_attention_v2`` in the BI-V100 image, whose body there is
``raise NotImplementedError()`` (ixformer's native V2 kernel gives wrong results, see the team's notes),
and the hand-written ``paged_attention_v2_pytorch.py`` the notes describe. Same algorithm as vLLM's
``paged_attention_v2_kernel`` + ``paged_attention_v2_reduce_kernel``:

* phase 1 (:func:`paged_attention_v2_partitions`): every sequence is cut into partitions of
  ``PARTITION_SIZE`` (512) tokens; for each (sequence, head, partition) compute the partition's max logit,
  the sum of ``exp(logit - max)`` and the partition's softmax-weighted sum of V (normalised by that sum);
* phase 2 (:func:`merge_partitions`): log-sum-exp merge,
  ``out = sum_p exp_sum_p * exp(max_p - global_max) * tmp_out_p / sum_p exp_sum_p * exp(max_p - global_max)``.

Phase 1 is vectorised over (sequence, partition) pairs: their block ids are gathered from the block
tables and the K/V blocks of many partitions gathered with one index per chunk, so there is no Python loop
per partition or per sequence. Chunks bound the gathered fp32 K/V to ``max_chunk_bytes``. The pairs are
enumerated one of two ways:

* padded (the default when ``max_seq_len`` is given, as vLLM always gives it): every sequence gets
  ``ceil(max_seq_len / 512)`` partitions, those past its end come out empty. No host sync (nothing waits
  for the GPU), fewest launches; work grows with ``num_seqs * max_seq_len``.
* ragged (``ragged=True``, or no ``max_seq_len``): only partitions that hold tokens; costs one host sync
  (``seq_lens`` to the host) and an index scatter; work grows with ``sum(seq_lens)``. Better for batches
  of very unequal lengths.

Logits, softmax and the V sum run in fp32 (as in vLLM's kernels); outputs are cast to the query's dtype.

Expected layouts (vLLM's V1 paged cache, ``x = 16 // element_size``):

* ``query``: ``[num_seqs, num_heads, head_size]``
* ``key_cache``: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``
* ``value_cache``: ``[num_blocks, num_kv_heads, head_size, block_size]``
* ``block_tables``: ``[num_seqs, max_num_blocks_per_seq]`` (int), ``seq_lens``: ``[num_seqs]`` (int)
* ``exp_sums``, ``max_logits``: ``[num_seqs, num_heads, max_num_partitions]`` (fp32)
* ``tmp_out``: ``[num_seqs, num_heads, max_num_partitions, head_size]``
* GQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``.
* ALiBi: ``logit += slope[h] * (token_pos - seq_len + 1)``, as in vLLM.

Cache slots past a sequence's length (the tail of its last block, unused block-table entries) are masked
for K and zeroed for V, so stale or NaN data there cannot leak into the result (vLLM's kernel does the same).

Imports only torch and the standard library: the build copies this file into the image's vllm package.
"""

from __future__ import annotations

from bisect import bisect_left

import torch

__all__ = [
    "DEFAULT_MAX_CHUNK_BYTES",
    "_PARTITION_SIZE",
    "merge_partitions",
    "paged_attention_v2",
    "paged_attention_v2_forward",
    "paged_attention_v2_partitions",
]

# Must equal PARTITION_SIZE of vLLM's paged_attention_v2 launcher and paged_attn.py's _PARTITION_SIZE.
_PARTITION_SIZE = 512
# Upper bound, per device type, on the fp32 K/V (plus logits) gathered for one chunk of partitions. On a
# GPU, big chunks mean few launches; on a CPU, chunks that stay in cache beat big ones (measured in
# benchmarks/overlays_cpu.py).
DEFAULT_MAX_CHUNK_BYTES: dict[str, int] = {"cpu": 8 * 1024 * 1024, "cuda": 256 * 1024 * 1024}


def _validate(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    partition_size: int,
    alibi_slopes: torch.Tensor | None,
) -> tuple[int, int, int, int, int, int]:
    """Check shapes; return ``(num_seqs, num_heads, head_size, num_kv_heads, block_size, x)``."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got {tuple(query.shape)}")
    if key_cache.dim() != 5:
        raise ValueError(f"key_cache must be [blocks, kv_heads, head_size/x, block_size, x], "
                         f"got {tuple(key_cache.shape)}")
    num_seqs, num_heads, head_size = query.shape
    num_blocks, num_kv_heads, d_over_x, block_size, x = key_cache.shape
    if d_over_x * x != head_size:
        raise ValueError(f"key_cache head size {d_over_x}*{x} != query head size {head_size}")
    if tuple(value_cache.shape) != (num_blocks, num_kv_heads, head_size, block_size):
        raise ValueError(f"value_cache must be {(num_blocks, num_kv_heads, head_size, block_size)}, "
                         f"got {tuple(value_cache.shape)}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if partition_size <= 0 or partition_size % block_size != 0:
        raise ValueError(f"partition_size {partition_size} must be a positive multiple of "
                         f"block_size {block_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (num_seqs,):
        raise ValueError(f"seq_lens must be [{num_seqs}], got {tuple(seq_lens.shape)}")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (num_heads,):
        raise ValueError(f"alibi_slopes must be [{num_heads}], got {tuple(alibi_slopes.shape)}")
    return num_seqs, num_heads, head_size, num_kv_heads, block_size, x


def _gather_f32(cache: torch.Tensor, blocks: torch.Tensor, perm: tuple[int, ...],
                fused_cast: bool | None = None) -> torch.Tensor:
    """``cache[blocks].permute(perm)`` as a contiguous fp32 tensor.

    ``fused_cast`` (default: on for every device but the CPU) does the permute and the cast in one copy;
    the CPU's copy kernel is slow when it must do both, so there the permute runs in the cache dtype first.
    """
    gathered = cache[blocks].permute(perm)
    if fused_cast is None:
        fused_cast = cache.device.type != "cpu"
    if not fused_cast:
        return gathered.contiguous().to(torch.float32)
    out = torch.empty(gathered.shape, dtype=torch.float32, device=cache.device)
    out.copy_(gathered)
    return out


def _chunk_stats(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    seq_idx: torch.Tensor,
    part_idx: torch.Tensor,
    partition_size: int,
    slopes: torch.Tensor | None,
    tail: list[int] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phase 1 for ``n`` (sequence, partition) pairs: ``(exp_sum [n,H], max_logit [n,H], out [n,H,D])``.

    ``q`` is the scaled fp32 query as ``[Hkv, S, G, D]``. ``tail`` lists the pairs (chunk-local) whose V
    tail must be zeroed; ``None`` zeroes every slot past its sequence's end. A pair with no token gives
    ``(0, -inf, 0)``.
    """
    num_kv_heads, _, group, head_size = q.shape
    block_size = key_cache.shape[3]
    blocks_per_part = partition_size // block_size
    max_blocks = block_tables.shape[1]
    device = q.device
    n = seq_idx.shape[0]
    seq_len = lens[seq_idx]

    cols = part_idx[:, None] * blocks_per_part + torch.arange(blocks_per_part, device=device)[None, :]
    block_used = cols * block_size < seq_len[:, None]
    blocks = block_tables[seq_idx[:, None], cols.clamp(max=max_blocks - 1)].to(torch.int64)
    blocks = torch.where(block_used, blocks, torch.zeros_like(blocks)).reshape(-1)
    pos = part_idx[:, None] * partition_size + torch.arange(partition_size, device=device)[None, :]  # [n, T]
    valid = pos < seq_len[:, None]

    k = _gather_f32(key_cache, blocks, (1, 0, 3, 2, 4)).view(num_kv_heads, n, partition_size, head_size)
    v = _gather_f32(value_cache, blocks, (1, 0, 3, 2)).view(num_kv_heads, n, partition_size, head_size)
    # Zero V past the sequence end: stale or NaN slots would poison probs @ V even at probability 0.
    if tail is None:
        v.masked_fill_(~valid[None, :, :, None], 0.0)
    elif tail:
        t_idx = torch.tensor(tail, device=device)
        v[:, t_idx] = v[:, t_idx].masked_fill(~valid[t_idx][None, :, :, None], 0.0)

    logits = torch.matmul(q[:, seq_idx], k.transpose(-1, -2))  # [Hkv, n, G, T]
    if slopes is not None:
        rel = (pos - seq_len[:, None] + 1).to(torch.float32)  # [n, T]
        logits = logits + slopes * rel[None, :, None, :]
    logits.masked_fill_(~valid[None, :, None, :], float("-inf"))

    part_max = logits.amax(dim=-1)  # [Hkv, n, G]; -inf for a pair without tokens
    safe_max = torch.where(torch.isfinite(part_max), part_max, torch.zeros_like(part_max))
    probs = torch.exp(logits - safe_max[..., None])
    part_sum = probs.sum(dim=-1)
    acc = torch.matmul(probs, v) / torch.where(part_sum > 0, part_sum, torch.ones_like(part_sum))[..., None]

    num_heads = num_kv_heads * group
    return (part_sum.permute(1, 0, 2).reshape(n, num_heads),
            part_max.permute(1, 0, 2).reshape(n, num_heads),
            acc.permute(1, 0, 2, 3).reshape(n, num_heads, head_size))


def paged_attention_v2_partitions(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    partition_size: int = _PARTITION_SIZE,
    max_chunk_bytes: int | None = None,
    ragged: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phase 1: per-partition statistics and partial outputs, all in fp32.

    Returns ``(exp_sums, max_logits, tmp_out)`` of shapes ``[S, H, P]``, ``[S, H, P]`` and
    ``[S, H, P, D]`` with ``P = ceil(max_seq_len / partition_size)``. For a partition that lies wholly
    past its sequence's end: ``exp_sums = 0``, ``max_logits = -inf``, ``tmp_out = 0``.
    ``tmp_out[s, h, p]`` is the partition's softmax-weighted V (already divided by ``exp_sums``).
    ``ragged`` picks the pair enumeration (module docstring); by default padded iff ``max_seq_len`` is
    given. In padded mode a ``seq_len > max_seq_len`` is not detected (vLLM's kernel has the same contract).
    """
    num_seqs, num_heads, head_size, num_kv_heads, block_size, _x = _validate(
        query, key_cache, value_cache, block_tables, seq_lens, partition_size, alibi_slopes)
    device = query.device
    group = num_heads // num_kv_heads
    max_blocks = block_tables.shape[1]
    if ragged is None:
        ragged = max_seq_len is None

    lens_host: list[int] = []
    if ragged:
        lens_host = [int(v) for v in seq_lens.tolist()]  # the one host sync: S integers
        if any(n < 0 for n in lens_host):
            raise ValueError("seq_lens must be >= 0")
        longest = max(lens_host, default=0)
        if max_seq_len is None:
            max_seq_len = longest
        if longest > max_seq_len:
            raise ValueError(f"a sequence of {longest} tokens is longer than max_seq_len={max_seq_len}")
        blocks_needed = (longest + block_size - 1) // block_size
        if blocks_needed > max_blocks:
            raise ValueError(f"block_tables has {max_blocks} columns, a sequence needs {blocks_needed}")
    assert max_seq_len is not None
    num_parts = (max_seq_len + partition_size - 1) // partition_size

    f32 = torch.float32
    lens = seq_lens.to(device=device, dtype=torch.int64)
    q = (query.to(f32) * scale).view(num_seqs, num_kv_heads, group, head_size).transpose(0, 1)  # [Hkv,S,G,D]
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=f32).view(num_kv_heads, 1, group, 1)
    kv_bytes = partition_size * num_kv_heads * head_size * (8 + 2 * key_cache.element_size())
    logit_bytes = 3 * num_heads * partition_size * 4
    if max_chunk_bytes is None:
        max_chunk_bytes = DEFAULT_MAX_CHUNK_BYTES.get(device.type, DEFAULT_MAX_CHUNK_BYTES["cuda"])
    pairs_per_chunk = max(1, max_chunk_bytes // (kv_bytes + logit_bytes))

    if not ragged:
        # Pair j = (j // P, j % P); results land in [S*P, H(, D)] rows in pair order.
        total = num_seqs * num_parts
        es = torch.empty(total, num_heads, dtype=f32, device=device)
        ml = torch.empty(total, num_heads, dtype=f32, device=device)
        to = torch.empty(total, num_heads, head_size, dtype=f32, device=device)
        pair_ids = torch.arange(total, device=device)
        for c0 in range(0, total, pairs_per_chunk):
            c1 = min(total, c0 + pairs_per_chunk)
            ids = pair_ids[c0:c1]
            e, m, o = _chunk_stats(q, key_cache, value_cache, block_tables, lens, ids // num_parts,
                                   ids % num_parts, partition_size, slopes, None)
            es[c0:c1], ml[c0:c1], to[c0:c1] = e, m, o
        return (es.view(num_seqs, num_parts, num_heads).transpose(1, 2).contiguous(),
                ml.view(num_seqs, num_parts, num_heads).transpose(1, 2).contiguous(),
                to.view(num_seqs, num_parts, num_heads, head_size).transpose(1, 2).contiguous())

    exp_sums = torch.zeros(num_seqs, num_heads, num_parts, dtype=f32, device=device)
    max_logits = torch.full((num_seqs, num_heads, num_parts), float("-inf"), dtype=f32, device=device)
    tmp_out = torch.zeros(num_seqs, num_heads, num_parts, head_size, dtype=f32, device=device)
    parts_host = [(n + partition_size - 1) // partition_size for n in lens_host]
    total_pairs = sum(parts_host)
    if total_pairs == 0:
        return exp_sums, max_logits, tmp_out
    # Only the pairs that hold a token, sequence-major.
    parts = torch.tensor(parts_host, dtype=torch.int64, device=device)
    pair_seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), parts, output_size=total_pairs)
    first_pair = torch.cumsum(parts, 0) - parts
    pair_part = torch.arange(total_pairs, device=device) - first_pair[pair_seq]
    # A sequence's last partition is the only one that can end past the sequence: its V tail needs zeroing.
    partial_pairs: list[int] = []
    start = 0
    for n_tok, n_parts in zip(lens_host, parts_host, strict=True):
        if n_parts and n_tok % partition_size:
            partial_pairs.append(start + n_parts - 1)
        start += n_parts

    for c0 in range(0, total_pairs, pairs_per_chunk):
        c1 = min(total_pairs, c0 + pairs_per_chunk)
        seq_idx, part_idx = pair_seq[c0:c1], pair_part[c0:c1]
        tail = [j - c0 for j in partial_pairs[bisect_left(partial_pairs, c0):bisect_left(partial_pairs, c1)]]
        e, m, o = _chunk_stats(q, key_cache, value_cache, block_tables, lens, seq_idx, part_idx,
                               partition_size, slopes, tail)
        exp_sums[seq_idx, :, part_idx] = e
        max_logits[seq_idx, :, part_idx] = m
        tmp_out[seq_idx, :, part_idx] = o
    return exp_sums, max_logits, tmp_out


def merge_partitions(
    exp_sums: torch.Tensor,
    max_logits: torch.Tensor,
    tmp_out: torch.Tensor,
    seq_lens: torch.Tensor,
    partition_size: int = _PARTITION_SIZE,
) -> torch.Tensor:
    """Phase 2: log-sum-exp merge of the partitions into ``[S, H, D]`` (fp32).

    Only the first ``ceil(seq_len / partition_size)`` partitions of each sequence are read; the rest of
    the buffers may hold anything (vLLM's kernel leaves them unwritten). A sequence of length 0 gives 0.
    """
    if exp_sums.dim() != 3 or max_logits.shape != exp_sums.shape or tmp_out.shape[:3] != exp_sums.shape:
        raise ValueError(f"inconsistent shapes: exp_sums {tuple(exp_sums.shape)}, max_logits "
                         f"{tuple(max_logits.shape)}, tmp_out {tuple(tmp_out.shape)}")
    num_parts = exp_sums.shape[-1]
    lens = seq_lens.to(device=exp_sums.device, dtype=torch.int64)
    parts = (lens + partition_size - 1) // partition_size
    valid = (torch.arange(num_parts, device=exp_sums.device)[None, :] < parts[:, None])[:, None, :]  # [S,1,P]

    m = max_logits.to(torch.float32).masked_fill(~valid, float("-inf"))
    global_max = m.amax(dim=-1, keepdim=True)
    global_max = torch.where(torch.isfinite(global_max), global_max, torch.zeros_like(global_max))
    weights = exp_sums.to(torch.float32) * torch.exp(m - global_max)
    weights = torch.where(valid, weights, torch.zeros_like(weights))
    total = weights.sum(dim=-1, keepdim=True)
    weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    partial = torch.where(valid[..., None], tmp_out.to(torch.float32), torch.zeros((), device=tmp_out.device))
    return torch.einsum("shp,shpd->shd", weights, partial)


def paged_attention_v2_forward(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    partition_size: int = _PARTITION_SIZE,
    max_chunk_bytes: int | None = None,
    ragged: bool | None = None,
) -> torch.Tensor:
    """Functional API: decode attention over the paged cache, ``[S, H, D]`` in ``query.dtype``.

    Without ``max_seq_len`` (or with ``ragged=True``) it costs one host sync; see the module docstring.
    """
    exp_sums, max_logits, tmp_out = paged_attention_v2_partitions(
        query, key_cache, value_cache, block_tables, seq_lens, scale, alibi_slopes,
        max_seq_len, partition_size, max_chunk_bytes, ragged)
    return merge_partitions(exp_sums, max_logits, tmp_out, seq_lens, partition_size).to(query.dtype)


def paged_attention_v2(
    out: torch.Tensor,
    exp_sum: torch.Tensor,
    max_logits: torch.Tensor,
    tmp_out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: torch.Tensor | None,
    kv_cache_dtype: str,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """Drop-in body for ``vllm._custom_ops.paged_attention_v2`` (same arguments, writes ``out``).

    ``exp_sum``/``max_logits``/``tmp_out`` are filled like the CUDA kernel fills them (first
    ``ceil(max_seq_len / 512)`` partitions); ``out`` is merged from the fp32 values, not from the
    possibly lower-precision ``tmp_out`` buffer. Uses the padded pair enumeration (no host sync), like the
    CUDA kernel's grid of ``num_seqs x max_num_partitions``. Supports ``kv_cache_dtype == "auto"`` only (the cache
    holds the model dtype; ``k_scale``/``v_scale`` are then unused, as in vLLM) and no block-sparse
    attention; ``tp_rank`` only matters for block-sparse attention.
    """
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype={kv_cache_dtype!r}: only 'auto' is supported")
    if blocksparse_vert_stride > 1:
        raise NotImplementedError("block-sparse paged attention is not supported")
    if key_cache.dim() != 5 or key_cache.shape[1] != num_kv_heads or key_cache.shape[3] != block_size:
        raise ValueError(f"key_cache {tuple(key_cache.shape)} does not match num_kv_heads={num_kv_heads}, "
                         f"block_size={block_size}")
    e, m, t = paged_attention_v2_partitions(
        query, key_cache, value_cache, block_tables, seq_lens, scale, alibi_slopes, max_seq_len,
        _PARTITION_SIZE)
    num_parts = e.shape[-1]
    if exp_sum.shape[-1] < num_parts or max_logits.shape[-1] < num_parts or tmp_out.shape[2] < num_parts:
        raise ValueError(f"partition buffers hold {exp_sum.shape[-1]} partitions, {num_parts} needed")
    exp_sum[..., :num_parts].copy_(e)
    max_logits[..., :num_parts].copy_(m)
    tmp_out[:, :, :num_parts].copy_(t)
    out.copy_(merge_partitions(e, m, t, seq_lens, _PARTITION_SIZE))
