"""Does imageforge's bench client measure what `vllm bench serve` measures? (issue 14 section 4; bench/RESULTS.md)

Usage: .venv/bin/python benchmarks/client_agreement.py [--rounds 5] [--prompt-tokens 1500] [--output-tokens 64]
       [--requests 48] [--concurrency 8] [--server-cpu 0] [--client-cpu 1] [--profile conservative] [--out FILE]

One cpu-target server (prefix caching off: vLLM's random dataset has only 444 distinct prompt starts on the tiny
model's vocabulary, so its prompts would hit the cache across rounds), started here through the docker SDK from
imageforge's own container spec plus ``cpuset_cpus`` (the manifest has no cpuset field), pinned to
``--server-cpu``.  The clients run on ``--client-cpu`` and alternate, the order rotating every round:

* vLLM's own: ``docker run --network host --cpuset-cpus C --entrypoint python3 IMAGE -c WRAPPER vllm bench serve
  --dataset-name random ...`` (the image's vLLM, the model mounted for its tokenizer); the wrapper prints the
  client's CPU seconds (``getrusage(RUSAGE_CHILDREN)``: the whole process, its ~10 s of imports included);
* imageforge's: ``taskset -c C python benchmarks/client_agreement.py imageforge ...`` (``run_bench`` with the same
  workload: token-ID prompts of exactly ``--prompt-tokens``, no shared prefix, ``ignore_eos``), printing its CPU
  seconds during the measured window (``time.process_time``) and for the whole process.  Its prompts are
  vLLM's random dataset's (consecutive token IDs from a seeded offset, decoded and tokenized again: the same
  load), and a third client,
  ``imageforge_words``, runs the bench's own seeded-word prompts: on a random-weight MoE the prompt content moves
  the server's speed (expert routing), which is the workload, not the client.

Every round has its own seed (both clients' prompts differ from every earlier round's: no prefix-cache hits
across runs).  Per round, the paired ratios imageforge / vLLM of output throughput (output tokens / the
benchmark's wall time) and median TTFT (first streamed chunk with choices, as vLLM times it) are computed;
the gate is ``|median ratio - 1| <= 5 %`` for both.  Prints one JSON object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = "/models/tiny-qwen3-moe"
WRAPPER = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
           "u = resource.getrusage(resource.RUSAGE_CHILDREN); print('CLIENT_CPU_S', u.ru_utime + u.ru_stime); "
           "sys.exit(rc)")
GATE = 0.05


def imageforge_client(args: argparse.Namespace) -> int:
    """The imageforge side of one round (runs pinned, in its own process): one JSON line on stdout."""
    from imageforge.bench import Workload, run_bench

    w = Workload(requests=args.requests, concurrency=args.concurrency, prompt_tokens=args.prompt_tokens,
                 output_tokens=args.output_tokens, shared_prefix=0.0, seed=args.seed, warmup=1, timeout=600.0,
                 duration=3600.0)
    if args.prompts == "vllm-random":
        _vllm_random_prompts(args.vocab, args.seed)
    cpu0, t0 = time.process_time(), time.monotonic()
    bench = run_bench(args.url, w, write=False, echo=lambda _line: None)
    cpu1, t1 = time.process_time(), time.monotonic()
    s = bench.summary()
    print(json.dumps({"output_throughput": s["output_tps"], "median_ttft_ms": (s["ttft_p50_s"] or 0) * 1000,
                      "duration_s": s["wall_s"], "completed": s["ok"], "errors": s["errors"],
                      "output_tokens": s["completion_tokens"], "input_tokens": s["prompt_tokens"],
                      "client_cpu_run_s": round(cpu1 - cpu0, 3), "run_wall_s": round(t1 - t0, 3),
                      "client_cpu_process_s": round(sum(os.times()[:2]), 3)}))
    return 0


def _vllm_random_prompts(vocab: int, seed: int) -> None:
    """Make imageforge's client send what ``vllm bench serve --dataset-name random`` sends: per request, the
    token IDs ``(offset + index + arange(n)) % vocab`` (a seeded random offset), decoded to text and tokenized
    again by the server (vLLM sends the text; BPE merges change the IDs), cut to ``n``.  The request loop,
    timing and accounting stay imageforge's own: only the prompt content changes."""
    import random

    from imageforge.bench.client import BenchClient
    from imageforge.bench.workload import Prompt

    async def prompts(self: BenchClient, model: str, indexes: Any, *, shared: bool = True) -> tuple[list[Prompt], str]:
        n = self.workload.prompt_tokens
        rng = random.Random(f"agreement:{seed}")
        out = []
        for i in indexes:
            offset = rng.randrange(vocab)
            ids = [(offset + i + k) % vocab for k in range(n)]
            text = await self.detokenize(model, ids)
            again = await self.tokenize(model, text or "")
            if text is None or again is None:
                raise SystemExit("the server has no /tokenize or /detokenize")
            while len(again) < n:  # merges made it shorter: extend with the next IDs of the sequence
                again += [(offset + i + n + k) % vocab for k in range(n - len(again))]
            out.append(Prompt(i, again[:n], n))
        return out, "token-ids"

    BenchClient.prompts = prompts  # type: ignore[method-assign]


