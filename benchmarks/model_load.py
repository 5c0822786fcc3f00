"""Start-up time, memory and prompt-logprob spread of the cpu target's server (numbers for bench/RESULTS.md).

Usage: .venv/bin/python benchmarks/model_load.py [--manifest FILE] [--repeat N] [--set K=V ...] [--base]

Each repeat builds (cache hits) or reuses the target's image, starts ONE server, waits for ``/health``
(seconds from container start), reads the container's memory (docker stats: usage - inactive file) after a
few seconds idle, sends a few prompts with ``prompt_logprobs`` (top 20), and removes the server. Prints one
JSON object: per run, and the spread of the prompt logprobs (top-1 minus top-20 per position; the range of
the logprobs of the prompt's own tokens). With ``--load-format dummy`` every logprob is about -ln(vocab).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.serve.container import ContainerRuntime

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the weather like in Paris today?",
    '{"name": "get_weather", "arguments": {"location": "Paris"}}',
]


def memory_bytes(stats: dict[str, Any]) -> int:
    mem = stats.get("memory_stats", {})
    inner = mem.get("stats", {})
    cache = inner.get("total_inactive_file", inner.get("inactive_file", inner.get("cache", 0)))
    return int(mem.get("usage", 0)) - int(cache)


def logprob_spread(url: str, model: str) -> dict[str, float]:
    gaps: list[float] = []
    own: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for prompt in PROMPTS:
            ids = http.post("/tokenize", json={"model": model, "prompt": prompt}).json()["tokens"]
            r = http.post("/v1/completions", json={"model": model, "prompt": ids, "max_tokens": 1,
                                                    "temperature": 0, "prompt_logprobs": 20})
            r.raise_for_status()
            positions = r.json()["choices"][0]["prompt_logprobs"]
            for token, pos in zip(ids[1:], positions[1:], strict=True):
                values = [float(v["logprob"]) for v in pos.values()]
                gaps.append(max(values) - min(values))
                own.append(float(pos[str(token)]["logprob"]))
    return {"top1_minus_top20_median": statistics.median(gaps), "top1_minus_top20_max": max(gaps),
            "positions": len(gaps), "prompt_token_logprob_min": min(own) if own else float("nan"),
            "prompt_token_logprob_max": max(own) if own else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--manifest", type=Path, default=REPO / "build.yaml")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--base", action="store_true", help="serve the base image (nothing patched)")
    args = ap.parse_args()
    resolved = resolve(load_manifest(args.manifest), "cpu", None, environ=os.environ, sets=args.sets)
    model = str(resolved.serving_args().get("served-model-name", "tiny-qwen3-moe"))
    runs: list[dict[str, Any]] = []
    runtime = ContainerRuntime()
    prepared = runtime.prepare(resolved, environ=os.environ, base=args.base, log=lambda _line: None)  # built once
    for _ in range(args.repeat):
        with runtime.serving(resolved, prepared, environ=os.environ, log=lambda _line: None) as server:
            row: dict[str, Any] = {"time_to_health_s": round(float(server.startup_seconds or 0), 1)}
            time.sleep(3)
            row["memory_mib"] = round(memory_bytes(server.container.stats(stream=False)) / 2**20)
            row.update({k: round(v, 4) if isinstance(v, float) else v
                        for k, v in logprob_spread(server.url, model).items()})
        runs.append(row)
    print(json.dumps({"manifest": str(args.manifest), "sets": args.sets, "base": args.base,
                      "load": os.getloadavg(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
