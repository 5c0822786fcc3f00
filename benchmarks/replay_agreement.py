"""Does `bench --replay` measure what a second, independent client measures on the same server? (bench/RESULTS.md,
"Replay and A/A")

Usage: .venv/bin/python benchmarks/replay_agreement.py --url http://127.0.0.1:PORT [--requests 12] [--seed 4]
       [--rounds 7] [--warmup-rounds 1] [--out FILE]

One running OpenAI-compatible server (e.g. ``invoke run --target cpu``).  The workload is imageforge's generated
replay (``--requests`` from ``--seed``, scaled to the server's max-model-len, kept as JSONL), every body exactly
as the replay sends it (``prepare_body``).  Per round three clients replay it one request at a time, in an order
that rotates every round:

* ``imageforge``: :func:`imageforge.bench.replay.run_replay` and :func:`imageforge.bench.evaluator.evaluate`;
* ``second``: this file's own client, sharing no code with imageforge: the standard library's ``http.client``,
  the SSE lines split by hand, TTFT at the first chunk whose delta carries content, reasoning or a tool call,
  usage from the last chunk, and the formulas written out here (aggregates over the wall time from the first
  request sent to the last stream's end, per request Output TPS = completion / total and Input TPS = prompt /
  TTFT);
* ``imageforge_aa``: imageforge once more, the A/A control: how far two runs of one client move apart on this
  machine within a round, i.e. the smallest difference between the clients these rounds can resolve.

``--warmup-rounds`` rounds run first and are left out (the first fills the prefix cache: afterwards every run
sees the same cache).  Per measured round: the paired ratios second / imageforge and imageforge_aa / imageforge
of ``weighted_tps``, ``output_tps_mean``, ``input_tps_mean`` and ``ttft_p50_ms``; their median, min and max over
rounds; request by request, the TTFT differences second - imageforge and imageforge_aa - imageforge
(``paired_ttft_*``: median and how many pairs were slower); and whether every client counted the same prompt and
cached tokens (``same_prompt_and_cached_tokens``: a difference there is a counting bug, not noise; completion
tokens may differ, the server samples).  Prints one JSON object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from replay_common import add_server_options, emit, server_workload  # noqa: E402

from imageforge.bench.evaluator import evaluate  # noqa: E402
from imageforge.bench.replay import prepare_body, run_replay  # noqa: E402
from imageforge.bench.replay_workload import ReplayRequest  # noqa: E402

KEYS = ("weighted_tps", "output_tps_mean", "input_tps_mean", "ttft_p50_ms")


# --------------------------------------------------------------------------- the second client


def _send(host: str, port: int, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request over ``http.client``: its times (from before the POST), usage and finish reason."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=1000)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    ttft = None
    usage: dict[str, Any] = {}
    finish = None
    if response.status != 200:
        response.read()
        conn.close()
        return {"ok": False, "status": response.status, "total": time.monotonic() - start}
    while True:
        raw = response.readline()
        if not raw:
            break
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        event = json.loads(line[5:].strip())
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if ttft is None and (delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                                 or delta.get("tool_calls")):
                ttft = time.monotonic() - start
            finish = choice.get("finish_reason") or finish
        if event.get("usage"):
            usage = event["usage"]
    conn.close()
    details = usage.get("prompt_tokens_details") or {}
    return {"ok": True, "status": 200, "ttft": ttft, "total": time.monotonic() - start,
            "prompt": int(usage.get("prompt_tokens") or 0), "completion": int(usage.get("completion_tokens") or 0),
            "cached": int(details.get("cached_tokens") or 0), "finished": finish is not None}


def _median_of(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def second_client(url: str, bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Replay ``bodies`` one at a time and compute the four figures by this file's own formulas."""
    parts = urlsplit(url)
    first = time.monotonic()
    results = [_send(parts.hostname or "127.0.0.1", parts.port or 80, b) for b in bodies]
    wall = time.monotonic() - first
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["completion"] for r in ok)
    cached = sum(r["cached"] for r in ok)
    uncached = sum(r["prompt"] for r in ok) - cached
    weighted = (16.796 * out_tokens + 2.799 * uncached + 0.56 * cached) / wall
    output_rates = [r["completion"] / r["total"] for r in ok]
    input_rates = [r["prompt"] / r["ttft"] if r["ttft"] else 0.0 for r in ok]
    ttfts = sorted(r["ttft"] * 1000 for r in ok if r["ttft"] is not None)
    return {"weighted_tps": weighted, "output_tps_mean": statistics.fmean(output_rates) if ok else None,
            "input_tps_mean": statistics.fmean(input_rates) if ok else None, "ttft_p50_ms": _median_of(ttfts),
            "failed": float(len(results) - len(ok)), "wall_s": wall,
            "tokens": [sum(r["prompt"] for r in ok), out_tokens, cached],
            "ttfts_ms": [r["ttft"] * 1000 if r["ok"] and r["ttft"] is not None else None for r in results]}


