"""waits: the one /health probe and poll loop (against a real local HTTP server), and serving_client's stream
reader on what httpx-sse hands it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import pytest

from imageforge.serve.openai_wire import parse_sse
from imageforge.serve.waits import probe_health, wait_healthy, wait_until

HOST = "127.0.0.1"


@pytest.fixture
def flaky_health() -> Iterator[tuple[str, list[int]]]:
    """A server whose /health answers 503 for the first N requests (N = answers[0]), then 200."""
    answers = [2]
    seen: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(1)
            self.send_response(503 if len(seen) <= answers[0] else 200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = HTTPServer((HOST, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://{HOST}:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def test_probe_health_reports_status_and_transport_errors(flaky_health: tuple[str, list[int]]) -> None:
    url, _ = flaky_health
    with httpx.Client(timeout=5) as http:
        first = probe_health(http, url)
        assert (first.status, first.ok, first.short) == (503, False, "HTTP 503")
        assert first.describe() == "GET /health -> HTTP 503"
        probe_health(http, url)
        assert probe_health(http, url + "/").ok  # the third answer is 200; a trailing slash is fine
        gone = probe_health(http, f"http://{HOST}:{closed_port()}")
    assert gone.status is None and gone.connect_failed and gone.short == "ConnectError"
    assert gone.describe().startswith("GET /health: ConnectError")


def test_wait_healthy_polls_until_200(flaky_health: tuple[str, list[int]]) -> None:
    url, seen = flaky_health
    health = wait_healthy(url, timeout=10, interval=0.05)
    assert health is not None and health.ok and len(seen) == 3


def test_wait_healthy_gives_up_after_the_timeout() -> None:
    t0 = time.monotonic()
    assert wait_healthy(f"http://{HOST}:{closed_port()}", timeout=0.5, interval=0.1) is None
    assert 0.4 < time.monotonic() - t0 < 5


def test_wait_until_counts_from_started_and_reports_progress() -> None:
    polls: list[float] = []
    t0 = time.monotonic() - 10  # as if the wait began 10 s ago: a 5 s timeout is already spent
    assert wait_until(lambda: None, timeout=5, interval=0.01, started=t0, on_poll=polls.append) is None
    assert polls == []  # no sleep, no progress line: the first check was already past the deadline
    values = iter([None, None, "ready"])
    assert wait_until(lambda: next(values), timeout=5, interval=0.01, on_poll=polls.append) == "ready"
    assert len(polls) == 2 and all(p >= 0 for p in polls)


def test_wait_until_lets_the_condition_stop_the_wait() -> None:
    def exited() -> None:
        raise RuntimeError("container exited")

    with pytest.raises(RuntimeError, match="container exited"):
        wait_until(exited, timeout=30, interval=1)


def test_parse_sse_keeps_an_unterminated_last_event_and_multiline_data() -> None:
    chunks, done, problems = parse_sse('data: {"a":\ndata: 1}\n\n: a comment\n\ndata: {"b": 2}')
    assert chunks == [{"a": 1}, {"b": 2}] and not done and not problems
    chunks, done, problems = parse_sse("data: [DONE]\n\ndata: [DONE]\n\n")
    assert chunks == [] and done and problems == ["[DONE] sent twice"]
