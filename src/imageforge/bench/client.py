"""The HTTP side of one bench: one httpx.AsyncClient against the URL it is given, nothing else.

The streams are read by :func:`imageforge.serving_client.open_stream` (httpx-sse), the same reader smoke uses.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from httpx_sse import SSEError

from ..errors import SmokeError
from ..serving_client import open_stream
from .metrics import metrics_counters
from .results import RequestResult
from .workload import Prompt, Workload


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
            "min_tokens": w.output_tokens,
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
        chunks = 0
        try:
            async with open_stream(self.http, endpoint, body) as (response, stream):
                result.status = response.status_code
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    result.error = f"HTTP {response.status_code}: {_error_message(text)}"
                    return result
                async for chunk in stream:
                    if not isinstance(chunk, dict):
                        continue
                    if chunk.get("error"):
                        result.error = f"stream error: {_error_message(json.dumps(chunk))}"
                        return result
                    if chunk.get("choices"):
                        chunks += 1
                        if result.ttft is None:
                            result.ttft = time.monotonic() - result.started
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        result.usage = True
                        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        result.completion_tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("prompt_tokens_details")
                        if isinstance(details, dict) and details.get("cached_tokens") is not None:
                            result.cached_tokens = int(details["cached_tokens"])
        except SSEError as exc:  # a 200 answer that is not text/event-stream
            result.error = f"not a stream: {exc}"[:300]
            return result
        except httpx.TimeoutException:
            result.error = f"timed out after {self.workload.timeout:.0f}s"
            return result
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
            return result
        finally:
            result.finished = time.monotonic()
            result.latency = result.finished - result.started
        if not result.usage:
            result.completion_tokens = chunks
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
