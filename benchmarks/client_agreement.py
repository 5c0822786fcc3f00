"""Does imageforge's bench client measure what `vllm bench serve` measures? (bench/RESULTS.md)

Usage: .venv/bin/python benchmarks/client_agreement.py [--rounds 11] [--warmup-rounds 2] [--prompt-tokens 1500]
       [--output-tokens 64] [--requests 16] [--concurrency 1] [--server-cpu 0] [--client-cpu 1]
       [--profile conservative] [--out FILE]

One cpu-target server (prefix caching off, so that a round can send the same prompts through every client),
started here through the docker SDK from imageforge's own container spec plus ``cpuset_cpus`` (the manifest has
no cpuset field), pinned to ``--server-cpu``.  Per round the harness writes one prompt file: ``--requests`` texts,
each vLLM's random dataset's recipe (consecutive token IDs from a seeded offset, ``/detokenize``d by the server).
Three clients, pinned to ``--client-cpu``, send exactly those texts to ``/v1/completions`` (``ignore_eos``,
temperature 0, streamed), in an order that rotates every round:

* ``vllm``: ``docker run --network host --cpuset-cpus C --entrypoint python3 IMAGE -c WRAPPER vllm bench serve
  --dataset-name custom --dataset-path FILE --skip-chat-template --disable-shuffle ...`` (the image's own vLLM,
  the model mounted for its tokenizer; the serving image plus pandas, which vLLM's custom dataset
  imports: built once, ``imageforge-bench/vllm-client``); the wrapper prints the client's CPU seconds
  (``getrusage``: the whole process, its ~10 s of imports included);
* ``imageforge``: ``taskset -c C python benchmarks/client_agreement.py imageforge --prompts-file FILE ...``
  (``run_bench`` with those prompts as text), printing its CPU seconds in the measured window
  (``time.process_time``) and for the whole process;
* ``imageforge_aa``: the same imageforge client once more: the A/A control.  Its paired ratio to ``imageforge``
  shows how far two runs of one client move apart on this machine within one round, i.e. the smallest
  difference between the clients that these rounds can resolve.

No client sends a warm-up request (``vllm bench serve`` sends none with its default
``--ready-check-timeout-sec 0``; imageforge's ``warmup=0`` here): ``--warmup-rounds`` whole rounds run first and
are left out instead, because a fresh server speeds up ~2x over its first minute.  Per round, two measures:

* the issue's gate: the paired ratios imageforge / vLLM of output throughput (output tokens / the run's wall
  time) and median TTFT (first streamed chunk with choices, as vLLM times it), ``|median ratio - 1| <= 5 %``
  (``paired_ratio_gate``); the A/A ratios beside them say how far two runs of one client drift on this machine;
* against the server's own clock (its ``/metrics`` histograms ``vllm:e2e_request_latency_seconds`` and
  ``vllm:time_to_first_token_seconds``, read before and after every run): what each client measured beyond what
  the server measured for the same requests.  At concurrency 1 the server's speed cancels out, so the
  difference between the clients' gaps is what the clients themselves disagree by: ``client_throughput_effect``
  (the throughput ratio the gaps alone give, minus 1) and ``client_ttft_effect``; ``agree`` is
  ``|median| <= 5 %`` for both.

Concurrency 1 (the default) is the evaluator's load and times prefill alone; at concurrency 8 the median TTFT
sits between the plateaus of requests that arrive together and wait for each other's prefill, and flips between
them run to run (bench/RESULTS.md).  Prints one JSON object (and writes it to ``--out``); exits 1 unless
``agree``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
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
                 output_tokens=args.output_tokens, shared_prefix=0.0, seed=args.seed, warmup=0, timeout=600.0,
                 duration=3600.0)
    _file_prompts([json.loads(line)["prompt"] for line in Path(args.prompts_file).read_text().splitlines()])
    cpu0, t0 = time.process_time(), time.monotonic()
    bench = run_bench(args.url, w, write=False, echo=lambda _line: None)
    cpu1, t1 = time.process_time(), time.monotonic()
    s = bench.summary()
    ttfts = [r.ttft for r in bench.results if r.ok and r.ttft is not None]
    print(json.dumps({"output_throughput": s["output_tps"], "median_ttft_ms": (s["ttft_p50_s"] or 0) * 1000,
                      "mean_ttft_ms": 1000 * sum(ttfts) / max(1, len(ttfts)),
                      "duration_s": s["wall_s"], "completed": s["ok"], "errors": s["errors"],
                      "output_tokens": s["completion_tokens"], "input_tokens": s["prompt_tokens"],
                      "client_cpu_run_s": round(cpu1 - cpu0, 3), "run_wall_s": round(t1 - t0, 3),
                      "client_cpu_process_s": round(sum(os.times()[:2]), 3)}))
    return 0


def _file_prompts(texts: list[str]) -> None:
    """Make imageforge's client send ``texts`` (the round's prompt file) as its measured prompts, and the first
    of them as its warm-up (what vLLM's initial test run sends).  The request loop, timing and accounting stay
    imageforge's own: only the prompt source changes."""
    from imageforge.bench.client import BenchClient
    from imageforge.workload import Prompt

    async def prompts(self: BenchClient, model: str, indexes: Any, *, shared: bool = True) -> tuple[list[Prompt], str]:
        return [Prompt(i, texts[max(i, 0)], None) for i in indexes], "text"

    BenchClient.prompts = prompts  # type: ignore[method-assign]


def write_prompts(url: str, model: str, path: Path, *, requests: int, tokens: int, vocab: int, seed: int) -> None:
    """The round's prompt file: vLLM's random-dataset recipe, token IDs ``(offset + i + arange(n)) % vocab`` from a
    seeded offset, decoded by the server and re-encoded until the text is ``tokens`` tokens long, within 1 %
    (decoding and encoding again merges or splits tokens; vLLM's random dataset adjusts the same way and does not
    insist either; both clients send these very texts, so the counts are the same for both); one
    ``{"prompt": text}`` line per request (vLLM's custom dataset)."""
    import random

    import httpx

    rng = random.Random(f"agreement:{seed}")
    lines = []
    with httpx.Client(base_url=url, timeout=30) as http:

        def encode(text: str) -> list[int]:
            answer = http.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
            return [int(t) for t in answer.json()["tokens"]]

        def decode(ids: list[int]) -> str:
            return str(http.post("/detokenize", json={"model": model, "tokens": ids}).json()["prompt"])

        for i in range(requests):
            offset = rng.randrange(vocab)
            ids = [(offset + i + k) % vocab for k in range(tokens)]
            for _ in range(20):
                text = decode(ids)
                again = encode(text)
                if abs(len(again) - tokens) <= tokens * 0.01:
                    break
                more = [(offset + i + tokens + k) % vocab for k in range(max(0, tokens - len(again)))]
                ids = (again + more)[:tokens]
            else:
                raise SystemExit(f"no text of {tokens} tokens (within 1 %) for prompt {i} (seed {seed})")
            lines.append(json.dumps({"prompt": text}))
    path.write_text("\n".join(lines) + "\n")


SERVER_SERIES = ("vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")


def server_snapshot(url: str) -> dict[str, float]:
    """The server's own request timing so far (its /metrics histograms: e2e latency and TTFT, sums and counts)."""
    import httpx

    from imageforge.bench.metrics import metrics_counters

    counters = metrics_counters(httpx.get(url + "/metrics", timeout=10).text)
    return {name: counters.get(name, 0.0) for name in SERVER_SERIES}


def against_server(url: str, before: dict[str, float], run: dict[str, Any], requests: int) -> None:
    """Add what the client measured beyond what the server measured for the same requests (at concurrency 1 the
    server's speed cancels out): ``gap_ms_per_request`` = (client wall - the server's summed e2e latency) / n,
    ``ttft_gap_ms`` = client mean TTFT - the server's mean TTFT.  Waits (<= 5 s) for the counts to catch up."""
    from imageforge.serve.waits import wait_until

    count = "vllm:e2e_request_latency_seconds_count"

    def caught_up() -> dict[str, float] | None:
        snapshot = server_snapshot(url)
        return snapshot if snapshot[count] - before[count] >= requests else None

    after = wait_until(caught_up, timeout=5, interval=0.2) or server_snapshot(url)
    n = after[count] - before[count]
    e2e = after["vllm:e2e_request_latency_seconds_sum"] - before["vllm:e2e_request_latency_seconds_sum"]
    ttft_n = after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"]
    ttft = after["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"]
    run["server_requests"] = int(n)
    run["server_e2e_s"] = round(e2e, 4)
    run["gap_ms_per_request"] = round((run["duration_s"] - e2e) * 1000 / max(1, n), 2)
    run["ttft_gap_ms"] = round(run["mean_ttft_ms"] - 1000 * ttft / max(1, ttft_n), 2)


def vllm_client_image(image: str) -> str:
    """The serving image plus pandas, which ``vllm bench serve --dataset-name custom`` imports and the serving image
    does not carry; built once per serving image (docker SDK, its layer cache), used only by this benchmark.  The
    wheels are fetched on the host (its pip trusts this machine's certificates; the image's does not), as the
    cpu base recipe does with its wheelhouse."""
    from imageforge.docker_engine import client

    cli = client()
    layers = json.dumps(cli.images.get(image).attrs["RootFS"]["Layers"])  # a rebuilt config, same files: same tag
    tag = f"imageforge-bench/vllm-client:{hashlib.sha256(layers.encode()).hexdigest()[:12]}"
    if cli.images.list(name=tag):
        return tag
    wheels = ["pandas>=2.2,<3", "python-dateutil", "pytz", "tzdata", "six"]  # numpy is in the image already
    with tempfile.TemporaryDirectory(prefix="vllm-client-") as ctx:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", f"{ctx}/wheels", *wheels], check=True)
        Path(ctx, "Dockerfile").write_text(
            f"FROM {image}\nCOPY wheels /tmp/wheels\n"
            "RUN /opt/venv/bin/python -m pip install --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl "
            "&& rm -rf /tmp/wheels\n")
        cli.images.build(path=ctx, tag=tag, rm=True, labels={"imageforge.benchmark": "client_agreement"})
    return tag


def run_vllm(image: str, url: str, args: argparse.Namespace, prompts: Path, model: str,
             models_host: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as out:
        cmd = ["docker", "run", "--rm", "--network", "host", f"--cpuset-cpus={args.client_cpu}",
               "-v", f"{models_host}:{MODEL_DIR}:ro", "-v", f"{out}:/out", "-v", f"{prompts}:/in/prompts.jsonl:ro",
               "--entrypoint", "python3", image,
               "-c", WRAPPER, "vllm", "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", model, "--tokenizer", MODEL_DIR,
               "--dataset-name", "custom", "--dataset-path", "/in/prompts.jsonl", "--skip-chat-template",
               "--disable-shuffle", "--custom-output-len", str(args.output_tokens),
               "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
               "--ignore-eos", "--temperature", "0", "--disable-tqdm",
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
            "mean_ttft_ms": data["mean_ttft_ms"], "duration_s": data["duration"], "completed": data["completed"],
            "errors": args.requests - int(data["completed"]), "output_tokens": data["total_output_tokens"],
            "input_tokens": data["total_input_tokens"], "client_cpu_process_s": cpu, "process_wall_s": round(wall, 1)}


def run_imageforge(url: str, args: argparse.Namespace, prompts: Path) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.client_cpu), sys.executable, str(Path(__file__).resolve()), "imageforge",
           "--url", url, "--requests", str(args.requests), "--concurrency", str(args.concurrency),
           "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens),
           "--prompts-file", str(prompts)]
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

    from imageforge.build import build_target
    from imageforge.docker_engine import client
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve
    from imageforge.rundirs import new_run_id
    from imageforge.serve.ports import HOST, free_port
    from imageforge.serve.spec import container_spec
    from imageforge.serve.waits import probe_health, wait_until

    # prefix caching off: every client of a round sends the same prompts, and each run must compute all of them
    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", profile, environ=os.environ,
                       sets=["enable-prefix-caching=false"])
    image = build_target(resolved, environ=os.environ, echo=lambda _line: None).image_id
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

    def healthy() -> bool | None:  # True: answers; False: the container stopped; None: not yet
        if probe_health(http, url).ok:
            return True
        container.reload()
        return None if container.status in ("created", "running") else False

    with httpx.Client(timeout=5) as http:
        if wait_until(healthy, timeout=300, interval=1):
            return container, url, image, models_host
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
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup-rounds", type=int, default=2,
                        help="rounds run first and left out of the ratios: a fresh server speeds up ~2x over its "
                        "first minute (oneDNN/inductor caches for new shapes), which biases whichever client runs "
                        "first")
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--profile", default="conservative")
    parser.add_argument("--out", default="")
    parser.add_argument("--prompts-file", default="", help="imageforge mode: the round's prompt file")
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
    try:
        vllm_image = vllm_client_image(image)
    except BaseException:
        container.remove(force=True)
        raise
    rounds: list[dict[str, Any]] = []
    warmups: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="client-agreement-"))
    try:
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        clients = ("vllm", "imageforge", "imageforge_aa")
        for r in range(-args.warmup_rounds, args.rounds):
            seed = 1000 + r
            prompts = tmp / f"prompts-{seed}.jsonl"
            write_prompts(url, model, prompts, requests=args.requests, tokens=args.prompt_tokens, vocab=args.vocab,
                          seed=seed)
            k = (r + args.warmup_rounds) % len(clients)
            order = clients[k:] + clients[:k]  # rotating: each client first, second and last in turn
            row: dict[str, Any] = {"round": r, "seed": seed, "order": list(order), "load_before": loadavg()}
            for who in order:
                before = server_snapshot(url)
                row[who] = (run_vllm(vllm_image, url, args, prompts, model, models_host) if who == "vllm" else
                            run_imageforge(url, args, prompts))
                against_server(url, before, row[who], args.requests)
                print(f"round {r} {who}: {json.dumps(row[who])}", file=sys.stderr)
            row["load_after"] = loadavg()
            v, i, a = row["vllm"], row["imageforge"], row["imageforge_aa"]
            row["ratio_output_throughput"] = i["output_throughput"] / v["output_throughput"]
            row["ratio_median_ttft"] = i["median_ttft_ms"] / v["median_ttft_ms"]
            row["aa_ratio_output_throughput"] = a["output_throughput"] / i["output_throughput"]
            row["aa_ratio_median_ttft"] = a["median_ttft_ms"] / i["median_ttft_ms"]
            # what the clients themselves add, against the server's own clock: the server's speed cancels out
            row["gap_diff_ms_per_request"] = i["gap_ms_per_request"] - v["gap_ms_per_request"]
            row["client_throughput_effect"] = (v["gap_ms_per_request"] - i["gap_ms_per_request"]) * args.requests / (
                1000 * i["duration_s"])  # the throughput ratio the client gaps alone would give, minus 1
            row["ttft_gap_diff_ms"] = i["ttft_gap_ms"] - v["ttft_gap_ms"]
            row["client_ttft_effect"] = row["ttft_gap_diff_ms"] / (v["mean_ttft_ms"] - v["ttft_gap_ms"])
            (rounds if r >= 0 else warmups).append(row)
    finally:
        container.remove(force=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(key: str) -> dict[str, float]:
        values = [row[key] for row in rounds]
        return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4)}

    result = {"started": started, "image": image, "cpus": os.cpu_count(), "server_cpu": args.server_cpu,
              "client_cpu": args.client_cpu, "workload": {k: getattr(args, k) for k in (
                  "prompt_tokens", "output_tokens", "requests", "concurrency", "rounds", "warmup_rounds")},
              "ratio_output_throughput": summary("ratio_output_throughput"),
              "ratio_median_ttft": summary("ratio_median_ttft"), "rounds": rounds, "warmup": warmups}
    result["aa_ratio_output_throughput"] = summary("aa_ratio_output_throughput")
    result["aa_ratio_median_ttft"] = summary("aa_ratio_median_ttft")
    for key in ("gap_diff_ms_per_request", "client_throughput_effect", "ttft_gap_diff_ms", "client_ttft_effect"):
        result[key] = summary(key)
    for who in ("vllm", "imageforge", "imageforge_aa"):
        result[f"{who}_gap_ms_per_request"] = round(statistics.median(r[who]["gap_ms_per_request"] for r in rounds), 2)
        result[f"{who}_ttft_gap_ms"] = round(statistics.median(r[who]["ttft_gap_ms"] for r in rounds), 2)
    # the gate: the median paired ratio; the A/A medians above say how far two runs of one client drift
    result["paired_ratio_gate"] = all(abs(result[k]["median"] - 1) <= GATE for k in ("ratio_output_throughput",
                                                                                     "ratio_median_ttft"))
    # what the clients themselves add, against the server's clock (its speed cancels): the agreement verdict
    result["agree"] = all(abs(result[k]["median"]) <= GATE for k in ("client_throughput_effect",
                                                                      "client_ttft_effect"))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
