"""CPU benchmark: each overlay module against its naive twin; prints a markdown table.

    .venv/bin/python benchmarks/overlays_cpu.py [--quick] [--out FILE]

Time: best (minimum) wall time of ``--reps`` calls after one warm-up, one torch thread by default: other
jobs share this machine's two cores, and two spinning OpenMP threads under such load gave timings that
varied 100-fold; one thread keeps minimum and median within ~10%. Peak: the growth of the process's peak
resident set during one call (Linux: reset with ``/proc/self/clear_refs``, read ``VmHWM``), i.e. the
extra memory the call needed on top of its inputs. Every variant's output is checked against a dense
reference first (max abs error in the table). CPU ratios say little about the launch-bound GPU picture:
see benchmarks/overlays_gpu.py for that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
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

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _status_kib(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def peak_extra_mib(fn: Callable[[], object]) -> float:
    """MiB by which the peak RSS grows during ``fn()`` (nan where /proc is unavailable)."""
    if not _CLEAR.exists():
        return float("nan")
    gc.collect()
    before = _status_kib("VmRSS")
    _CLEAR.write_text("5")  # reset VmHWM to the current RSS
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) / 1024


def time_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples) * 1e3


def run(quick: bool, reps: int, only: set[str]) -> str:
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    table = Table(["module", "case", "variant", "ms", "speed-up vs naive", "peak extra MiB", "max abs err"])

    def bench(module: str, case: str, variants: list[tuple[str, Callable[[], torch.Tensor]]],
              reference: torch.Tensor) -> None:
        base = None
        for name, fn in variants:
            err = max_err(fn(), reference)
            ms = time_ms(fn, reps)
            peak = peak_extra_mib(fn)
            base = ms if base is None else base
            table.add(module, case, name, f"{ms:.1f}", f"{base / ms:.2f}x", f"{peak:.0f}", f"{err:.1e}")

    # --- MoE: per-expert gather loop vs sorted loop vs grouped GEMM -----------------------------------
    moe_sizes = [(16, 128), (256, 512)] if quick else [(16, 128), (16, 512), (256, 128), (256, 512),
                                                       (2048, 128), (2048, 512)]
    if "moe" not in only:
        moe_sizes = []
    for tokens, inter in moe_sizes:
        c = make_moe_case(tokens, inter, bf16, "cpu")
        ref = naive.naive_fused_experts(c.x.float(), c.w1.float(), c.w2.float(), c.weights, c.ids)
        variants: list[tuple[str, Callable[[], torch.Tensor]]] = [
            ("naive per-expert gather loop",
             partial(naive.naive_fused_experts, c.x, c.w1, c.w2, c.weights, c.ids)),
            ("sorted loop", partial(sorted_moe.fused_experts, c.x, c.w1, c.w2, c.weights, c.ids, impl="loop")),
        ]
        if sorted_moe.grouped_mm_supported("cpu", bf16):
            variants.append(("grouped _grouped_mm", partial(
                sorted_moe.fused_experts, c.x, c.w1, c.w2, c.weights, c.ids, impl="grouped")))
        bench("sorted_moe", f"bf16 T={tokens} H=2048 E=256 k=8 I={inter}", variants, ref)
        del c, ref, variants
        gc.collect()

    # --- Decode: per-partition Python loop vs vectorised partitions -----------------------------------
    decode_sizes = [[8192], [32768]] if quick else [[8192], [32768], [100_000], [16384] * 8,
                                                   [600, 3000, 20000, 9000]]
    if "decode" not in only:
        decode_sizes = []
    for lens in decode_sizes:
        d = make_decode_case(lens, bf16, "cpu")
        args = (d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.scale)
        ref = naive.dense_decode_reference(*args)
        label = f"bf16 seqs={lens if len(set(lens)) > 1 else f'{len(lens)}x{lens[0]}'} H=16/2 d=256"
        bench("paged_attention_v2", label, [
            ("naive per-partition loop", partial(naive.naive_paged_attention_v2, *args)),
            ("vectorised, ragged", partial(pa.paged_attention_v2_forward, *args, ragged=True)),
            ("vectorised, padded", partial(pa.paged_attention_v2_forward, *args, max_seq_len=d.max_seq_len)),
        ], ref)
        del d, args, ref
        gc.collect()

    # --- Prefix: per-tile gather vs gather once -----------------------------------------------------------
    prefix_sizes = [(4096, 512)] if quick else [(4096, 512), (16384, 256), (32768, 128)]
    if "prefix" not in only:
        prefix_sizes = []
    for ctx, new in prefix_sizes:
        p = make_prefix_case([ctx], [new], bf16, "cpu")
        pargs = (p.query, p.key, p.value, p.key_cache, p.value_cache, p.block_tables, p.query_start_loc,
                 p.context_lens)
        ref = naive.dense_prefix_reference(*pargs)
        tile = 128
        bench("prefix_attention", f"bf16 ctx={ctx} new={new} tile={tile} H=16/2 d=256", [
            ("naive per-tile gather", partial(naive.naive_context_attention, *pargs, tile_size=tile)),
            ("gather once", partial(pf.context_attention, *pargs, tile_size=tile)),
        ], ref)
        del p, pargs, ref
        gc.collect()

    # --- Layout: whole-cache V1->V2 conversion vs only the batch's blocks -------------------------------
    if "layout" not in only:
        return table.markdown()
    d = make_decode_case([32768], bf16, "cpu")
    spare = 16384  # a cache 9x larger than what the batch reads (one 32K sequence = 2048 blocks)
    kc = torch.cat([d.key_cache, d.key_cache[:1].expand(spare, -1, -1, -1, -1)])
    vc = torch.cat([d.value_cache, d.value_cache[:1].expand(spare, -1, -1, -1)])
    table_ref = layout.v1_to_v2_key_cache(kc)[d.block_tables[0, :8].long()]
    part = layout.gather_v2_cache_for_batch(kc, vc, d.block_tables, d.seq_lens, 16)
    err = max_err(part[0][part[2][0, :8].long()], table_ref)
    base = None
    for name, fn in [
        ("whole cache (notes' patch)", lambda: (layout.v1_to_v2_key_cache(kc), layout.v1_to_v2_value_cache(vc))),
        ("batch blocks only", lambda: layout.gather_v2_cache_for_batch(kc, vc, d.block_tables, d.seq_lens, 16)),
    ]:
        ms = time_ms(fn, reps)
        base = ms if base is None else base
        table.add("paged_attention_layout", f"bf16 cache {kc.shape[0]} blocks, batch 1x32768",
                  name, f"{ms:.1f}", f"{base / ms:.2f}x", f"{peak_extra_mib(fn):.0f}", f"{err:.1e}")
    return table.markdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--only", default="moe,decode,prefix,layout", help="comma-separated subset")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: stable numbers when other jobs share the cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = (f"CPU overlay benchmark, {dt.date.today().isoformat()}, {platform.processor() or platform.machine()} "
              f"({os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load average {load:.1f} at "
              f"start), torch {torch.__version__}, python {platform.python_version()}, grouped_mm on CPU: "
              f"{sorted_moe.GROUPED_MM_AVAILABLE}")
    report = header + "\n\n" + run(args.quick, args.reps, set(args.only.split(",")))
    print(report)
    if args.out:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
