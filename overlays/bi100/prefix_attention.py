"""Prefix-context (chunked-prefill) attention over a paged KV cache in plain PyTorch.

Replaces, in the BI-V100 image, the PyTorch fallback ``_forward_prefix_pytorch`` of the team's
``paged_attn.py``, which stands in for ``vllm.attention.ops.paged_attn.PagedAttention.forward_prefix`` /
``vllm.attention.ops.prefix_prefill.context_attention_fwd`` (the Triton kernel) when Triton is absent or
fails. :func:`forward_prefix` keeps ``PagedAttention.forward_prefix``'s arguments.

For each sequence ``i`` the new tokens ``query[qsl[i]:qsl[i+1]]`` (``L_i`` of them, at absolute positions
``ctx_i .. ctx_i + L_i - 1``) attend to the ``ctx_i`` cached context tokens, read from the paged cache
through ``block_tables[i]``, and causally to the new tokens themselves (``key``/``value``).

The context K/V of a sequence is gathered from the paged cache ONCE (one ``index_select`` + permute per
sequence) and concatenated with the new tokens' K/V before the query-tile loop; each tile then only
slices views of it (``k_all[:, lo:hi]``). The baseline re-gathered and re-permuted the context blocks in
every tile (195 times for a 100K-token prompt). Query tiles bound the fp32 score matrix to
``max_tile_bytes``. Scores and softmax run in fp32; the output has the query's dtype.

Expected layouts:

* ``query``: ``[num_new_tokens, num_heads, head_size]``; ``key``/``value``: ``[num_new_tokens,
  num_kv_heads, head_size]``
* ``key_cache``: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]`` (vLLM V1 layout)
* ``value_cache``: ``[num_blocks, num_kv_heads, head_size, block_size]``
* ``block_tables``: ``[num_seqs, max_blocks]``; ``query_start_loc``: ``[num_seqs + 1]`` (cumulative);
  ``seq_lens``: ``[num_seqs]`` = context + new tokens; ``context_lens``: ``[num_seqs]``
* GQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``
* ALiBi: ``score += slope[h] * (key_pos - query_pos)``; sliding window: a query at ``p`` sees keys at
  ``k`` with ``p - k < sliding_window`` (as in ``context_attention_fwd``)

Imports only torch and the standard library: the build copies this file into the image's vllm package.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "DEFAULT_MAX_TILE_BYTES",
    "context_attention",
    "forward_prefix",
    "gather_context",
]

# Target size, per device type, of one tile's fp32 scores + probabilities (at least one query row per
# tile). Fewer, bigger tiles pay off on a GPU; a CPU wants them cache-sized.
DEFAULT_MAX_TILE_BYTES: dict[str, int] = {"cpu": 64 * 1024 * 1024, "cuda": 1024 * 1024 * 1024}
MAX_TILE_TOKENS = 1024


def gather_context(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_ids: torch.Tensor,
    context_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense context K and V, ``[num_kv_heads, context_len, head_size]`` each, from the paged cache."""
    num_blocks_needed = block_ids.shape[0]
    _, num_kv_heads, d_over_x, block_size, x = key_cache.shape
    head_size = d_over_x * x
    if num_blocks_needed * block_size < context_len:
        raise ValueError(f"{num_blocks_needed} blocks of {block_size} cannot hold {context_len} tokens")
    ids = block_ids.to(torch.int64)
    k = key_cache.index_select(0, ids)  # [n, Hkv, d/x, bs, x]
    k = k.permute(1, 0, 3, 2, 4).reshape(num_kv_heads, num_blocks_needed * block_size, head_size)
    v = value_cache.index_select(0, ids)  # [n, Hkv, d, bs]
    v = v.permute(1, 0, 3, 2).reshape(num_kv_heads, num_blocks_needed * block_size, head_size)
    return k[:, :context_len], v[:, :context_len]


