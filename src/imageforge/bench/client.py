"""The HTTP side of one bench: one httpx.AsyncClient against the URL it is given, nothing else.

The streams are read by :func:`imageforge.serve.openai_wire.open_stream` (httpx-sse), the same reader smoke uses;
the one-at-a-time replay reads them on a blocking client (:func:`stream_request_sync`), counted alike.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from httpx_sse import SSEError

from ..errors import SmokeError
from ..serve.openai_wire import StreamReader, open_stream, open_stream_sync
from ..workload import Prompt, Workload
from .metrics import metrics_counters
from .results import RequestResult


class BenchClient:
    """The HTTP side of one bench: one httpx.AsyncClient against ``url`` only."""

    def __init__(self, url: str, workload: Workload, transport: Any = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.workload = workload
        limits = httpx.Limits(max_connections=workload.concurrency + 4,
                              max_keepalive_connections=workload.concurrency + 4)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(workload.timeout, connect=10.0),
                                      limits=limits, transport=transport)

    async def close(self) -> None:
        await self.http.aclose()

    async def model(self) -> tuple[str, int | None]:
        """The first served model's name and its max_model_len (vLLM lists it; None elsewhere)."""
        import httpx

        try:
            response = await self.http.get("/v1/models", timeout=15.0)
        except httpx.HTTPError as exc:
            raise SmokeError(f"no server answers at {self.url}", found=f"{type(exc).__name__}: {exc}",
                             hint="start one with `invoke run --target T` (it prints URL=...), or let "
                             "`invoke bench --target T` start and stop one") from None
        if response.status_code != 200:
            raise SmokeError(f"GET {self.url}/v1/models answered HTTP {response.status_code}",
                             found=response.text[:300], hint="pass --model NAME")
        try:
            entries = response.json()["data"]
            entry = next((e for e in entries if e["id"] == self.workload.model), entries[0])
            limit = entry.get("max_model_len")
            return str(entry["id"]), int(limit) if isinstance(limit, int) else None
        except (ValueError, KeyError, IndexError, TypeError, StopIteration):
            raise SmokeError(f"GET {self.url}/v1/models lists no model", found=response.text[:300],
                             hint="pass --model NAME") from None

    async def tokenize(self, model: str, text: str) -> list[int] | None:
        """Token IDs of ``text`` (no special tokens); None when the server has no /tokenize."""
        import httpx

        try:
            response = await self.http.post("/tokenize", json={"model": model, "prompt": text,
                                                               "add_special_tokens": False})
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        tokens = response.json().get("tokens")
        return [int(t) for t in tokens] if isinstance(tokens, list) else None

    async def detokenize(self, model: str, tokens: list[int]) -> str | None:
        import httpx

        try:
            response = await self.http.post("/detokenize", json={"model": model, "tokens": tokens})
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        text = response.json().get("prompt")
        return text if isinstance(text, str) else None

    async def metrics(self) -> dict[str, float] | None:
        import httpx

        try:
            response = await self.http.get("/metrics", timeout=15.0)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return metrics_counters(response.text)
        except ValueError:  # not the Prometheus text format: as if there were no /metrics
            return None

    async def exact_ids(self, model: str, text_for: Callable[[int], str], n: int) -> list[int] | None:
        """The first ``n`` token IDs of a text that grows until it has enough; None without /tokenize."""
        if n == 0:
            return []
        words = n + 16
        for _ in range(8):
            ids = await self.tokenize(model, text_for(words))
            if ids is None:
                return None
            if len(ids) >= n:
                return ids[:n]
            words *= 2
        raise SmokeError(f"could not build a prompt of {n} tokens from the bench vocabulary")

    async def prompts(self, model: str, indexes: Sequence[int], *, shared: bool = True) -> tuple[list[Prompt], str]:
        """Prompts for ``indexes`` and the prompt mode (``token-ids`` or text).

        ``shared``: the common prefix + each request's own part (the measured requests); otherwise each
        prompt is its own words only (warm-up requests: they must not put the shared prefix in the cache).
        """
        w = self.workload
        prefix_len = w.prefix_tokens if shared else 0
        own_len = w.prompt_tokens - prefix_len
        prefix_ids = await self.exact_ids(model, w.prefix_text, prefix_len)
        if prefix_ids is None:
            prefix = w.prefix_text(prefix_len)
            texts = [" ".join(p for p in (prefix, w.unique_text(i, own_len)) if p) for i in indexes]
            return [Prompt(i, text, None) for i, text in zip(indexes, texts, strict=True)], "text"
        gate = asyncio.Semaphore(max(1, w.concurrency))

        async def one(i: int) -> Prompt:
            async with gate:
                own = await self.exact_ids(model, lambda words: w.unique_text(i, words), own_len)
                ids = prefix_ids + (own or [])
                if w.api == "chat":
                    text = await self.detokenize(model, ids)
                    if text is None:
                        text = " ".join(p for p in (w.prefix_text(prefix_len), w.unique_text(i, own_len)) if p)
                    return Prompt(i, text, None)
                return Prompt(i, ids, len(ids))

        prompts = await asyncio.gather(*(one(i) for i in indexes))
        return list(prompts), ("token-ids" if w.api == "completions" else "text (decoded token IDs)")

    def body(self, model: str, prompt: Prompt) -> tuple[str, dict[str, Any]]:
        w = self.workload
        common: dict[str, Any] = {
            "model": model,
            "max_tokens": w.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if w.api == "chat":
            return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt.body}]}
        return "/v1/completions", {**common, "prompt": prompt.body}

    async def send(self, model: str, prompt: Prompt) -> RequestResult:
        import httpx

        endpoint, body = self.body(model, prompt)
        result = RequestResult(prompt.index, started=time.monotonic())
        got = await stream_request(self.http, endpoint, body)
        result.finished = result.started + got.total
        result.latency = got.total
        result.status = got.status
        result.ttft = got.first_chunk
        result.itl = got.itl
        if got.usage is not None:
            result.usage = True
            result.prompt_tokens, result.completion_tokens = got.prompt_tokens, got.completion_tokens
            result.cached_tokens = got.cached_tokens
        if got.status is not None and got.status != 200:
            result.error = f"HTTP {got.status}: {_error_message(got.error_text or '')}"
        elif isinstance(got.exception, SSEError):
            result.error = f"not a stream: {got.exception}"[:300]
        elif isinstance(got.exception, httpx.TimeoutException):
            result.error = f"timed out after {self.workload.timeout:.0f}s"
        elif got.exception is not None:
            result.error = f"{type(got.exception).__name__}: {got.exception}"[:300]
        elif got.error_text is not None:
            result.error = f"stream error: {_error_message(got.error_text)}"
        if result.error:
            return result
        if not result.usage:
            result.completion_tokens = got.chunks
            result.prompt_tokens = prompt.tokens or 0
        if result.completion_tokens == 0:
            result.error = "no tokens in the answer"
            return result
        result.ok = True
        return result


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    return str(data)[:300]


