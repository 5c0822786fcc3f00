"""Serve the tiny model from the vLLM CPU base image once and measure it (numbers for bench/RESULTS.md).

    python images/cpu/serve_check.py [--keep]

Makes whatever is missing (daemon, images, model), starts one container (published on 127.0.0.1 only,
shm 1 GiB, model mounted read-only), waits for /health, checks /v1/models and two chat completions
(plain, and with a tool), reads the container's memory from docker stats, removes the container and
prints one JSON object.  Not part of the test suite: one vLLM start costs 30-50 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from imageforge import docker_engine as de
from imageforge.base import ensure_cpu_base, ensure_model

HERE = Path(__file__).resolve().parent
MOUNT = "/models/tiny-qwen3-moe"
SERVE_ARGS = [
    "vllm", "serve", MOUNT, "--enforce-eager", "--max-model-len", "2048",
    "--dtype", "bfloat16", "--served-model-name", "tiny", "--reasoning-parser", "qwen3",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--port", "8000",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_bytes(stats: dict[str, Any]) -> int:
    """What `docker stats` shows: usage minus the inactive file cache."""
    mem = stats.get("memory_stats", {})
    inner = mem.get("stats", {})
    cache = inner.get("total_inactive_file", inner.get("inactive_file", inner.get("cache", 0)))
    return int(mem.get("usage", 0)) - int(cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", action="store_true", help="leave the container running")
    args = ap.parse_args(argv)
    de.ensure_daemon()
    base = ensure_cpu_base(HERE)
    model = ensure_model(HERE)
    port = free_port()
    cli = de.client()
    result: dict[str, Any] = {"image": base.ref, "port": port}
    container = cli.containers.run(
        base.ref,
        command=SERVE_ARGS,
        detach=True,
        name=f"imageforge-serve-check-{port}",
        labels=de.tool_labels("serve-check"),
        ports={"8000/tcp": ("127.0.0.1", port)},
        shm_size="1g",
        environment={"VLLM_CPU_KVCACHE_SPACE": "1"},
        volumes={str(model): {"bind": MOUNT, "mode": "ro"}},
    )
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            while True:
                container.reload()
                if container.status not in ("created", "running"):
                    print("\n".join(de.tail_lines(container.logs(), 50)), file=sys.stderr)
                    raise SystemExit(f"container {container.status}")
                try:
                    if http.get("/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > 300:
                    raise SystemExit("no /health within 300 s")
                time.sleep(0.5)
            result["time_to_health_s"] = round(time.monotonic() - t0, 1)
            models = http.get("/v1/models").json()
            result["models"] = [m["id"] for m in models["data"]]
            t1 = time.monotonic()
            chat = http.post(
                "/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Hello!"}],
                    "max_tokens": 32,
                    "temperature": 0,
                    "chat_template_kwargs": {"enable_thinking": False},
                },
            )
            chat.raise_for_status()
            body = chat.json()
            result["chat_s"] = round(time.monotonic() - t1, 3)
            result["chat_usage"] = body["usage"]
            result["chat_finish"] = body["choices"][0]["finish_reason"]
            tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
            tool_chat = http.post(
                "/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Weather in Paris?"}],
                    "tools": tools,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                    "max_tokens": 48,
                    "temperature": 0,
                    "chat_template_kwargs": {"enable_thinking": False},
                },
            )
            result["tool_chat_status"] = tool_chat.status_code
            if tool_chat.status_code == 200:
                msg = tool_chat.json()["choices"][0]["message"]
                result["tool_calls"] = [c["function"]["name"] for c in msg.get("tool_calls") or []]
            time.sleep(2)
            result["memory_mib"] = round(memory_bytes(container.stats(stream=False)) / 2**20)
    finally:
        if not args.keep:
            t2 = time.monotonic()
            container.remove(force=True)
            result["remove_s"] = round(time.monotonic() - t2, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