def _tile_rows(num_heads: int, kv_len: int, max_tile_bytes: int | None, device: torch.device) -> int:
    """Query rows per tile so that ``rows * num_heads * kv_len`` fp32 scores + probs fit the budget."""
    if max_tile_bytes is None:
        max_tile_bytes = DEFAULT_MAX_TILE_BYTES.get(device.type, DEFAULT_MAX_TILE_BYTES["cuda"])
    per_row = max(1, num_heads * kv_len * 4 * 2)
    return max(1, min(MAX_TILE_TOKENS, max_tile_bytes // per_row))


def context_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sliding_window: int | None = None,
    tile_size: int | None = None,
    max_tile_bytes: int | None = None,
) -> torch.Tensor:
    """Functional API: attention of the new tokens over (cached context + causal new tokens).

    Returns ``[num_new_tokens, num_heads, head_size]`` in ``query.dtype``. ``scale`` defaults to
    ``1/sqrt(head_size)``; ``tile_size`` (query rows per tile) defaults to what ``max_tile_bytes`` allows.
    """
    if query.dim() != 3 or key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"query [N, H, D], key/value [N, Hkv, D] expected, got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    num_tokens, num_heads, head_size = query.shape
    _, num_kv_heads, d_over_x, block_size, x = key_cache.shape
    if key.shape[0] != num_tokens or key.shape[1] != num_kv_heads or key.shape[2] != head_size:
        raise ValueError(f"key {tuple(key.shape)} does not match query {tuple(query.shape)} and "
                         f"{num_kv_heads} kv heads")
    if d_over_x * x != head_size or num_heads % num_kv_heads != 0:
        raise ValueError(f"cache {tuple(key_cache.shape)} does not fit query {tuple(query.shape)}")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (num_heads,):
        raise ValueError(f"alibi_slopes must be [{num_heads}], got {tuple(alibi_slopes.shape)}")
    if sliding_window is not None and sliding_window <= 0:
        sliding_window = None
    group = num_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    num_seqs = query_start_loc.shape[0] - 1
    starts = [int(v) for v in query_start_loc.tolist()]
    ctx_lens = [int(v) for v in context_lens.tolist()]
    if len(ctx_lens) != num_seqs or block_tables.shape[0] < num_seqs:
        raise ValueError("query_start_loc, context_lens and block_tables disagree on the number of sequences")
    if starts[-1] != num_tokens:
        raise ValueError(f"query_start_loc ends at {starts[-1]}, query has {num_tokens} tokens")

    f32 = torch.float32
    device = query.device
    out = torch.empty_like(query)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=f32).view(num_kv_heads, 1, group, 1)
    max_rows = tile_size or MAX_TILE_TOKENS
    causal = torch.ones(max_rows, max_rows, dtype=torch.bool, device=device).triu(1)  # [i, j]: j > i

    for i in range(num_seqs):
        q0, q1 = starts[i], starts[i + 1]
        new_len, ctx_len = q1 - q0, ctx_lens[i]
        if new_len <= 0:
            continue
        n_blocks = (ctx_len + block_size - 1) // block_size
        ctx_k, ctx_v = gather_context(key_cache, value_cache, block_tables[i, :n_blocks], ctx_len)
        # Context + new tokens, [Hkv, ctx+new, D] in fp32: built once, sliced by every tile.
        k_all = torch.cat([ctx_k, key[q0:q1].transpose(0, 1)], dim=1).to(f32)
        v_all = torch.cat([ctx_v, value[q0:q1].transpose(0, 1)], dim=1).to(f32)
        # [Hkv, new, G, D]: a tile's (token, group) rows fold into one matrix dimension, so each tile is a
        # plain batched matmul per kv head (broadcasting K over G would copy it G times per tile).
        q = (query[q0:q1].to(f32) * scale).view(new_len, num_kv_heads, group, head_size).transpose(0, 1)

        rows = tile_size or _tile_rows(num_heads, ctx_len + new_len, max_tile_bytes, device)
        for t0 in range(0, new_len, rows):
            t1 = min(new_len, t0 + rows)
            t = t1 - t0
            hi = ctx_len + t1  # causal: the tile's last query sits at position ctx_len + t1 - 1
            lo = 0 if sliding_window is None else max(0, ctx_len + t0 - sliding_window + 1)
            n = hi - lo
            q_t = q[:, t0:t1].reshape(num_kv_heads, t * group, head_size)
            scores = torch.bmm(q_t, k_all[:, lo:hi].transpose(1, 2))  # [Hkv, t*G, n]; K/V: views
            scores4 = scores.view(num_kv_heads, t, group, n)
            if slopes is None and sliding_window is None:
                # Everything before the tile's own tokens is visible: mask only the last t columns.
                scores4[..., n - t:].masked_fill_(causal[:t, :t][None, :, None, :], float("-inf"))
            else:
                q_pos = torch.arange(ctx_len + t0, ctx_len + t1, device=device)
                rel = torch.arange(lo, hi, device=device)[None, :] - q_pos[:, None]  # <= 0 where visible
                visible = rel <= 0
                if sliding_window is not None:
                    visible = visible & (rel > -sliding_window)
                if slopes is not None:
                    scores4 += slopes * rel.to(f32)[None, :, None, :]
                scores4.masked_fill_(~visible[None, :, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.bmm(probs, v_all[:, lo:hi]).view(num_kv_heads, t, group, head_size)
            out[q0 + t0:q0 + t1] = o.transpose(0, 1).reshape(t, num_heads, head_size).to(out.dtype)
    return out


def forward_prefix(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache_dtype: str,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_tensor: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    alibi_slopes: torch.Tensor | None,
    sliding_window: int | None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Drop-in for ``PagedAttention.forward_prefix`` (same arguments); returns the attention output.

    ``kv_cache_dtype`` must be ``"auto"`` (``k_scale``/``v_scale`` are then unused, as in vLLM);
    ``seq_lens_tensor`` must equal ``context_lens`` + new tokens per sequence (checked);
    ``max_query_len`` is only a launch hint for the Triton kernel and is not needed here.
    """
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype={kv_cache_dtype!r}: only 'auto' is supported")
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    num_seqs = query_lens.shape[0]
    expected = context_lens[:num_seqs].to(torch.int64) + query_lens.to(torch.int64)
    if not torch.equal(seq_lens_tensor[:num_seqs].to(torch.int64), expected):
        raise ValueError("seq_lens_tensor != context_lens + query lengths")
    return context_attention(
        query, key, value, key_cache, value_cache, block_tables, query_start_loc,
        context_lens[:num_seqs], alibi_slopes=alibi_slopes, sliding_window=sliding_window)