@dataclass
class Streamed:
    """One streamed request as the client saw it (times in seconds from just before the POST)."""

    status: int | None = None
    error_text: str | None = None  # a non-200 body, or an ``error`` event in the stream
    exception: BaseException | None = None  # what httpx / httpx-sse raised (None: nothing)
    done: bool = False  # ``data: [DONE]`` came
    first_chunk: float | None = None  # the first chunk with choices (vllm bench serve's TTFT)
    first_token: float | None = None  # the first chunk whose choice carries generated text, reasoning or a tool call
    total: float = 0.0  # the end of the stream, or the failure
    chunks: int = 0  # chunks with choices
    usage: dict[str, Any] | None = None  # the last usage block
    finish_reason: str | None = None  # the last choice's finish_reason (None: the stream never said it ended)
    chunk_times: list[float] = field(default_factory=list)  # when each chunk with choices came
    cut: bool = False  # a deadline passed before the stream ended (:func:`stream_request_sync`)

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive chunks with choices (vllm bench serve's ITL)."""
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]

    @property
    def ttft(self) -> float | None:
        """The first generated token, else the first chunk with choices."""
        return self.first_token if self.first_token is not None else self.first_chunk

    @property
    def prompt_tokens(self) -> int:
        return int((self.usage or {}).get("prompt_tokens") or 0)

    @property
    def completion_tokens(self) -> int:
        return int((self.usage or {}).get("completion_tokens") or 0)

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` (else the other spellings the harness reads:
        ``usage.cached_tokens``, ``usage.prompt_cache_hit_tokens``); None when the server reports none."""
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            return int(details["cached_tokens"])
        for key in ("cached_tokens", "prompt_cache_hit_tokens"):
            if usage.get(key) is not None:
                return int(usage[key])
        return None


def _carries_token(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(delta.get(k) for k in ("content", "reasoning_content", "reasoning",
                                                                    "tool_calls"))


def _take(out: Streamed, chunk: Any, now: float) -> bool:
    """Count one chunk of the stream into ``out`` (``now``: seconds since the POST); False when it is an
    ``error`` event (the stream is over)."""
    if not isinstance(chunk, dict):
        return True
    if chunk.get("error"):
        out.error_text = json.dumps(chunk["error"], ensure_ascii=False)
        return False
    choices = chunk.get("choices")
    if choices:
        out.chunks += 1
        out.chunk_times.append(now)
        if out.first_chunk is None:
            out.first_chunk = now
        if out.first_token is None and any(_carries_token(c) for c in choices):
            out.first_token = now
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                out.finish_reason = str(choice["finish_reason"])
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        out.usage = usage
    return True


async def stream_request(http: Any, endpoint: str, body: dict[str, Any], *,
                         clock: Callable[[], float] = time.perf_counter) -> Streamed:
    """POST one streamed request through :func:`imageforge.serve.openai_wire.open_stream` and time it.

    The concurrent bench's request loop (:meth:`BenchClient.send`, an ``httpx.AsyncClient``); the one-at-a-time
    replay uses :func:`stream_request_sync`, which counts the chunks the same way (:func:`_take`).  Never
    raises for HTTP or stream trouble: it is recorded in ``exception`` / ``error_text``.
    """
    import httpx

    out = Streamed()
    reader = StreamReader()
    start = clock()
    try:
        async with open_stream(http, endpoint, body, reader=reader) as (response, stream):
            out.status = response.status_code
            if response.status_code != 200:
                out.error_text = (await response.aread()).decode("utf-8", "replace")
            else:
                async for chunk in stream:
                    if not _take(out, chunk, clock() - start):
                        break
    except (SSEError, httpx.HTTPError) as exc:  # SSEError: a 200 answer that is not text/event-stream
        out.exception = exc
    out.total = clock() - start
    out.done = reader.done
    return out


def stream_request_sync(http: Any, endpoint: str, body: dict[str, Any], *,
                        clock: Callable[[], float] = time.perf_counter, deadline: float | None = None,
                        timeout: float | None = None) -> Streamed:
    """:func:`stream_request` on a blocking ``httpx.Client`` (no event loop: the replay sends one request at a
    time, and the asyncio client it replaced added ~30 ms to TTFT on a loaded machine; bench/RESULTS.md).

    ``deadline`` (a ``clock`` value): the stream is abandoned once a chunk comes after it (``out.cut``), and no
    read waits past it (the read timeout is ``timeout`` or the time left, whichever is shorter).  Never
    raises for HTTP or stream trouble.
    """
    import httpx

    out = Streamed()
    reader = StreamReader()
    start = clock()
    per_request = None
    if deadline is not None:
        left = max(deadline - start, 0.001)
        read = left if timeout is None else min(timeout, left)
        per_request = httpx.Timeout(read, connect=min(10.0, read))
    try:
        with open_stream_sync(http, endpoint, body, reader=reader, timeout=per_request) as (response, stream):
            out.status = response.status_code
            if response.status_code != 200:
                out.error_text = response.read().decode("utf-8", "replace")
            else:
                for chunk in stream:
                    now = clock()
                    if deadline is not None and now > deadline:
                        out.cut = True
                        break
                    if not _take(out, chunk, now - start):
                        break
    except (SSEError, httpx.HTTPError) as exc:  # SSEError: a 200 answer that is not text/event-stream
        out.exception = exc
    out.total = clock() - start
    out.done = reader.done
    if deadline is not None and clock() > deadline:
        out.cut = True  # it ended (or failed) after the deadline: it does not count
    return out
