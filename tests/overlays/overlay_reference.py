"""Plain references and fixtures for the overlay tests.

Everything here is written for obviousness, not speed: dense per-sequence attention in float64, a
per-(token, expert) MoE loop in float64, and a paged cache written block by block with the element
formula of vLLM's ``reshape_and_cache`` (``key_cache[b, h, d // x, slot, d % x] = k[t, h, d]``,
``value_cache[b, h, d, slot] = v[t, h, d]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Absolute / relative tolerances of an overlay output against a float64 reference computed from the
# same (already rounded) inputs. fp32: only summation order differs. fp16/bf16: the output is rounded
# once to the dtype (unit roundoff 2^-11 / 2^-8), plus, for MoE, the intermediate activations.
ATTN_TOL = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
MOE_TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2.5e-2, 2e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
                 table: dict[torch.dtype, tuple[float, float]]) -> None:
    atol, rtol = table[dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


@dataclass
class PagedCache:
    key_cache: torch.Tensor  # [num_blocks, Hkv, D/x, bs, x]
    value_cache: torch.Tensor  # [num_blocks, Hkv, D, bs]
    block_tables: torch.Tensor  # [S, cols] int32
    seq_lens: torch.Tensor  # [S] int32
    dense_k: list[torch.Tensor]  # per sequence [L, Hkv, D]
    dense_v: list[torch.Tensor]


def build_paged_cache(
    seq_lens: list[int],
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    extra_blocks: int = 3,
    extra_cols: int = 2,
    poison: bool = True,
) -> PagedCache:
    """Random K/V for each sequence written into shuffled blocks of a V1-layout cache.

    With ``poison`` every slot no sequence owns (tails of last blocks, spare blocks) holds NaN, and the
    spare block-table columns point at spare blocks, so any read past a sequence's end shows up.
    """
    x = 16 // torch.empty((), dtype=dtype).element_size()
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    fill = float("nan") if poison else 0.0
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), fill, dtype=dtype)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), fill, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    spare = perm[sum(blocks_per_seq):]
    cols = max([*blocks_per_seq, 1]) + extra_cols
    block_tables = torch.empty(len(seq_lens), cols, dtype=torch.int32)
    dense_k, dense_v = [], []
    used = 0
    for s, n in enumerate(seq_lens):
        k = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        for j in range(cols):
            if j < blocks_per_seq[s]:
                blk = int(perm[used])
                used += 1
                t0, t1 = j * block_size, min(n, (j + 1) * block_size)
                # key_cache[blk, h, d // x, slot, d % x] = k[t0 + slot, h, d]
                key_cache[blk, :, :, : t1 - t0, :] = k[t0:t1].view(t1 - t0, num_kv_heads, head_size // x, x) \
                    .permute(1, 2, 0, 3)
                # value_cache[blk, h, d, slot] = v[t0 + slot, h, d]
                value_cache[blk, :, :, : t1 - t0] = v[t0:t1].permute(1, 2, 0)
            else:
                blk = int(spare[j % len(spare)]) if len(spare) else 0
            block_tables[s, j] = blk
    return PagedCache(key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
                      dense_k, dense_v)


def reference_decode(
    query: torch.Tensor,
    dense_k: list[torch.Tensor],
    dense_v: list[torch.Tensor],
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense single-query attention per sequence in float64: ``softmax(q k^T * scale + alibi) v``."""
    num_seqs, num_heads, head_size = query.shape
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for s in range(num_seqs):
        k, v = dense_k[s].double(), dense_v[s].double()  # [L, Hkv, D]
        n = k.shape[0]
        if n == 0:
            continue
        rep = num_heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)  # query head h -> kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        logits = torch.einsum("hd,lhd->hl", query[s].double(), k) * scale
        if alibi_slopes is not None:
            logits = logits + alibi_slopes.double()[:, None] * (torch.arange(n) - n + 1).double()[None, :]
        out[s] = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), v)
    return out


def reference_prefix(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dense_ctx_k: list[torch.Tensor],
    dense_ctx_v: list[torch.Tensor],
    query_lens: list[int],
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Dense attention per sequence in float64 over [context; new tokens] with an offset causal mask."""
    num_heads, head_size = query.shape[1], query.shape[2]
    out = torch.zeros(query.shape, dtype=torch.float64)
    q0 = 0
    for s, n_new in enumerate(query_lens):
        q1 = q0 + n_new
        ctx = dense_ctx_k[s].shape[0]
        k = torch.cat([dense_ctx_k[s], key[q0:q1]]).double()  # [ctx + new, Hkv, D]
        v = torch.cat([dense_ctx_v[s], value[q0:q1]]).double()
        rep = num_heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q0:q1].double(), k) * scale
        q_pos = torch.arange(ctx, ctx + n_new)[:, None]
        k_pos = torch.arange(ctx + n_new)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= q_pos - k_pos < sliding_window
        if alibi_slopes is not None:
            scores = scores + alibi_slopes.double()[:, None, None] * (k_pos - q_pos).double()[None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
        q0 = q1
    assert head_size == out.shape[2]
    return out


def reference_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    activation: str = "silu",
) -> torch.Tensor:
    """Per (token, slot) loop in float64: ``out[t] += w[t,k] * W2[e] (act(W_gate[e] x) * W_up[e] x)``."""
    act = F.silu if activation == "silu" else F.gelu
    inter = w1.shape[1] // 2
    out = torch.zeros(hidden_states.shape, dtype=torch.float64)
    for t in range(hidden_states.shape[0]):
        x = hidden_states[t].double()
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            if expert_map is not None:
                e = int(expert_map[e])
                if e < 0:
                    continue
            gate = w1[e, :inter].double() @ x
            up = w1[e, inter:].double() @ x
            out[t] += float(topk_weights[t, k]) * (w2[e].double() @ (act(gate) * up))
    return out


def random_moe(
    num_tokens: int,
    hidden: int,
    inter: int,
    num_experts: int,
    top_k: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of O(1) scale: ``x ~ N(0,1)``, weights ``N(0, 1/fan_in)``, top-k of a random softmax."""
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    w1 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) / math.sqrt(inter)).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), min(top_k, num_experts), dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return x, w1, w2, weights.to(torch.float32), ids.to(torch.int32)
