"""Where the time goes: torch.profiler tables (top ops by device time) for a few overlay calls.

    python3 benchmarks/overlays_profile.py [--device cuda] [--out FILE]

A diagnostic companion to benchmarks/overlays_gpu.py: one profiled call per case after two warm-ups and the top
operators by self device time; the footer's device total against the call's unprofiled time (from
overlays_gpu.py) tells whether a call is bound by the host issuing kernels.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import overlays_naive as naive
import paged_attention_v2 as pa
import prefix_attention as pf
import sorted_moe
import torch
from overlays_common import make_decode_case, make_moe_case, make_prefix_case
from torch.profiler import ProfilerActivity, profile


def profile_case(name: str, fn: Callable[[], object], device: str, rows: int = 12) -> str:
    cuda = device.startswith("cuda")
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    events = prof.key_averages()
    # The table's footer ("Self CUDA time total") is the device's busy time; summing the rows here would
    # count each kernel twice (as itself and under its aten op).
    head = f"#### {name}\n\nwall {wall:.2f} ms (profiled, so inflated), {len(events)} op kinds\n"
    try:
        table: str = events.table(sort_by=key, row_limit=rows, max_name_column_width=60)
    except (AttributeError, KeyError, ValueError):
        table = events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60)
    return head + "\n```\n" + table + "\n```\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dev = args.device
    bf16 = torch.bfloat16
    parts: list[str] = []

    for lens in ([8192], [16384] * 8):
        d = make_decode_case(lens, bf16, dev)
        a = (d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.scale)
        label = f"{len(lens)}x{lens[0]}"
        parts.append(profile_case(f"decode V2 padded {label}",
                                  partial(pa.paged_attention_v2_forward, *a, max_seq_len=d.max_seq_len), dev))
        parts.append(profile_case(f"decode dense fp32 reference {label}",
                                  partial(naive.dense_decode_reference, *a), dev))
    p = make_prefix_case([100_000], [512], bf16, dev)
    pa_args = (p.query, p.key, p.value, p.key_cache, p.value_cache, p.block_tables, p.query_start_loc,
               p.context_lens)
    parts.append(profile_case("prefix ctx 100000 new 512, tile 128",
                              lambda: pf.context_attention(*pa_args, tile_size=128), dev))
    c = make_moe_case(2048, 512, bf16, dev)
    parts.append(profile_case("MoE grouped T=2048 I=512", lambda: sorted_moe.fused_experts(
        c.x, c.w1, c.w2, c.weights, c.ids, impl="grouped"), dev))
    report = "\n".join(parts)
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
