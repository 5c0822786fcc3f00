"""Naive twins of the overlay modules (what the team's notes describe as the baseline), and dense
references, for benchmarks/overlays_cpu.py and benchmarks/overlays_gpu.py.

* :func:`naive_fused_experts`: the baseline MoE, a loop over the experts in use, each doing a scattered
  ``hidden_states[tok_ids]`` gather, its own activation and its own scatter-back.
* :func:`naive_paged_attention_v2`: phase 1 as a Python loop over (sequence, partition), each gathering
  its blocks; phase 2 per sequence.
* :func:`naive_context_attention`: the baseline ``_forward_prefix_pytorch``, re-gathering and
  re-permuting the context blocks from the paged cache in every query tile (and masking the whole score
  tile; the module masks only the tile's own diagonal block).
* :func:`dense_decode_reference`, :func:`dense_prefix_reference`: plain fp32 attention per sequence over
  the V2-layout (``[blocks, kv_heads, block_size, head_size]``) conversion of the cache.

tests/overlays/test_overlays_naive.py checks every function here against the tests' float64 references.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays" / "bi100"))

import paged_attention_layout as layout


def naive_fused_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Per-expert gather loop (the baseline): up to 256 iterations of gather -> 2 GEMMs -> scatter."""
    inter = w1.shape[1] // 2
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for eid in torch.unique(topk_ids).tolist():
        tok_ids, slot = (topk_ids == eid).nonzero(as_tuple=True)
        tokens = hidden_states[tok_ids]  # scattered gather
        gate_up = F.linear(tokens, w1[eid])
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(act, w2[eid])
        out.index_add_(0, tok_ids, y.float() * topk_weights[tok_ids, slot].float()[:, None])
    return out.to(hidden_states.dtype)