def run_vllm(image: str, url: str, args: argparse.Namespace, seed: int, model: str, models_host: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as out:
        cmd = ["docker", "run", "--rm", "--network", "host", f"--cpuset-cpus={args.client_cpu}",
               "-v", f"{models_host}:{MODEL_DIR}:ro", "-v", f"{out}:/out", "--entrypoint", "python3", image,
               "-c", WRAPPER, "vllm", "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", model, "--tokenizer", MODEL_DIR,
               "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
               "--random-output-len", str(args.output_tokens), "--random-range-ratio", "0",
               "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
               "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
               "--save-result", "--result-dir", "/out", "--result-filename", "r.json"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
        data = json.loads((Path(out) / "r.json").read_text())
    cpu = next((float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("CLIENT_CPU_S")),
               None)
    return {"output_throughput": data["output_throughput"], "median_ttft_ms": data["median_ttft_ms"],
            "duration_s": data["duration"], "completed": data["completed"],
            "errors": args.requests - int(data["completed"]), "output_tokens": data["total_output_tokens"],
            "input_tokens": data["total_input_tokens"], "client_cpu_process_s": cpu, "process_wall_s": round(wall, 1)}


def run_imageforge(url: str, args: argparse.Namespace, seed: int, prompts: str) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.client_cpu), sys.executable, str(Path(__file__).resolve()), "imageforge",
           "--url", url, "--seed", str(seed), "--requests", str(args.requests), "--concurrency",
           str(args.concurrency), "--prompt-tokens", str(args.prompt_tokens), "--output-tokens",
           str(args.output_tokens), "--prompts", prompts, "--vocab", str(args.vocab)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"imageforge client failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    data["client_cpu_process_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)
    return data


