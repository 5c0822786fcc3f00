"""GPU benchmark of the overlay modules: correctness against references, then CUDA-event timings.

    python3 benchmarks/overlays_gpu.py [--out FILE] [--quick] [--device cuda|cpu]

One script for one device call (see bench/RESULTS.md for how it was run). For every case it first checks
each variant against a reference computed in fp32 (MoE: the per-expert loop on fp32 copies of the inputs;
attention: dense fp32 softmax attention over the V2-layout conversion of the cache) and records the max
abs error, then times it: two warm-ups, then ``reps`` calls each between two CUDA events (median reported;
host syncs inside a variant, like the naive MoE's ``nonzero``, count, as they do in serving). Peak: the
growth of ``torch.cuda.max_memory_allocated`` over what was allocated before the call.

bf16 throughout; MoE at hidden 2048, 256 experts, top-8, intermediate 512 and 128, 8 to 16384 tokens;
decode and prefix attention with 16 query / 2 KV heads, head_dim 256, block size 16. ``--device cpu
--quick`` is a dry run of the script itself on small sizes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import overlays_naive as naive
import paged_attention_layout as layout
import paged_attention_v2 as pa
import prefix_attention as pf
import sorted_moe
import torch
from overlays_common import Table, make_decode_case, make_moe_case, make_prefix_case, max_err

Fn = Callable[[], object]


class Timer:
    def __init__(self, device: str) -> None:
        self.device = device
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn: Fn, budget_ms: float = 300.0, max_reps: int = 50) -> float:
        fn()
        fn()
        self.sync()
        samples: list[float] = []
        spent = 0.0
        while len(samples) < 3 or (spent < budget_ms and len(samples) < max_reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # Event.__init__ is unannotated in torch
                start.record()
                fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            samples.append(ms)
            spent += ms
        return statistics.median(samples)

    def peak_mib(self, fn: Fn) -> float:
        if not self.cuda:
            return float("nan")
        self.sync()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        self.sync()
        peak = torch.cuda.max_memory_allocated()
        del result
        return (peak - before) / 2**20


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy, read + write counted (the roofline for reads)."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = Timer(device).time_ms(partial(dst.copy_, src), budget_ms=100)
    del src, dst
    return 2 * n / (ms / 1e3)


class Report(list[str]):
    """Lines of the report; ``flush`` prints what is new and rewrites ``path`` (so a crash keeps results)."""

    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path
        self.printed = 0

    def flush(self) -> None:
        for line in self[self.printed:]:
            print(line, flush=True)
        self.printed = len(self)
        if self.path:
            self.path.write_text("\n".join(self) + "\n")


def run(device: str, quick: bool, out: Report) -> None:
    timer = Timer(device)
    bf16 = torch.bfloat16
    bw = copy_bandwidth(device)
    grouped_ok = sorted_moe.grouped_mm_supported(device, bf16)
    out.flush()
    out.append(f"device copy bandwidth (read+write): {bw / 1e12:.2f} TB/s; torch._grouped_mm usable for bf16 "
               f"on {device}: {grouped_ok}")

    # ---------------------------------------------------------------- MoE
    moe = Table(["I", "tokens", "variant", "ms", "speed-up vs naive", "peak extra MiB", "max abs err",
                 "rel err"])
    token_counts = [8, 512] if quick else [8, 64, 512, 2048, 16384]
    inters = [128] if quick else [512, 128]
    for inter in inters:
        for tokens in token_counts:
            c = make_moe_case(tokens, inter, bf16, device, hidden=256 if quick else 2048)
            ref = naive.naive_fused_experts(c.x.float(), c.w1.float(), c.w2.float(), c.weights, c.ids)
            scale = float(ref.abs().max())
            variants: list[tuple[str, Fn]] = [
                ("naive per-expert gather loop",
                 partial(naive.naive_fused_experts, c.x, c.w1, c.w2, c.weights, c.ids)),
                ("sorted loop",
                 partial(sorted_moe.fused_experts, c.x, c.w1, c.w2, c.weights, c.ids, impl="loop")),
            ]
            if grouped_ok:
                variants.append(("grouped (torch._grouped_mm)", partial(
                    sorted_moe.fused_experts, c.x, c.w1, c.w2, c.weights, c.ids, impl="grouped")))
            base = None
            for name, fn in variants:
                res = fn()
                assert isinstance(res, torch.Tensor)
                err = max_err(res, ref)
                ms = timer.time_ms(fn)
                base = ms if base is None else base
                moe.add(inter, tokens, name, f"{ms:.3f}", f"{base / ms:.1f}x", f"{timer.peak_mib(fn):.0f}",
                        f"{err:.1e}", f"{err / scale:.1e}")
            # Lower bound: read each active expert's weights once at the copy bandwidth's read rate.
            active = int(torch.unique(c.ids).numel())
            weight_bytes = active * (c.w1[0].numel() + c.w2[0].numel()) * c.w1.element_size()
            bound_ms = weight_bytes / (bw / 2) * 1e3
            moe.add(inter, tokens, f"bound: read {active} experts' weights once", f"{bound_ms:.3f}", "", "", "", "")
            del c, ref, variants
            if timer.cuda:
                torch.cuda.empty_cache()
    out += ["", "### MoE (bf16, hidden 2048, 256 experts, top-8)", "", moe.markdown()]
    out.flush()

    # ------------------------------------------------- expert_map / fp16 / fp32 correctness on the device
    checks = Table(["check", "variant", "max abs err", "ok"])
    for dtype, tol in ((torch.float32, 1e-3), (torch.float16, 1e-2), (bf16, 5e-2)):
        c = make_moe_case(64, 128, dtype, device, hidden=256)
        emap = torch.full((256,), -1, dtype=torch.int32, device=device)
        emap[::2] = torch.arange(128, dtype=torch.int32, device=device)
        w1l, w2l = c.w1[::2].contiguous(), c.w2[::2].contiguous()
        ids_local = emap[c.ids.long()]
        keep = (ids_local >= 0).float()
        ref = naive.naive_fused_experts(c.x.float(), w1l.float(), w2l.float(), c.weights * keep,
                                        ids_local.clamp(min=0))
        impls = ["loop", "grouped"] if sorted_moe.grouped_mm_supported(device, dtype) else ["loop"]
        for impl in impls:
            got = sorted_moe.fused_experts(c.x, w1l, w2l, c.weights, c.ids, global_num_experts=256,
                                           expert_map=emap, impl=impl)
            err = max_err(got, ref)
            checks.add(f"MoE expert_map {dtype}", impl, f"{err:.1e}", err < tol)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 2e-3), (bf16, 1.6e-2)):
        d = make_decode_case([1, 511, 513, 5000, 20000], dtype, device, seed=3)
        args = (d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.scale)
        ref = naive.dense_decode_reference(*args)
        err = max_err(pa.paged_attention_v2_forward(*args), ref)
        checks.add(f"decode V2 lens 1..20000 {dtype}", "vectorised", f"{err:.1e}", err < tol)
        p = make_prefix_case([0, 37, 3000], [9, 300, 64], dtype, device, seed=4)
        pargs = (p.query, p.key, p.value, p.key_cache, p.value_cache, p.block_tables, p.query_start_loc,
                 p.context_lens)
        err = max_err(pf.context_attention(*pargs, tile_size=64), naive.dense_prefix_reference(*pargs))
        checks.add(f"prefix ctx 0/37/3000 {dtype}", "gather once", f"{err:.1e}", err < tol)
    out += ["", "### Correctness on the device", "", checks.markdown()]
    out.flush()

    # ---------------------------------------------------------------- decode
    dec = Table(["seqs", "variant", "ms", "speed-up vs naive", "peak extra MiB", "max abs err"])
    decode_cases = [[2048], [8192]] if quick else [[8192], [32768], [100_000], [16384] * 8,
                                                  [4096] * 32, [600, 3000, 20000, 9000]]
    for lens in decode_cases:
        d = make_decode_case(lens, bf16, device)
        args = (d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.scale)
        ref = naive.dense_decode_reference(*args)
        label = f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else str(lens)
        base = None
        decode_variants: list[tuple[str, Fn]] = [
            ("naive per-partition loop", partial(naive.naive_paged_attention_v2, *args)),
            ("vectorised, ragged (1 host sync)", partial(pa.paged_attention_v2_forward, *args, ragged=True)),
            ("vectorised, padded (no sync)", partial(pa.paged_attention_v2_forward, *args,
                                                     max_seq_len=d.max_seq_len)),
            ("dense fp32 reference (no partitions)", partial(naive.dense_decode_reference, *args)),
        ]
        for name, fn in decode_variants:
            res = fn()
            assert isinstance(res, torch.Tensor)
            err = max_err(res, ref)
            ms = timer.time_ms(fn)
            base = ms if base is None else base
            dec.add(label, name, f"{ms:.3f}", f"{base / ms:.1f}x", f"{timer.peak_mib(fn):.0f}", f"{err:.1e}")
        del d, args, ref
    out += ["", "### Decode attention V2 (bf16, 16/2 heads, d=256, block 16)", "", dec.markdown()]
    out.flush()

    # ---------------------------------------------------------------- layout conversion
    lay = Table(["cache blocks", "batch", "variant", "ms", "speed-up", "max abs err"])
    d = make_decode_case([8192] if quick else [32768], bf16, device)
    spare = 4096 if quick else 63488  # whole cache: 64K blocks = 1M tokens per layer
    kc = torch.cat([d.key_cache, d.key_cache[:1].expand(spare, -1, -1, -1, -1)])
    vc = torch.cat([d.value_cache, d.value_cache[:1].expand(spare, -1, -1, -1)])
    part = layout.gather_v2_cache_for_batch(kc, vc, d.block_tables, d.seq_lens, 16)
    cols = d.block_tables.shape[1]
    err = max_err(part[0][part[2][0, :cols].long()], layout.v1_to_v2_key_cache(kc)[d.block_tables[0].long()])
    base = None

    def whole_cache(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return layout.v1_to_v2_key_cache(k), layout.v1_to_v2_value_cache(v)

    layout_variants: list[tuple[str, Fn]] = [
        ("whole cache (notes' patch)", partial(whole_cache, kc, vc)),
        ("batch blocks only", partial(layout.gather_v2_cache_for_batch, kc, vc, d.block_tables, d.seq_lens, 16)),
    ]
    for name, fn in layout_variants:
        ms = timer.time_ms(fn)
        base = ms if base is None else base
        lay.add(kc.shape[0], f"1x{int(d.seq_lens[0])}", name, f"{ms:.3f}", f"{base / ms:.1f}x", f"{err:.1e}")
    del kc, vc, part, d
    out += ["", "### V1 -> V2 cache conversion per decode step (bf16, one layer)", "", lay.markdown()]
    out.flush()

    # ---------------------------------------------------------------- prefix
    pre = Table(["ctx", "new", "tile", "variant", "ms", "speed-up vs naive", "peak extra MiB", "max abs err"])
    prefix_cases = [(1024, 256)] if quick else [(4096, 1024), (16384, 2048), (32768, 512), (100_000, 512)]
    for ctx, new in prefix_cases:
        p = make_prefix_case([ctx], [new], bf16, device)
        pargs = (p.query, p.key, p.value, p.key_cache, p.value_cache, p.block_tables, p.query_start_loc,
                 p.context_lens)
        ref = naive.dense_prefix_reference(*pargs)
        tile = 128
        base = None
        prefix_variants: list[tuple[str, int, Fn]] = [
            ("naive per-tile gather", tile, partial(naive.naive_context_attention, *pargs, tile_size=tile)),
            ("gather once", tile, partial(pf.context_attention, *pargs, tile_size=tile)),
            ("gather once, auto tile", 0, partial(pf.context_attention, *pargs)),
        ]
        for name, t, fn in prefix_variants:
            res = fn()
            assert isinstance(res, torch.Tensor)
            err = max_err(res, ref)
            ms = timer.time_ms(fn)
            base = ms if base is None else base
            pre.add(ctx, new, t or "auto", name, f"{ms:.3f}", f"{base / ms:.1f}x", f"{timer.peak_mib(fn):.0f}",
                    f"{err:.1e}")
        del p, pargs, ref
        if timer.cuda:
            torch.cuda.empty_cache()
    out += ["", "### Prefix-context attention (bf16, 16/2 heads, d=256)", "", pre.markdown()]
    out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor()
    header = (f"Overlay GPU benchmark, {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
              f"{name}, torch {torch.__version__} (CUDA {torch.version.cuda}), python {platform.python_version()}")
    report = Report(args.out)
    report += [header, ""]
    run(args.device, args.quick, report)


if __name__ == "__main__":
    main()
