"""How much time does the replay's client itself add to TTFT? (issue 33; bench/RESULTS.md, "Replay metrics against
a second client")

Usage: .venv/bin/python benchmarks/replay_client_overhead.py [--requests 40] [--words 3000]

A stand-in server (this file again, ``--serve PORT``, in a process of its own: the standard library's HTTP
server answering every POST at once with a three-chunk event stream) and three clients timing the first content
chunk of the same streamed chat request, one request at a time: imageforge's ``send_one`` (the replay's request
loop: httpx's AsyncClient, httpx-sse), a bare httpx AsyncClient reading lines, and ``http.client``.  The server
does no work, so what each client reports is its own cost.  Prints one JSON object: median and p90 per client.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHUNKS = ({"choices": [{"delta": {"content": "a"}}]},
          {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in [b"data: " + json.dumps(c).encode() + b"\n\n" for c in CHUNKS] + [b"data: [DONE]\n\n"]:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def imageforge_client(url: str, body: dict[str, Any], n: int) -> list[float]:
    import httpx

    from imageforge.bench.replay import RetryPolicy, send_one

    out = []
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(n):
            record = await send_one(client, 0, body, policy=RetryPolicy(retries=0))
            out.append((record.ttft_s or 0.0) * 1000)
    return out


async def httpx_client(url: str, body: dict[str, Any], n: int) -> list[float]:
    import httpx

    out = []
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(n):
            start = time.perf_counter()
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if '"content"' in line:
                        out.append((time.perf_counter() - start) * 1000)
                        break
    return out


def stdlib_client(port: int, body: dict[str, Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        first = None
        while line := response.readline():
            if first is None and line.startswith(b"data: {") and b'"content"' in line:
                first = (time.perf_counter() - start) * 1000
        conn.close()
        out.append(first or 0.0)
    return out


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": round(statistics.median(ordered), 2),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--words", type=int, default=3000)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        body = {"model": "m", "messages": [{"role": "user", "content": "x " * args.words}], "stream": True}
        result = {
            "load_before": [round(x, 2) for x in os.getloadavg()], "requests": args.requests, "words": args.words,
            "imageforge_send_one": summary(asyncio.run(imageforge_client(url, body, args.requests))),
            "httpx_async_lines": summary(asyncio.run(httpx_client(url, body, args.requests))),
            "stdlib_http_client": summary(stdlib_client(port, body, args.requests)),
            "load_after": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        server.terminate()
        server.wait()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
