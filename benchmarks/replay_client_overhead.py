"""How much time does the replay's client itself add to TTFT? (bench/RESULTS.md,
"Replay and A/A")

Usage: .venv/bin/python benchmarks/replay_client_overhead.py [--url URL] [--rounds 8] [--requests 10] [--words 3000]
       [--out FILE]

Four clients time the first token of the same streamed chat request, one request at a time:

* ``old``: the replay's former request loop, httpx's ``AsyncClient`` through :func:`imageforge.bench.client.
  stream_request` (httpx-sse; still the concurrent bench's loop), one ``asyncio.run`` per round;
* ``new``: the replay's request loop now, :func:`imageforge.bench.replay.send_one` on a blocking ``httpx.Client``
  (:func:`imageforge.bench.client.stream_request_sync`), retries off;
* ``new_aa``: ``new`` once more, the A/A control (how far one client moves between two turns of a round);
* ``http_client``: the standard library's ``http.client``, the SSE lines split by hand (no imageforge code).

Without ``--url`` the server is a stand-in (this file again, ``--serve PORT``, in a process of its own: the
standard library's HTTP server answering every POST at once with a three-chunk event stream): the server does no
work, so what each client reports is its own cost.  With ``--url`` (one running server, e.g. ``invoke run
--target cpu``) every request is the same prompt (``--words`` words, the prefix cache warm after the first) with
``max_tokens`` 4 and ``ignore_eos``.  Per round the clients take turns in an order that rotates every round, each
sending ``--requests`` requests; TTFT is the first chunk carrying content, reasoning or a tool call (else the
first chunk with choices).  Prints one JSON object: per client the median, p10 and p90 over all requests and the
range of its per-round medians; per round the paired ratios of each client's median to ``new``'s.
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
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHUNKS = ({"choices": [{"delta": {"content": "a"}}]},
          {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
ENDPOINT = "/v1/chat/completions"
CLIENTS = ("old", "new", "new_aa", "http_client")


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


# --------------------------------------------------------------------------- the clients (TTFT in ms per request)


def old_client(url: str, body: dict[str, Any], n: int) -> list[float]:
    import httpx

    from imageforge.bench.client import stream_request

    async def rounds() -> list[float]:
        out = []
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1000.0, connect=10.0)) as client:
            for _ in range(n):
                got = await stream_request(client, ENDPOINT, body)
                out.append((got.ttft or 0.0) * 1000)
        return out

    return asyncio.run(rounds())


def new_client(url: str, body: dict[str, Any], n: int) -> list[float]:
    import httpx

    from imageforge.bench.replay import RetryPolicy, send_one

    out = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(1000.0, connect=10.0)) as client:
        for _ in range(n):
            record = send_one(client, 0, body, policy=RetryPolicy(retries=0))
            out.append((record.ttft_s or 0.0) * 1000)
    return out


def stdlib_client(url: str, body: dict[str, Any], n: int) -> list[float]:
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=1000)
        conn.request("POST", ENDPOINT, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        first_chunk = first_token = None
        while line := response.readline():
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            now = (time.perf_counter() - start) * 1000
            if choices and first_chunk is None:
                first_chunk = now
            if first_token is None and any(
                    any((c.get("delta") or {}).get(k) for k in ("content", "reasoning_content", "reasoning",
                                                                 "tool_calls")) for c in choices):
                first_token = now
        conn.close()
        out.append(first_token if first_token is not None else (first_chunk or 0.0))
    return out


# --------------------------------------------------------------------------- the rounds


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def measure(url: str, body: dict[str, Any], rounds: int, n: int) -> dict[str, Any]:
    clients: dict[str, Callable[[], list[float]]] = {
        "old": lambda: old_client(url, body, n), "new": lambda: new_client(url, body, n),
        "new_aa": lambda: new_client(url, body, n), "http_client": lambda: stdlib_client(url, body, n)}
    new_client(url, body, 2)  # warm-up, left out: the prefix cache holds the prompt from here on
    per_round: list[dict[str, Any]] = []
    every: dict[str, list[float]] = {name: [] for name in CLIENTS}
    for r in range(rounds):
        order = list(CLIENTS[r % 4:] + CLIENTS[:r % 4])
        row: dict[str, Any] = {"round": r, "order": order, "load": round(os.getloadavg()[0], 2)}
        for name in order:
            values = clients[name]()
            every[name].extend(values)
            row[name] = round(statistics.median(values), 2)
        print(json.dumps(row), file=sys.stderr)
        per_round.append(row)
    summary = {name: {"median_ms": round(statistics.median(every[name]), 2),
                      "p10_ms": round(quantile(every[name], 0.1), 2), "p90_ms": round(quantile(every[name], 0.9), 2),
                      "round_medians_ms": [min(r[name] for r in per_round), max(r[name] for r in per_round)]}
               for name in CLIENTS}
    ratios = {}
    for name in ("old", "new_aa", "http_client"):
        values = [r[name] / r["new"] for r in per_round if r["new"]]
        ratios[f"{name}/new"] = {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                                 "max": round(max(values), 3)}
    return {"clients": summary, "paired_ratios": ratios, "per_round": per_round}


def main(argv: Sequence[str] | None = None) -> int:
    from replay_common import emit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help="a running server (default: a stand-in server of this file's)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10, help="requests per client per round")
    parser.add_argument("--words", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x " * args.words}], "stream": True,
                            "stream_options": {"include_usage": True}}
    server = None
    if args.url:
        from imageforge.bench.replay import discover_model

        url = args.url.rstrip("/")
        body.update(model=discover_model(url)[0], max_tokens=4, ignore_eos=True, temperature=0)
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        body["model"] = "m"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
    try:
        load_before = [round(x, 2) for x in os.getloadavg()]
        measured = measure(url, body, args.rounds, args.requests)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    result = {"started": started, "server": args.url or "stand-in", "cpus": os.cpu_count(), "rounds": args.rounds,
              "requests_per_client_per_round": args.requests, "words": args.words, "load_before": load_before,
              "load_after": [round(x, 2) for x in os.getloadavg()], **measured}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
