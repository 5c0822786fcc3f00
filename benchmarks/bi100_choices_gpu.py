"""GPU figures behind two bi100 choices (no V2 decode; the sorted prefill MoE), at Qwen3.6's per-rank shapes.

    python3 benchmarks/bi100_choices_gpu.py [--out FILE] [--quick] [--device cuda|cpu]

1. Decode at concurrency 1: the organisers' baseline above its 32768 threshold gathers the sequence's K/V out of the
   paged cache and does two matmuls (written here from the facts note's description, not copied); the partitioned
   V2 overlay (``overlays/bi100/paged_attention_v2.py``, padded enumeration, no host sync) is the alternative.
   Per rank at TP 4: 4 query heads, 1 KV head, head_dim 256, block 16, fp16; 1 and 2 sequences of 32K-230K tokens.
2. Prefill MoE: the baseline ``qwen3_5.py`` loop over the unique routed experts (``torch.where`` per expert,
   ``index_add_`` into an fp32 accumulator) vs ``sorted_moe.fused_experts`` (loop impl, the one the vendor's torch
   2.1 can run; grouped where ``torch._grouped_mm`` exists). Per rank: hidden 2048, expert intermediate 128, 256
   experts, top-8, fp16, chunks of 512-8192 tokens.

Each variant is checked against an fp32 reference first (max abs error recorded), then timed between CUDA events:
two warm-ups, then up to 50 calls within ~300 ms; the median is reported with min-max.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO / "overlays" / "bi100"))

import paged_attention_v2 as pa  # noqa: E402
import sorted_moe  # noqa: E402
from overlays_common import paged_cache  # noqa: E402

Q_HEADS, KV_HEADS, HEAD, BLOCK = 4, 1, 256, 16
HIDDEN, INTER, EXPERTS, TOP_K = 2048, 128, 256, 8


def timed(fn: Callable[[], object], cuda: bool, budget_ms: float = 300.0) -> tuple[float, float, float]:
    fn()
    fn()
    if cuda:
        torch.cuda.synchronize()
    samples: list[float] = []
    while len(samples) < 3 or (sum(samples) < budget_ms and len(samples) < 50):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # Event.__init__ is unannotated in torch
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), min(samples), max(samples)


# --------------------------------------------------------------------------- decode


def decode_case(lens: list[int], device: str, seed: int = 0) -> dict[str, object]:
    gen = torch.Generator(device=device).manual_seed(seed)
    kc, vc, table = paged_cache(lens, torch.float16, device, gen, spare_blocks=16, kv_heads=KV_HEADS, head_size=HEAD,
                                block_size=BLOCK)
    q = torch.randn(len(lens), Q_HEADS, HEAD, generator=gen, device=device).half()
    return {"q": q, "kc": kc, "vc": vc, "table": table, "lens": lens,
            "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device), "scale": 1 / math.sqrt(HEAD)}


def gather_decode(c: dict[str, object], dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Per sequence: gather its K/V blocks contiguous, scores = qK^T, softmax (fp32), out = pV."""
    q, kc, vc, table = c["q"], c["kc"], c["vc"], c["table"]
    assert isinstance(q, torch.Tensor) and isinstance(kc, torch.Tensor) and isinstance(vc, torch.Tensor)
    assert isinstance(table, torch.Tensor)
    lens = c["lens"]
    assert isinstance(lens, list)
    out = torch.empty_like(q)
    group = Q_HEADS // KV_HEADS
    for s, n in enumerate(lens):
        nb = math.ceil(n / BLOCK)
        ids = table[s, :nb].long()
        k = kc[ids].permute(0, 3, 1, 2, 4).reshape(nb * BLOCK, KV_HEADS, HEAD)[:n].to(dtype)  # [L, kvh, d]
        v = vc[ids].permute(0, 3, 1, 2).reshape(nb * BLOCK, KV_HEADS, HEAD)[:n].to(dtype)
        qs = q[s].view(KV_HEADS, group, HEAD).to(dtype)
        scores = torch.matmul(qs, k.permute(1, 2, 0)) * float(c["scale"])  # type: ignore[arg-type]
        probs = torch.softmax(scores.float(), dim=-1).to(dtype)
        out[s] = torch.matmul(probs, v.permute(1, 0, 2)).reshape(Q_HEADS, HEAD).to(q.dtype)
    return out


def v2_decode(c: dict[str, object]) -> torch.Tensor:
    lens = c["lens"]
    assert isinstance(lens, list)
    return pa.paged_attention_v2_forward(c["q"], c["kc"], c["vc"], c["table"], c["seq_lens"],  # type: ignore[arg-type]
                                         float(c["scale"]), max_seq_len=max(lens))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- MoE