def start_server(profile: str, server_cpu: str) -> tuple[Any, str, str, str]:
    """Build (cache hits) the cpu target's profile and start it pinned; (container, url, image id, model dir)."""
    import httpx

    from imageforge.build import build, new_run_id
    from imageforge.docker_engine import client
    from imageforge.manifest import load_manifest
    from imageforge.resolve import resolve
    from imageforge.run import HOST, container_spec, free_port

    # prefix caching off: vllm's random dataset has only `vocab` distinct prompt starts (444 here), so its prompts
    # hit the cache across rounds; without the cache every run computes every prompt token
    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", profile, environ=os.environ,
                       sets=["enable-prefix-caching=false"])
    image = build(resolved, environ=os.environ, echo=lambda _line: None).image_id
    port = free_port(HOST)
    spec = container_spec(resolved, image, host_port=port, run_id=new_run_id(), environ=os.environ)
    spec.pop("detach")
    name = spec.pop("image")
    spec["cpuset_cpus"] = server_cpu
    spec["labels"] = {**spec["labels"], "imageforge.benchmark": "client_agreement"}
    models_host = next(src for src, bind in spec["volumes"].items() if bind["bind"] == MODEL_DIR)
    container = client().containers.create(name, **spec)
    container.start()
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return container, url, image, models_host
        except httpx.HTTPError:
            pass
        container.reload()
        if container.status not in ("created", "running"):
            break
        time.sleep(1)
    logs = container.logs(tail=40).decode("utf-8", "replace")
    container.remove(force=True)
    raise SystemExit(f"the server did not become healthy:\n{logs}")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="compare", choices=("compare", "imageforge"))
    parser.add_argument("--url", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--out", default="")
    parser.add_argument("--no-words", dest="words", action="store_false",
                        help="leave out the third client (imageforge with the bench's word prompts)")
    parser.add_argument("--prompts", default="vllm-random", choices=("vllm-random", "words"),
                        help="imageforge mode: vllm's random dataset's token IDs, or the bench's own seeded words")
    parser.add_argument("--vocab", type=int, default=444, help="token IDs are drawn from 0..vocab-1 (the tiny "
                        "model's base vocabulary: 444, its 9 added special tokens above)")
    args = parser.parse_args()
    if args.mode == "imageforge":
        return imageforge_client(args)

    import signal

    import httpx

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # the finally below removes the server

    signal.signal(signal.SIGTERM, stop)
    container, url, image, models_host = start_server(args.profile, args.server_cpu)
    rounds: list[dict[str, Any]] = []
    try:
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        for r in range(args.rounds):
            seed = 1000 + r
            clients = ("vllm", "imageforge", "imageforge_words") if args.words else ("vllm", "imageforge")
            k = r % len(clients)
            order = clients[k:] + clients[:k]  # rotating: each client first, second (and last) in turn
            row: dict[str, Any] = {"round": r, "seed": seed, "order": list(order), "load_before": loadavg()}
            for who in order:
                # no run shares a seed with another: no prefix-cache hits across runs
                s = {"vllm": seed + 500, "imageforge": seed, "imageforge_words": seed + 250}[who]
                row[who] = (run_vllm(image, url, args, s, model, models_host) if who == "vllm" else
                            run_imageforge(url, args, s, "vllm-random" if who == "imageforge" else "words"))
                print(f"round {r} {who}: {json.dumps(row[who])}", file=sys.stderr)
            row["load_after"] = loadavg()
            v, i = row["vllm"], row["imageforge"]
            row["ratio_output_throughput"] = i["output_throughput"] / v["output_throughput"]
            row["ratio_median_ttft"] = i["median_ttft_ms"] / v["median_ttft_ms"]
            if args.words:
                w = row["imageforge_words"]
                row["words_ratio_output_throughput"] = w["output_throughput"] / v["output_throughput"]
                row["words_ratio_median_ttft"] = w["median_ttft_ms"] / v["median_ttft_ms"]
            rounds.append(row)
    finally:
        container.remove(force=True)

    def summary(key: str) -> dict[str, float]:
        values = [row[key] for row in rounds]
        return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4)}

    result = {"started": started, "image": image, "cpus": os.cpu_count(), "server_cpu": args.server_cpu,
              "client_cpu": args.client_cpu, "workload": {k: getattr(args, k) for k in (
                  "prompt_tokens", "output_tokens", "requests", "concurrency", "rounds")},
              "ratio_output_throughput": summary("ratio_output_throughput"),
              "ratio_median_ttft": summary("ratio_median_ttft"), "rounds": rounds}
    if args.words:
        result["words_ratio_output_throughput"] = summary("words_ratio_output_throughput")
        result["words_ratio_median_ttft"] = summary("words_ratio_median_ttft")
    result["agree"] = all(abs(result[k]["median"] - 1) <= GATE for k in ("ratio_output_throughput",
                                                                          "ratio_median_ttft"))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