# --------------------------------------------------------------------------- imageforge


def imageforge_client(url: str, requests: Sequence[ReplayRequest]) -> dict[str, Any]:
    run = run_replay(requests, url, time_cap=86400.0)
    m = evaluate(run.records, run.wall_s).metrics
    return {**{k: m[k] for k in KEYS}, "failed": float(m["error_requests"]), "wall_s": run.wall_s,
            "tokens": [m["total_input_tokens"], m["total_output_tokens"], m["total_cached_tokens"]],
            "ttfts_ms": [r.ttft_s * 1000 if r.ok and r.ttft_s is not None else None for r in run.records]}


# --------------------------------------------------------------------------- the rounds


def ratios(rows: Sequence[dict[str, Any]], a: str, b: str) -> dict[str, dict[str, float] | None]:
    """Per key, the median, min and max over rounds of ``b / a``."""
    out: dict[str, dict[str, float] | None] = {}
    for key in KEYS:
        values = [r[b][key] / r[a][key] for r in rows if r[a][key] and r[b][key] is not None]
        out[key] = ({"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                     "max": round(max(values), 4)} if values else None)
    return out


def paired_ttft(rows: Sequence[dict[str, Any]], a: str, b: str) -> dict[str, float | int] | None:
    """Request by request (the same body in the same round): ``b``'s TTFT minus ``a``'s in ms, their median and
    how many pairs ``b`` was the slower of (a client's own cost shows here, where a p50 of a few requests
    per run is noise)."""
    diffs = [y - x for r in rows for x, y in zip(r[a]["ttfts_ms"], r[b]["ttfts_ms"], strict=True)
             if x is not None and y is not None]
    if not diffs:
        return None
    return {"pairs": len(diffs), "median_ms": round(statistics.median(diffs), 2),
            "slower_pairs": sum(1 for d in diffs if d > 0)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_options(parser, requests=12, seed=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup-rounds", type=int, default=1)
    args = parser.parse_args(argv)
    model, requests, workload = server_workload(args.url, args.requests, args.seed)
    bodies = [prepare_body(r, model, planned_output=True) for r in requests]
    clients = {"imageforge": lambda: imageforge_client(args.url, requests),
               "second": lambda: second_client(args.url, bodies),
               "imageforge_aa": lambda: imageforge_client(args.url, requests)}
    names = list(clients)
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for r in range(args.warmup_rounds + args.rounds):
        order = names[r % 3:] + names[:r % 3]
        row: dict[str, Any] = {"round": r, "order": order, "load": [round(x, 2) for x in os.getloadavg()]}
        for name in order:
            row[name] = clients[name]()
        print(json.dumps(row), file=sys.stderr)
        if r >= args.warmup_rounds:
            rows.append(row)
    result = {"started": started, "url": args.url, "model": model, "workload": workload["stats"],
              "rounds": args.rounds, "warmup_rounds": args.warmup_rounds, "cpus": os.cpu_count(),
              "second_vs_imageforge": ratios(rows, "imageforge", "second"),
              "aa": ratios(rows, "imageforge", "imageforge_aa"),
              "paired_ttft_second_minus_imageforge": paired_ttft(rows, "imageforge", "second"),
              "paired_ttft_aa_minus_imageforge": paired_ttft(rows, "imageforge", "imageforge_aa"),
              # prompt and cached token totals: the same requests must count the same on every client (completion
              # tokens may differ: the server samples, and random weights can stop before max_tokens)
              "same_prompt_and_cached_tokens": all(
                  r["imageforge"]["tokens"][::2] == r["second"]["tokens"][::2] == r["imageforge_aa"]["tokens"][::2]
                  for r in rows),
              "per_round": rows}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