def moe_case(tokens: int, device: str, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=gen, device=device).half()
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device=device) / math.sqrt(HIDDEN)).half()
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, device=device) / math.sqrt(INTER)).half()
    logits = torch.randn(tokens, EXPERTS, generator=gen, device=device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), TOP_K, dim=-1)
    return {"x": x, "w13": w13, "w2": w2, "weights": (weights / weights.sum(-1, keepdim=True)).float(), "ids": ids}


def baseline_moe_loop(c: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    x, w13, w2, weights, ids = c["x"], c["w13"], c["w2"], c["weights"], c["ids"]
    if dtype is not None:
        x, w13, w2 = x.to(dtype), w13.to(dtype), w2.to(dtype)
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float32, device=x.device)
    for eid in ids.view(-1).unique().tolist():  # type: ignore[no-untyped-call]  # Tensor.unique: unannotated
        tok, slot = torch.where(ids == eid)
        gate_up = torch.nn.functional.linear(x[tok], w13[eid])
        act = torch.nn.functional.silu(gate_up[:, :INTER]) * gate_up[:, INTER:]
        out.index_add_(0, tok, torch.nn.functional.linear(act, w2[eid]).float() * weights[tok, slot].unsqueeze(-1))
    return out.to(c["x"].dtype)


def sorted_moe_call(c: dict[str, torch.Tensor], impl: str) -> torch.Tensor:
    return sorted_moe.fused_experts(c["x"], c["w13"], c["w2"], c["weights"], c["ids"], impl=impl)


# --------------------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device, cuda = args.device, args.device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"
    lines = [f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {name}, torch {torch.__version__}; "
             "median [min-max] of up to 50 timed calls after two warm-ups.", ""]

    lines += ["| decode (fp16, 4 Q / 1 KV heads, d 256) | gather + 2 matmuls (baseline) | V2 overlay | V2 / gather "
              "| max err gather / V2 vs fp32 |", "|---|---|---|---|---|"]
    decode_lens = [[2048], [4096, 4096]] if args.quick else [[32768], [100_000], [230_000], [32768] * 2,
                                                                [100_000] * 2, [230_000] * 2]
    for lens in decode_lens:
        c = decode_case(lens, device)
        ref = gather_decode(c, torch.float32)
        err_g = float((gather_decode(c).float() - ref.float()).abs().max())
        err_v = float((v2_decode(c).float() - ref.float()).abs().max())
        g = timed(partial(gather_decode, c), cuda)
        v = timed(partial(v2_decode, c), cuda)
        label = f"{len(lens)} x {lens[0]:,} tokens"
        lines.append(f"| {label} | {g[0]:.3f} ms [{g[1]:.3f}-{g[2]:.3f}] | {v[0]:.3f} ms [{v[1]:.3f}-{v[2]:.3f}] "
                     f"| {v[0] / g[0]:.2f}x | {err_g:.1e} / {err_v:.1e} |")
        del c, ref
        if cuda:
            torch.cuda.empty_cache()
        print(lines[-1], flush=True)

    grouped = sorted_moe.grouped_mm_supported(device, torch.float16)
    lines += ["", "| prefill MoE layer (fp16, hidden 2048, I 128, 256 experts, top-8) | baseline loop "
              f"| sorted_moe loop | sorted_moe grouped{'' if grouped else ' (unsupported here)'} "
              "| loop speed-up | max err loop / sorted vs fp32 |", "|---|---|---|---|---|---|"]
    for tokens in ([64, 256] if args.quick else [512, 2048, 8192]):
        m = moe_case(tokens, device)
        ref = baseline_moe_loop(m, torch.float32)
        err_b = float((baseline_moe_loop(m).float() - ref.float()).abs().max())
        err_s = float((sorted_moe_call(m, "loop").float() - ref.float()).abs().max())
        b = timed(partial(baseline_moe_loop, m), cuda)
        s = timed(partial(sorted_moe_call, m, "loop"), cuda)
        gr = timed(partial(sorted_moe_call, m, "grouped"), cuda) if grouped else None
        gcell = f"{gr[0]:.2f} ms [{gr[1]:.2f}-{gr[2]:.2f}]" if gr else "-"
        lines.append(f"| {tokens} tokens | {b[0]:.2f} ms [{b[1]:.2f}-{b[2]:.2f}] "
                     f"| {s[0]:.2f} ms [{s[1]:.2f}-{s[2]:.2f}] | {gcell} | {b[0] / s[0]:.1f}x "
                     f"| {err_b:.1e} / {err_s:.1e} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
