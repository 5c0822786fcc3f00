"""A bench's report: bench.json and the table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cli.output import results_stream
from .metrics import CACHED_WEIGHT, OUTPUT_WEIGHT, PLATFORM_FACTOR, UNCACHED_INPUT_WEIGHT
from .results import BenchResult

Log = Callable[[str], None]

def write_bench(bench: BenchResult) -> Path:
    assert bench.run_dir is not None
    bench.run_dir.mkdir(parents=True, exist_ok=True)
    path = bench.run_dir / "bench.json"
    path.write_text(json.dumps(bench.to_json(), indent=2) + "\n")
    bench.json_path = path
    return path


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) * 1000:,.0f} ms"


def bench_rows(bench: BenchResult) -> list[tuple[str, str]]:
    s = bench.summary()
    cached = "-" if s["cached_tokens"] is None else f"{s['cached_tokens']} ({bench.cache_source})"
    rows = [
        ("requests", f"{s['ok']} ok, {s['errors']} failed" + (f", {s['cancelled']} cut" if s["cancelled"] else "")
         + f" of {s['requests']}  (error rate {s['error_rate']:.1%})"),
        ("tokens", f"{s['prompt_tokens']} prompt, {s['completion_tokens']} generated, cached {cached}"),
        ("wall", f"{s['wall_s']:.2f} s"),
        ("Output TPS", fmt(s["output_tps"], 2)),
        ("Input TPS", fmt(s["input_tps"], 2) + f"  (uncached {fmt(s['uncached_input_tps'], 2)})"),
        ("Cache TPS", fmt(s["cache_tps"], 2)),
        ("weighted_tps", f"{s['weighted_tps']:,.1f}  (= {OUTPUT_WEIGHT} x out + {UNCACHED_INPUT_WEIGHT} x uncached "
                         f"in + {CACHED_WEIGHT} x cached, per wall second; x {PLATFORM_FACTOR} = "
                         f"{s['platform_score']:,.0f}: the replay score's formula, not a replay)"),
        ("TTFT p50 / p95 / p99", f"{ms(s['ttft_p50_s'])} / {ms(s['ttft_p95_s'])} / {ms(s['ttft_p99_s'])}"),
        ("latency p50 / p95 / p99", f"{ms(s['latency_p50_s'])} / {ms(s['latency_p95_s'])} / "
                                    f"{ms(s['latency_p99_s'])}"),
        ("time per output token p50 / p99", f"{ms(s['tpot_p50_s'])} / {ms(s['tpot_p99_s'])}"),
        ("inter-token latency p50 / p99", f"{ms(s['itl_p50_s'])} / {ms(s['itl_p99_s'])}  (gaps between streamed "
                                          "chunks, pooled)"),
        ("per-request Output TPS p10", fmt(s["output_tps_p10"], 2) + "  (completion / latency incl. TTFT: the "
                                                                     "evaluator's definition)"),
        ("runs", f"{len(bench.repeats) or 1}" + (f" (median by weighted_tps shown; {_scores(bench)})"
                                                 if bench.repeats else "")),
        ("load (1/5/15 min)", f"{_load(bench.host.get('loadavg_before'))} -> "
                              f"{_load(bench.host.get('loadavg_after'))} on {bench.host.get('cpus', '?')} CPUs"),
    ]
    if s["short_responses"]:
        rows.append(("short responses", f"{s['short_responses']} answers with another token count than "
                                        f"{bench.workload.output_tokens}"))
    return rows


def _scores(bench: BenchResult) -> str:
    return ", ".join(f"{float(r['weighted_tps']):,.0f}" for r in bench.repeats)


def _load(value: Any) -> str:
    return "-" if not value else " ".join(f"{float(v):.2f}" for v in value)


def make_console() -> Any:
    """A rich console on the command's result stream (stdout; stderr under --json); 160 columns when that is not
    a terminal (rich would squeeze tables into 80)."""
    from rich.console import Console

    stream = results_stream()
    return Console(file=stream) if stream.isatty() else Console(file=stream, width=160)


def print_bench(bench: BenchResult, echo: Log = print, console: Any = None) -> None:
    from rich.table import Table

    title = "bench" + (f" {bench.target}:{bench.profile}" if bench.target else f" {bench.url}")
    if bench.params:
        title += " " + " ".join(f"{k}={v}" for k, v in bench.params.items())
    table = Table(title=title, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in bench_rows(bench):
        table.add_row(name, value)
    (console or make_console()).print(table)
    for note in bench.notes:
        echo(f"note: {note}")
    if bench.json_path:
        echo(f"report: {bench.json_path}")