def _dense_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor,
              n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[Hkv, n, D]`` K and V of ``n`` tokens held in ``blocks`` (V1 layout), via a permute + copy."""
    _, hkv, d_over_x, _bs, x = key_cache.shape
    k = key_cache[blocks].permute(1, 0, 3, 2, 4).contiguous().view(hkv, -1, d_over_x * x)[:, :n]
    v = value_cache[blocks].permute(1, 0, 3, 2).contiguous().view(hkv, -1, d_over_x * x)[:, :n]
    return k, v


def naive_paged_attention_v2(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    partition_size: int = 512,
) -> torch.Tensor:
    """Two-phase partitioned attention with a Python loop over every (sequence, partition)."""
    _num_seqs, num_heads, head_size = query.shape
    hkv, block_size = key_cache.shape[1], key_cache.shape[3]
    group = num_heads // hkv
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for s, seq_len in enumerate(seq_lens.tolist()):
        parts = math.ceil(seq_len / partition_size)
        if parts == 0:
            continue
        q = query[s].float().view(hkv, group, head_size) * scale
        max_logits = torch.empty(num_heads, parts, device=query.device)
        exp_sums = torch.empty(num_heads, parts, device=query.device)
        tmp_out = torch.empty(num_heads, parts, head_size, device=query.device)
        for p in range(parts):
            lo, hi = p * partition_size, min(seq_len, (p + 1) * partition_size)
            blocks = block_tables[s, lo // block_size:(hi + block_size - 1) // block_size].long()
            k, v = _dense_kv(key_cache, value_cache, blocks, hi - lo)
            logits = torch.einsum("kgd,knd->kgn", q, k.float())
            m = logits.amax(dim=-1, keepdim=True)
            e = torch.exp(logits - m)
            ssum = e.sum(dim=-1)
            max_logits[:, p] = m.reshape(num_heads)
            exp_sums[:, p] = ssum.reshape(num_heads)
            tmp_out[:, p] = (torch.einsum("kgn,knd->kgd", e, v.float()) / ssum[..., None]).reshape(
                num_heads, head_size)
        gmax = max_logits.amax(dim=-1, keepdim=True)
        w = exp_sums * torch.exp(max_logits - gmax)
        out[s] = torch.einsum("hp,hpd->hd", w / w.sum(dim=-1, keepdim=True), tmp_out)
    return out.to(query.dtype)


def naive_context_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    tile_size: int = 256,
) -> torch.Tensor:
    """The baseline prefix attention: every query tile re-gathers the context from the paged cache."""
    num_heads, head_size = query.shape[1], query.shape[2]
    hkv, block_size = key_cache.shape[1], key_cache.shape[3]
    group = num_heads // hkv
    scale = 1.0 / math.sqrt(head_size)
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        q0, q1 = starts[i], starts[i + 1]
        blocks = block_tables[i, :(ctx + block_size - 1) // block_size].long()
        for t0 in range(0, q1 - q0, tile_size):
            t1 = min(q1 - q0, t0 + tile_size)
            ctx_k, ctx_v = _dense_kv(key_cache, value_cache, blocks, ctx)  # per-tile gather + permute
            k = torch.cat([ctx_k, key[q0:q0 + t1].transpose(0, 1)], dim=1).float()
            v = torch.cat([ctx_v, value[q0:q0 + t1].transpose(0, 1)], dim=1).float()
            t = t1 - t0
            q = query[q0 + t0:q0 + t1].float().view(t, hkv, group, head_size).transpose(0, 1)
            scores = torch.bmm(q.reshape(hkv, t * group, head_size), k.transpose(1, 2)) * scale
            q_pos = torch.arange(ctx + t0, ctx + t1, device=query.device)[:, None]
            k_pos = torch.arange(ctx + t1, device=query.device)[None, :]
            scores = scores.view(hkv, t, group, -1).masked_fill((k_pos > q_pos)[None, :, None, :], float("-inf"))
            probs = torch.softmax(scores.view(hkv, t * group, -1), dim=-1)
            o = torch.bmm(probs, v).view(hkv, t, group, head_size)
            out[q0 + t0:q0 + t1] = o.transpose(0, 1).reshape(t, num_heads, head_size).to(out.dtype)
    return out


def _dense_v2(key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor,
              n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, Hkv, D]`` K/V in fp32 through the V2 layout conversion (a code path independent of the rest)."""
    k2 = layout.v1_to_v2_key_cache(key_cache[blocks])  # [nb, Hkv, bs, D]
    v2 = layout.v1_to_v2_value_cache(value_cache[blocks])
    k = k2.transpose(1, 2).reshape(-1, k2.shape[1], k2.shape[3])[:n]
    v = v2.transpose(1, 2).reshape(-1, v2.shape[1], v2.shape[3])[:n]
    return k.float(), v.float()


def dense_decode_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Plain fp32 ``softmax(q K^T * scale) V`` per sequence (no partitions), ``[S, H, D]`` fp32."""
    _num_seqs, num_heads, _ = query.shape
    bs = key_cache.shape[3]
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for s, n in enumerate(seq_lens.tolist()):
        k, v = _dense_v2(key_cache, value_cache, block_tables[s, :(n + bs - 1) // bs].long(), n)
        rep = num_heads // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", query[s].float(), k) * scale, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", p, v)
    return out


def dense_prefix_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """Plain fp32 attention per sequence over [context; new] with an offset causal mask, fp32 out."""
    num_heads, head_size = query.shape[1], query.shape[2]
    bs = key_cache.shape[3]
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    starts = query_start_loc.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        q0, q1 = starts[i], starts[i + 1]
        ck, cv = _dense_v2(key_cache, value_cache, block_tables[i, :(ctx + bs - 1) // bs].long(), ctx)
        k = torch.cat([ck, key[q0:q1].float()])
        v = torch.cat([cv, value[q0:q1].float()])
        rep = num_heads // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q0:q1].float(), k) / math.sqrt(head_size)
        q_pos = torch.arange(ctx, ctx + q1 - q0, device=query.device)[:, None]
        k_pos = torch.arange(ctx + q1 - q0, device=query.device)[None, :]
        scores = scores.masked_fill((k_pos > q_pos)[None], float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
    return out
