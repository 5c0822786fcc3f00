"""Input builders and a markdown table for benchmarks/overlays_cpu.py and benchmarks/overlays_gpu.py.

Shapes follow Qwen3.6-35B-A3B: hidden 2048, 256 experts, top-8, expert intermediate 512 (128 per rank at
tensor-parallel 4); attention 16 query heads, 2 KV heads, head_dim 256; paged cache with block size 16.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[1]
for _p in (_REPO / "overlays" / "bi100", _REPO / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

HIDDEN = 2048
NUM_EXPERTS = 256
TOP_K = 8
NUM_HEADS = 16
NUM_KV_HEADS = 2
HEAD_SIZE = 256
BLOCK_SIZE = 16


@dataclass
class DecodeCase:
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    max_seq_len: int


@dataclass
class PrefixCase:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor


@dataclass
class MoECase:
    x: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    weights: torch.Tensor
    ids: torch.Tensor


def paged_cache(lens: list[int], dtype: torch.dtype, device: str, gen: torch.Generator, *, spare_blocks: int = 64,
                kv_heads: int = NUM_KV_HEADS, head_size: int = HEAD_SIZE,
                block_size: int = BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's paged K/V cache layout (K as [blocks, heads, head/x, block, x], x = 16 bytes of ``dtype``) filled
    from ``gen``, and block tables that hand each sequence randomly placed blocks."""
    x = 16 // torch.empty((), dtype=dtype).element_size()
    per_seq = [max(1, math.ceil(n / block_size)) for n in lens]
    num_blocks = sum(per_seq) + spare_blocks
    kc = torch.randn(num_blocks, kv_heads, head_size // x, block_size, x, generator=gen,
                     device=device).to(dtype)
    vc = torch.randn(num_blocks, kv_heads, head_size, block_size, generator=gen, device=device).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    table = torch.zeros(len(lens), max(per_seq), dtype=torch.int32, device=device)
    used = 0
    for s, n in enumerate(per_seq):
        table[s, :n] = perm[used:used + n].to(torch.int32)
        used += n
    return kc, vc, table


def make_decode_case(lens: list[int], dtype: torch.dtype, device: str, seed: int = 0) -> DecodeCase:
    gen = torch.Generator(device=device).manual_seed(seed)
    kc, vc, table = paged_cache(lens, dtype, device, gen)
    q = torch.randn(len(lens), NUM_HEADS, HEAD_SIZE, generator=gen, device=device).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return DecodeCase(q, kc, vc, table, seq_lens, 1 / math.sqrt(HEAD_SIZE), max(lens))


def make_prefix_case(ctx_lens: list[int], new_lens: list[int], dtype: torch.dtype, device: str,
                     seed: int = 0) -> PrefixCase:
    gen = torch.Generator(device=device).manual_seed(seed)
    kc, vc, table = paged_cache(ctx_lens, dtype, device, gen)
    total = sum(new_lens)
    q = torch.randn(total, NUM_HEADS, HEAD_SIZE, generator=gen, device=device).to(dtype)
    k = torch.randn(total, NUM_KV_HEADS, HEAD_SIZE, generator=gen, device=device).to(dtype)
    v = torch.randn(total, NUM_KV_HEADS, HEAD_SIZE, generator=gen, device=device).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
    return PrefixCase(q, k, v, kc, vc, table, qsl, ctx)


def make_moe_case(num_tokens: int, inter: int, dtype: torch.dtype, device: str, seed: int = 0,
                  hidden: int = HIDDEN, num_experts: int = NUM_EXPERTS, top_k: int = TOP_K) -> MoECase:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen, device=device).to(dtype)
    w1 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen, device=device)
          / math.sqrt(hidden)).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen, device=device) / math.sqrt(inter)).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return MoECase(x, w1, w2, weights.float(), ids.to(torch.int32))


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max())
