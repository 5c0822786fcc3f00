"""Load benchmarks and parameter sweeps against OpenAI-compatible servers, scored like the competition.

* :class:`Workload` -- N requests at concurrency C: prompt length and output length in tokens,
  the fraction of each prompt shared by every request (it exercises the prefix cache), a seed.
  Prompts are deterministic words (:func:`prompt_words`); against a server with ``/tokenize``
  (vLLM) they become token-ID prompts of exactly the requested length, otherwise plain text of
  about that length.  Output lengths are forced with ``max_tokens`` = ``min_tokens`` and
  ``ignore_eos: true``, so random weights produce exactly the tokens asked for.
* :func:`run_bench` -- the load client (asyncio + httpx, streaming for the time to first token).
  It stops by itself: after ``requests`` requests or ``duration`` seconds, whichever is first;
  it talks only to the URL it is given.
* Measures: Output TPS (generated tokens / wall), Input TPS (prompt tokens / wall), Cache TPS
  (prompt tokens served from the prefix cache / wall: from ``usage.prompt_tokens_details.cached_tokens``
  when the server reports it -- vLLM only with ``--enable-prompt-tokens-details`` -- else from the
  delta of vLLM's ``/metrics`` counter ``vllm:prompt_tokens_cached_total`` or ``vllm:prefix_cache_hits_total``),
  TTFT / latency / time per output token percentiles, errors, and :func:`score`.
* :func:`bench_target` -- build if needed, serve, bench, always remove; :func:`sweep` -- one
  server per parameter combination (``--set`` values; only the serving-config layer is rebuilt),
  best score and Output-TPS plateau marked, ``sweep.json`` + ``sweep.md``.

Reports go to ``.imageforge/runs/<run id>/`` (``bench.json``; ``sweep.json``, ``sweep.md``).
A bench fails (SmokeError, exit 4) when its error rate exceeds the threshold or no token came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, ImageforgeError, SmokeError

Log = Callable[[str], None]

# --------------------------------------------------------------------------- the competition's score

#: Score = Output TPS x 16.796 + Input TPS x 2.799 + Cache TPS x 0.56 (the competition's published weights:
#: generated tokens/s, prompt tokens processed/s, prompt tokens served from the prefix cache/s).
SCORE_OUTPUT_WEIGHT = 16.796
SCORE_INPUT_WEIGHT = 2.799
SCORE_CACHE_WEIGHT = 0.56

#: A sweep point whose Output TPS is within this fraction of the best one is "on the plateau".
PLATEAU_TOLERANCE = 0.05

#: /metrics counters for prompt tokens served from the prefix cache, most specific first (vLLM V1 names;
#: prometheus_client adds ``_total`` to counters, older exporters do not).
CACHED_TOKEN_COUNTERS = (
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_cached",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
)
PROMPT_TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens")
GENERATION_TOKEN_COUNTERS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
METRICS_SETTLE = 5.0  # seconds to wait for /metrics counters to catch up with the last response
APIS = ("completions", "chat")


def score(output_tps: float, input_tps: float, cache_tps: float) -> float:
    """The competition's score of one measurement."""
    return output_tps * SCORE_OUTPUT_WEIGHT + input_tps * SCORE_INPUT_WEIGHT + cache_tps * SCORE_CACHE_WEIGHT


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks (numpy's default); None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def plateau_index(values: Sequence[float | None], tolerance: float = PLATEAU_TOLERANCE) -> int | None:
    """The first point (in sweep order) whose value is within ``tolerance`` of the maximum, if a later point exists.

    With the points ordered by a growing parameter (max-num-seqs 1, 2, 4 ...) that is where the curve
    flattens: going further buys at most ``tolerance`` more.  None when the first such point is the last
    measured one (the curve is still rising: no plateau within the swept values) or nothing was measured.
    """
    known = [i for i, v in enumerate(values) if v is not None]
    if not known:
        return None
    top = max(v for v in values if v is not None)
    first = next(i for i in known if (values[i] or 0.0) >= top * (1 - tolerance))
    return first if first != known[-1] else None


# --------------------------------------------------------------------------- the workload

# A fixed vocabulary: prompts are reproducible from the seed alone and tokenize on any tokenizer.
_VOCABULARY = """
the of and to in is was for on are with as by at from that this be or an it not have which has had but were
all their there been one more would will if can when into time who about after other than these new some could
first two made any only over such system model data value token cache layer batch queue engine kernel memory
block prefix decode prefill server request answer stream score weight latency output input device core thread
sequence context window vector matrix tensor expert router graph image build patch overlay step profile target
north south river mountain forest city garden window table paper music letter summer winter morning evening
quick brown lazy bright quiet heavy light small large early late simple careful strong gentle ready steady
read write run walk open close start stop carry bring follow measure count compare choose explain describe
"""
_WORDS = tuple(dict.fromkeys(_VOCABULARY.split()))


def prompt_words(seed: int, label: str, count: int) -> str:
    """``count`` words drawn from a fixed vocabulary by a RNG seeded with ``(seed, label)``.

    Deterministic across processes (string seeds do not depend on PYTHONHASHSEED), and the first k words
    of a longer draw equal a shorter draw: a prompt can be extended without changing its start.
    """
    rng = random.Random(f"imageforge-bench:{seed}:{label}")
    return " ".join(rng.choice(_WORDS) for _ in range(max(0, count)))


@dataclass(frozen=True)
class Workload:
    """What one bench sends. Lengths are in tokens; ``shared_prefix`` is a fraction of ``prompt_tokens``."""

    requests: int = 32
    concurrency: int = 8
    prompt_tokens: int = 256
    output_tokens: int = 64
    shared_prefix: float = 0.5
    seed: int = 0
    api: str = "completions"
    model: str | None = None
    duration: float = 300.0  # seconds: the bench (all repeats together) stops by itself after this
    timeout: float = 120.0  # seconds per request
    warmup: int = 1  # requests sent (and not measured) first, with prompts unrelated to the measured ones
    max_error_rate: float = 0.0  # a bench with a higher error rate fails (exit 4)
    repeat: int = 1  # runs on the same server (seed, seed+1, ...): the one with the median score is reported

    def validate(self) -> Workload:
        problems: list[str] = []
        if self.requests < 1:
            problems.append(f"requests must be >= 1 (got {self.requests})")
        if self.concurrency < 1:
            problems.append(f"concurrency must be >= 1 (got {self.concurrency})")
        if self.prompt_tokens < 1:
            problems.append(f"prompt tokens must be >= 1 (got {self.prompt_tokens})")
        if self.output_tokens < 1:
            problems.append(f"output tokens must be >= 1 (got {self.output_tokens})")
        if not 0.0 <= self.shared_prefix <= 1.0:
            problems.append(f"shared prefix must be a fraction within 0..1 (got {self.shared_prefix})")
        if self.api not in APIS:
            problems.append(f"api must be one of {', '.join(APIS)} (got {self.api!r})")
        if self.duration <= 0 or self.timeout <= 0:
            problems.append("duration and timeout must be > 0")
        if self.warmup < 0:
            problems.append(f"warmup must be >= 0 (got {self.warmup})")
        if not 0.0 <= self.max_error_rate <= 1.0:
            problems.append(f"max error rate must be within 0..1 (got {self.max_error_rate})")
        if self.repeat < 1:
            problems.append(f"repeat must be >= 1 (got {self.repeat})")
        if problems:
            raise ConfigError("invalid bench workload: " + "; ".join(problems),
                              hint="see `invoke --help bench` for the workload options")
        return self

    @property
    def prefix_tokens(self) -> int:
        """Tokens every prompt starts with (the same for all requests)."""
        return min(self.prompt_tokens, round(self.prompt_tokens * self.shared_prefix))

    @property
    def unique_tokens(self) -> int:
        return self.prompt_tokens - self.prefix_tokens

    def prefix_text(self, words: int) -> str:
        return prompt_words(self.seed, "prefix", words)

    def unique_text(self, index: int, words: int) -> str:
        """Request ``index``'s own part (negative indexes: warm-up requests)."""
        return prompt_words(self.seed, f"request-{index}", words)

    def texts(self) -> list[str]:
        """The measured prompts as text (about one word per token: exact lengths come from /tokenize)."""
        prefix = self.prefix_text(self.prefix_tokens)
        return [" ".join(p for p in (prefix, self.unique_text(i, self.unique_tokens)) if p)
                for i in range(self.requests)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def workload_from_cli(requests: int, concurrency: int, prompt_tokens: int, output_tokens: int, shared_prefix: float,
                      seed: int, api: str, model: str, duration: float, timeout: float, warmup: int,
                      max_error_rate: float, repeat: int = 1) -> Workload:
    """A checked Workload from task options (0 requests/concurrency: the defaults; empty model: discover it)."""
    defaults = Workload()
    return Workload(requests=requests or defaults.requests, concurrency=concurrency or defaults.concurrency,
                    prompt_tokens=prompt_tokens, output_tokens=output_tokens, shared_prefix=shared_prefix, seed=seed,
                    api=api, model=model or None, duration=duration, timeout=timeout, warmup=warmup,
                    max_error_rate=max_error_rate, repeat=repeat).validate()


@dataclass(frozen=True)
class Prompt:
    index: int
    body: str | list[int]  # token IDs (exact length) or text
    tokens: int | None  # the exact prompt length when known before sending


# --------------------------------------------------------------------------- results


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str | None = None
    status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # from usage.prompt_tokens_details, when the server reports it
    usage: bool = False  # the server sent a usage block (else completion_tokens counts streamed chunks)
    ttft: float | None = None
    latency: float | None = None
    started: float = 0.0
    finished: float = 0.0

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first."""
        if self.ttft is None or self.latency is None or self.completion_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.completion_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "ok": self.ok, "error": self.error, "status": self.status,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "usage": self.usage,
                "ttft_s": _round(self.ttft), "latency_s": _round(self.latency), "tpot_s": _round(self.tpot, 6)}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class BenchResult:
    run_id: str
    url: str
    model: str
    workload: Workload
    started_at: str
    wall_seconds: float
    results: list[RequestResult]
    cancelled: int = 0  # requests cut by the duration limit (never sent, or not finished)
    prompt_mode: str = "token-ids"  # token-ids (exact lengths) or text (approximate)
    cached_tokens: int | None = None
    cache_source: str = "unavailable"
    metrics_delta: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    target: str | None = None
    profile: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    startup_seconds: float | None = None
    host: dict[str, Any] = field(default_factory=dict)
    repeats: list[dict[str, Any]] = field(default_factory=list)  # every run's summary when workload.repeat > 1
    run_dir: Path | None = None
    json_path: Path | None = None

    # ---- counts
    @property
    def ok_results(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    @property
    def attempted(self) -> int:
        return len(self.results)

    @property
    def error_rate(self) -> float:
        return self.errors / self.attempted if self.attempted else 0.0

    @property
    def worst_error_rate(self) -> float:
        """The highest error rate of every run (repeats included): a failing run is never hidden by the median."""
        return max([self.error_rate, *(float(r.get("error_rate") or 0.0) for r in self.repeats)])

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.ok_results)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.ok_results)

    @property
    def short_responses(self) -> int:
        """Successful responses with another number of tokens than requested (ignore_eos not honoured?)."""
        return sum(1 for r in self.ok_results if r.completion_tokens != self.workload.output_tokens)

    # ---- rates
    def _per_second(self, tokens: float | None) -> float:
        if not tokens or self.wall_seconds <= 0:
            return 0.0
        return tokens / self.wall_seconds

    @property
    def output_tps(self) -> float:
        return self._per_second(self.completion_tokens)

    @property
    def input_tps(self) -> float:
        return self._per_second(self.prompt_tokens)

    @property
    def cache_tps(self) -> float:
        return self._per_second(self.cached_tokens)

    @property
    def score(self) -> float:
        return score(self.output_tps, self.input_tps, self.cache_tps)

    def _pct(self, attr: str, q: float) -> float | None:
        values = [v for r in self.ok_results if (v := getattr(r, attr)) is not None]
        return percentile(values, q)

    def summary(self) -> dict[str, Any]:
        """The numbers a table or a sweep shows (rates rounded to 0.01, times in seconds)."""
        return {
            "requests": self.workload.requests, "ok": len(self.ok_results), "errors": self.errors,
            "cancelled": self.cancelled, "error_rate": round(self.error_rate, 4),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "cache_source": self.cache_source,
            "short_responses": self.short_responses, "wall_s": round(self.wall_seconds, 3),
            "output_tps": round(self.output_tps, 2), "input_tps": round(self.input_tps, 2),
            "cache_tps": round(self.cache_tps, 2), "score": round(self.score, 2),
            "ttft_p50_s": _round(self._pct("ttft", 50)), "ttft_p95_s": _round(self._pct("ttft", 95)),
            "latency_p50_s": _round(self._pct("latency", 50)), "latency_p95_s": _round(self._pct("latency", 95)),
            "tpot_p50_s": _round(self._pct("tpot", 50), 6),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "url": self.url, "model": self.model, "started_at": self.started_at,
            "target": self.target, "profile": self.profile, "params": self.params,
            "startup_seconds": _round(self.startup_seconds, 2), "host": self.host,
            "workload": self.workload.to_json(), "prompt_mode": self.prompt_mode,
            "score_weights": {"output_tps": SCORE_OUTPUT_WEIGHT, "input_tps": SCORE_INPUT_WEIGHT,
                              "cache_tps": SCORE_CACHE_WEIGHT},
            "summary": self.summary(), "repeats": self.repeats, "metrics_delta": self.metrics_delta,
            "notes": self.notes,
            "requests": [r.to_json() for r in self.results],
        }


# --------------------------------------------------------------------------- /metrics


def metrics_counters(text: str) -> dict[str, float]:
    """Prometheus text -> ``{name: value summed over label sets}`` for every ``vllm:`` series."""
    from .smoke import parse_metrics

    out: dict[str, float] = {}
    for name, _labels, value in parse_metrics(text):
        if name.startswith("vllm:") and not name.endswith("_created"):
            out[name] = out.get(name, 0.0) + value
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float],
                  names: Sequence[str]) -> tuple[str, float] | None:
    """The first of ``names`` present in both snapshots and its growth; None when none is there."""
    for name in names:
        if name in before and name in after:
            return name, max(0.0, after[name] - before[name])
    return None


# --------------------------------------------------------------------------- the client


class _Client:
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
        return metrics_counters(response.text)

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
            async with self.http.stream("POST", endpoint, json=body) as response:
                result.status = response.status_code
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    result.error = f"HTTP {response.status_code}: {_error_message(text)}"
                    return result
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
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


async def _run(url: str, workload: Workload, echo: Log, transport: Any = None) -> BenchResult:
    from .build import new_run_id

    client = _Client(url, workload, transport)
    try:
        listed, max_model_len = await client.model()
        model = workload.model or listed
        wanted = workload.prompt_tokens + workload.output_tokens
        if max_model_len is not None and wanted > max_model_len:
            raise ConfigError(f"prompt {workload.prompt_tokens} + output {workload.output_tokens} tokens = {wanted} "
                              f"exceeds the server's max_model_len {max_model_len}",
                              hint="lower --prompt-tokens or --output-tokens")
        load_before = _loadavg()
        prompts, mode = await client.prompts(model, range(workload.requests))
        notes: list[str] = []
        if mode == "text":
            notes.append("the server has no /tokenize: prompts are text of about the requested length")
        if workload.warmup:
            warm, _ = await client.prompts(model, range(-workload.warmup, 0), shared=False)
            for prompt in warm:
                res = await client.send(model, prompt)
                if not res.ok:
                    notes.append(f"warm-up request failed: {res.error}")
        before = await client.metrics()
        started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        echo(f"bench {url} model {model}: {workload.requests} requests at concurrency {workload.concurrency}, "
             f"prompt {workload.prompt_tokens} tokens ({workload.prefix_tokens} shared), "
             f"output {workload.output_tokens} tokens, {mode} prompts, api {workload.api}")
        gate = asyncio.Semaphore(workload.concurrency)

        async def limited(prompt: Prompt) -> RequestResult:
            async with gate:
                return await client.send(model, prompt)

        t0 = time.monotonic()
        tasks = [asyncio.create_task(limited(p)) for p in prompts]
        done, pending = await asyncio.wait(tasks, timeout=workload.duration)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        results = sorted((t.result() for t in done), key=lambda r: r.index)
        end = max((r.finished for r in results), default=t0) if not pending else time.monotonic()
        wall = max(end - t0, 1e-9)
        if pending:
            notes.append(f"{len(pending)} requests cut by the duration limit ({workload.duration:.0f}s)")
        bench = BenchResult(run_id=new_run_id(), url=url, model=model, workload=workload, started_at=started_at,
                            wall_seconds=wall, results=results, cancelled=len(pending), prompt_mode=mode,
                            notes=notes, host={"cpus": os.cpu_count(), "loadavg_before": load_before,
                                               "loadavg_after": _loadavg()})
        await _cached_tokens(client, bench, before)
        return bench
    finally:
        await client.close()


def _loadavg() -> list[float] | None:
    """The host's 1/5/15-minute load averages (the client shares the CPUs with a local server)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


async def _cached_tokens(client: _Client, bench: BenchResult, before: Mapping[str, float] | None) -> None:
    """Fill cached_tokens/cache_source: per-request usage details, else the /metrics counter delta."""
    ok = bench.ok_results
    if ok and all(r.cached_tokens is not None for r in ok):
        bench.cached_tokens = sum(r.cached_tokens or 0 for r in ok)
        bench.cache_source = "usage.prompt_tokens_details.cached_tokens"
    if before is None:
        if bench.cached_tokens is None:
            bench.notes.append("no cached-token count: the server reports neither usage.prompt_tokens_details "
                               "nor /metrics")
        return
    after = await client.metrics() or {}
    deadline = time.monotonic() + METRICS_SETTLE
    while True:  # counters are updated by the engine loop: let them catch up with the last response
        prompt = counter_delta(before, after, PROMPT_TOKEN_COUNTERS)
        generated = counter_delta(before, after, GENERATION_TOKEN_COUNTERS)
        caught_up = ((prompt is None or prompt[1] >= bench.prompt_tokens)
                     and (generated is None or generated[1] >= bench.completion_tokens))
        if caught_up or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.25)
        after = await client.metrics() or after
    names = (*CACHED_TOKEN_COUNTERS, *PROMPT_TOKEN_COUNTERS, *GENERATION_TOKEN_COUNTERS,
             "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total")
    for name in names:
        if name in before and name in after:
            bench.metrics_delta[name] = round(after[name] - before[name], 3)
    if bench.cached_tokens is None:
        cached = counter_delta(before, after, CACHED_TOKEN_COUNTERS)
        if cached is None:
            bench.notes.append("no cached-token count: no prefix-cache counter in /metrics")
        else:
            bench.cached_tokens = int(cached[1])
            bench.cache_source = f"/metrics {cached[0]} delta"
            bench.notes.append("cached tokens come from server-wide /metrics counters: traffic from other "
                               "clients during the run counts too")


def run_bench(url: str, workload: Workload, *, run_dir: Path | None = None, echo: Log = print,
              transport: Any = None, write: bool = True) -> BenchResult:
    """Run ``workload`` against ``url`` (bounded by ``workload.requests`` and ``workload.duration``).

    Writes ``bench.json`` into ``run_dir`` (default ``./.imageforge/runs/<run id>``) when ``write``.
    ``transport`` (an httpx async transport) replaces the network, for tests. Never raises for
    request failures: they are counted (see :func:`verdict`).
    """
    from .smoke import check_url

    workload.validate()
    check_url(url)
    runs: list[BenchResult] = []
    skipped = ""
    deadline = time.monotonic() + workload.duration
    for r in range(workload.repeat):
        left = deadline - time.monotonic()
        if r and left < 1.0:
            skipped = (f"{workload.repeat - r} of {workload.repeat} repeats skipped: the duration limit "
                       f"({workload.duration:.0f}s) was spent")
            break
        one = dataclasses.replace(workload, seed=workload.seed + r, warmup=workload.warmup if r == 0 else 0,
                                  duration=max(left, 1.0))
        runs.append(asyncio.run(_run(url, one, echo, transport)))
        if workload.repeat > 1:
            s = runs[-1].summary()
            echo(f"  run {r + 1}/{workload.repeat} (seed {one.seed}): Output {s['output_tps']:.1f} / Input "
                 f"{s['input_tps']:.1f} / Cache {s['cache_tps']:.1f} TPS, score {s['score']:.0f}, errors "
                 f"{s['errors']}/{s['requests']}")
    bench = median_run(runs)
    if skipped:
        bench.notes.append(skipped)
    if write:
        bench.run_dir = run_dir or Path.cwd() / ".imageforge" / "runs" / bench.run_id
        write_bench(bench)
    return bench


def median_run(runs: Sequence[BenchResult]) -> BenchResult:
    """The run with the median score (the lower middle one for an even count), carrying every run's summary."""
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda b: b.score)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.repeats = [b.summary() | {"seed": b.workload.seed} for b in runs]
    scores = ", ".join(f"{b.score:.0f}" for b in runs)
    chosen.notes.append(f"median of {len(runs)} runs by score (seed {chosen.workload.seed}); scores: {scores}")
    return chosen


def write_bench(bench: BenchResult) -> Path:
    assert bench.run_dir is not None
    bench.run_dir.mkdir(parents=True, exist_ok=True)
    path = bench.run_dir / "bench.json"
    path.write_text(json.dumps(bench.to_json(), indent=2) + "\n")
    bench.json_path = path
    return path


def verdict(bench: BenchResult) -> None:
    """SmokeError (exit 4) when the error rate is above the workload's threshold or no token came back."""
    w = bench.workload
    first = next((r.error for r in bench.results if r.error), None)
    if bench.completion_tokens == 0:
        raise SmokeError(
            f"the bench of {bench.url} got no tokens back ({bench.errors} of {bench.attempted} requests failed"
            + (f", {bench.cancelled} cut by the duration limit" if bench.cancelled else "") + ")",
            found=first, hint=f"the per-request errors are in {bench.json_path}" if bench.json_path else None)
    if bench.worst_error_rate > w.max_error_rate:
        counted = (f"{bench.errors} of {bench.attempted} bench requests failed" if bench.error_rate > w.max_error_rate
                   else f"a run of the {len(bench.repeats)} repeats had failed requests")
        raise SmokeError(
            f"{counted} (error rate {bench.worst_error_rate:.1%} > {w.max_error_rate:.1%})", found=first,
            hint="raise --max-error-rate to accept some failures"
            + (f"; the per-request errors are in {bench.json_path}" if bench.json_path else ""))


# --------------------------------------------------------------------------- tables


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) * 1000:,.0f} ms"


def bench_rows(bench: BenchResult) -> list[tuple[str, str]]:
    s = bench.summary()
    cached = "-" if s["cached_tokens"] is None else f"{s['cached_tokens']} ({bench.cache_source})"
    rows = [
        ("requests", f"{s['ok']} ok, {s['errors']} failed" + (f", {s['cancelled']} cut" if s["cancelled"] else "")
         + f" of {s['requests']}  (error rate {s['error_rate']:.1%})"),
        ("tokens", f"{s['prompt_tokens']} prompt, {s['completion_tokens']} generated, cached {cached}"),
        ("wall", f"{s['wall_s']:.2f} s"),
        ("Output TPS", _fmt(s["output_tps"], 2)),
        ("Input TPS", _fmt(s["input_tps"], 2)),
        ("Cache TPS", _fmt(s["cache_tps"], 2)),
        ("score", f"{s['score']:,.1f}  (= {SCORE_OUTPUT_WEIGHT} x out + {SCORE_INPUT_WEIGHT} x in + "
                  f"{SCORE_CACHE_WEIGHT} x cache)"),
        ("TTFT p50 / p95", f"{_ms(s['ttft_p50_s'])} / {_ms(s['ttft_p95_s'])}"),
        ("latency p50 / p95", f"{_ms(s['latency_p50_s'])} / {_ms(s['latency_p95_s'])}"),
        ("time per output token p50", _ms(s["tpot_p50_s"])),
    ]
    if s["short_responses"]:
        rows.append(("short responses", f"{s['short_responses']} answers with another token count than "
                                        f"{bench.workload.output_tokens}"))
    return rows


def _console() -> Any:
    """A rich console; 160 columns when stdout is not a terminal (rich would squeeze tables into 80)."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def print_bench(bench: BenchResult, echo: Log = print, console: Any = None) -> None:
    from rich.table import Table

    title = "bench" + (f" {bench.target}:{bench.profile}" if bench.target else f" {bench.url}")
    if bench.params:
        title += " " + " ".join(f"{k}={v}" for k, v in bench.params.items())
    table = Table(title=title, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in bench_rows(bench):
        table.add_row(name, value)
    (console or _console()).print(table)
    for note in bench.notes:
        echo(f"note: {note}")
    if bench.json_path:
        echo(f"report: {bench.json_path}")


# --------------------------------------------------------------------------- serve + bench


def bench_target(resolved: Any, workload: Workload, *, environ: Mapping[str, str] | None = None,
                 echo: Log = print, port: int | None = None, image: str | None = None,
                 startup_timeout: float | None = None, params: Mapping[str, Any] | None = None) -> BenchResult:
    """Build (or reuse) TARGET:PROFILE, serve it, bench it, always remove the server."""
    from .build import new_run_id
    from .run import serving

    workload.validate()
    environ = os.environ if environ is None else environ
    run_id = new_run_id()
    with serving(resolved, environ=environ, port=port, image=image, run_id=run_id,
                 startup_timeout=startup_timeout, log=echo) as server:
        bench = run_bench(server.url, workload, echo=echo, write=False)
        bench.run_dir = server.run_dir
        bench.target, bench.profile = resolved.target.name, resolved.profile_name
        bench.params = dict(params or {})
        bench.startup_seconds = server.startup_seconds
        if not server.running():
            bench.notes.append(f"the server stopped during the bench: {server.describe_state()}")
        write_bench(bench)
        return bench


def bench_for_cli(manifest: str | None, target: str | None, profile: str | None, sets: Sequence[str], *,
                  url: str | None, workload: Workload, port: int | None = None, echo: Log = print) -> BenchResult:
    """``invoke bench``: against --url, or build + serve + bench + remove TARGET:PROFILE. Exit 4 on failure."""
    from .manifest import load_manifest, manifest_path
    from .resolve import resolve

    workload.validate()
    if url:
        if target or profile or sets:
            raise ConfigError("--url benches a running server: --target, --profile and --set do not apply",
                              hint="drop --url to build, start and stop the target's server")
        path = manifest_path(manifest)
        root = path.resolve().parent if path.exists() else Path.cwd()
        bench = run_bench(url, workload, echo=echo, run_dir=None, write=False)
        bench.run_dir = root / ".imageforge" / "runs" / bench.run_id
        write_bench(bench)
    else:
        m = load_manifest(manifest_path(manifest))
        resolved = resolve(m, target, profile, environ=os.environ, sets=sets)
        bench = bench_target(resolved, workload, echo=echo, port=port)
    print_bench(bench, echo)
    verdict(bench)
    return bench


# --------------------------------------------------------------------------- sweeps


def parse_params(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["max-num-seqs=1,2,4", "env.X=a,b"]`` -> ``[("max-num-seqs", [1, 2, 4]), ("env.X", ["a", "b"])]``.

    Values are read as YAML scalars (like ``--set``); keys keep their order, which is the sweep's order.
    """
    import yaml

    out: list[tuple[str, list[Any]]] = []
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values_text = [v.strip() for v in text.split(",")]
        if not sep or not key or not any(values_text) or not all(values_text):
            raise ConfigError(f"--param: cannot read {item!r}", expected="KEY=V1,V2,..., e.g. max-num-seqs=1,4,8",
                              found=repr(item))
        if key in seen:
            raise ConfigError(f"--param {key} is given twice", hint="list every value in one --param KEY=V1,V2")
        seen.add(key)
        values: list[Any] = []
        for value_text in values_text:
            try:
                value = yaml.safe_load(value_text)
            except yaml.YAMLError:
                value = value_text
            values.append(value_text if isinstance(value, dict | list) or value is None else value)
        out.append((key, values))
    if not out:
        raise ConfigError("a sweep needs at least one --param KEY=V1,V2,...", expected="--param max-num-seqs=1,4,8")
    return out


def combinations(params: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """Every combination, the first parameter varying slowest (itertools.product order)."""
    keys = [k for k, _ in params]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(v for _, v in params))]


def set_args(point: Mapping[str, Any]) -> list[str]:
    """A sweep point as ``--set`` assignments (booleans as YAML ``true``/``false``)."""
    return [f"{k}={'true' if v is True else 'false' if v is False else v}" for k, v in point.items()]


@dataclass
class SweepPoint:
    params: dict[str, Any]
    status: str = "pending"  # ok, failed (bench verdict), no-start, build-error
    error: str | None = None
    summary: dict[str, Any] | None = None
    build: str = ""  # which layers were built
    image_id: str | None = None
    startup_seconds: float | None = None
    bench_json: str | None = None
    scores: list[float] = field(default_factory=list)  # every repeat's score (workload.repeat > 1)
    load: float | None = None  # the host's 1-minute load average when the (median) bench started

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "status": self.status, "error": self.error, "build": self.build,
                "image_id": self.image_id, "startup_seconds": _round(self.startup_seconds, 2),
                "bench_json": self.bench_json, "summary": self.summary, "scores": self.scores, "load": self.load}

    def value(self, key: str) -> float | None:
        if self.status != "ok" or self.summary is None:
            return None
        value = self.summary.get(key)
        return float(value) if isinstance(value, int | float) else None


@dataclass
class SweepResult:
    run_id: str
    target: str
    profile: str
    base_sets: list[str]
    workload: Workload
    points: list[SweepPoint]
    run_dir: Path
    started_at: str
    seconds: float = 0.0

    @property
    def best(self) -> int | None:
        scores = [p.value("score") for p in self.points]
        known = [(s, i) for i, s in enumerate(scores) if s is not None]
        return max(known)[1] if known else None

    @property
    def plateau(self) -> int | None:
        return plateau_index([p.value("output_tps") for p in self.points])

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "target": self.target, "profile": self.profile, "sets": self.base_sets,
            "started_at": self.started_at, "seconds": round(self.seconds, 1), "workload": self.workload.to_json(),
            "score_weights": {"output_tps": SCORE_OUTPUT_WEIGHT, "input_tps": SCORE_INPUT_WEIGHT,
                              "cache_tps": SCORE_CACHE_WEIGHT},
            "plateau_tolerance": PLATEAU_TOLERANCE, "best": self.best, "plateau": self.plateau,
            "points": [p.to_json() for p in self.points],
        }

    def rows(self) -> tuple[list[str], list[list[str]]]:
        keys = list(self.points[0].params) if self.points else []
        ranges = self.workload.repeat > 1
        header = [*keys, "Output TPS", "Input TPS", "Cache TPS", "score", *(["score range"] if ranges else []),
                  "TTFT p95", "latency p95", "errors", "start", "load", "mark"]
        best, plateau = self.best, self.plateau
        rows: list[list[str]] = []
        for i, p in enumerate(self.points):
            s = p.summary or {}
            marks = [m for m, on in (("best score", i == best), ("plateau", i == plateau)) if on]
            if p.status != "ok":
                marks.append(f"{p.status}: {(p.error or '').splitlines()[0][:80]}" if p.error else p.status)
            errors = (f"{s['errors']}/{s['requests']}" + (f", {s['cancelled']} cut" if s.get("cancelled") else "")
                      if s else "-")
            spread = [f"{min(p.scores):,.0f}-{max(p.scores):,.0f}" if p.scores else "-"] if ranges else []
            rows.append([*(str(p.params[k]) for k in keys),
                         _fmt(s.get("output_tps"), 1), _fmt(s.get("input_tps"), 1), _fmt(s.get("cache_tps"), 1),
                         _fmt(s.get("score"), 0), *spread, _ms(s.get("ttft_p95_s")), _ms(s.get("latency_p95_s")),
                         errors,
                         "-" if p.startup_seconds is None else f"{p.startup_seconds:.0f} s", _fmt(p.load, 1),
                         ", ".join(marks)])
        return header, rows

    def markdown(self) -> str:
        header, rows = self.rows()
        w = self.workload
        lines = [
            f"# Sweep {self.target}:{self.profile}  run {self.run_id}",
            "",
            f"{self.started_at}, {self.seconds:.0f} s; workload: {w.requests} requests at concurrency {w.concurrency}, "
            f"prompt {w.prompt_tokens} tokens ({w.prefix_tokens} shared), output {w.output_tokens} tokens, "
            f"api {w.api}, seed {w.seed}" + (f"; median of {w.repeat} runs per point" if w.repeat > 1 else "")
            + (f"; --set {' '.join(self.base_sets)}" if self.base_sets else ""),
            "",
            "| " + " | ".join(header) + " |",
            "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows),
            "",
            f"score = Output TPS x {SCORE_OUTPUT_WEIGHT} + Input TPS x {SCORE_INPUT_WEIGHT} + Cache TPS x "
            f"{SCORE_CACHE_WEIGHT}; plateau = the first point whose Output TPS is within "
            f"{PLATEAU_TOLERANCE:.0%} of the best (none when only the last point is); load = the host's 1-minute "
            f"load average when the bench started ({os.cpu_count()} CPUs here).",
        ]
        return "\n".join(lines) + "\n"

    def write(self) -> tuple[Path, Path]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        json_path = self.run_dir / "sweep.json"
        json_path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        md_path = self.run_dir / "sweep.md"
        md_path.write_text(self.markdown())
        return json_path, md_path


def print_sweep(result: SweepResult, console: Any = None) -> None:
    from rich.table import Table

    header, rows = result.rows()
    table = Table(title=f"sweep {result.target}:{result.profile}")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i >= len(header) - 1 else "right")
    best = result.best
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold green" if i == best else None)
    (console or _console()).print(table)


def sweep_image(resolved: Any) -> Any:
    """``resolved`` with the image name ``<image>-sweep``: sweep points never take the target's own tags.

    Cache keys do not depend on the image name, so every layer below the serving config is shared.
    """
    target = dataclasses.replace(resolved.target, image=f"{resolved.target.image}-sweep")
    return dataclasses.replace(resolved, target=target)


def _first_line(exc: ImageforgeError) -> str:
    text = exc.message
    if exc.found:
        text += f" ({exc.found})"
    if exc.hint:
        text += f"; hint: {exc.hint}"
    return text


@contextlib.contextmanager
def _quiet_log(path: Path) -> Iterator[Log]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        def log(line: str) -> None:
            fh.write(line + "\n")
            fh.flush()

        yield log


def build_note(steps: Sequence[Any]) -> str:
    """``'1 of 10 layers built (serving-config)'`` from a BuildResult's steps."""
    built = [s.id for s in steps if s.cache != "HIT"]
    if not built:
        return f"0 of {len(steps)} layers built (all cached)"
    return f"{len(built)} of {len(steps)} layers built ({', '.join(built)})"


def sweep(manifest: Any, target: str | None, profile: str | None, params: Sequence[tuple[str, Sequence[Any]]],
          workload: Workload, *, sets: Sequence[str] = (), environ: Mapping[str, str] | None = None,
          echo: Log = print, startup_timeout: float | None = None) -> SweepResult:
    """One build + server + bench per combination of ``params``; a point that fails is recorded, not fatal."""
    from .build import build, new_run_id
    from .resolve import resolve

    workload.validate()
    environ = os.environ if environ is None else environ
    points = combinations(params)
    # every combination must resolve before anything starts (unknown keys, wrong types: exit 2 now)
    resolved_points = [sweep_image(resolve(manifest, target, profile, environ=environ, sets=[*sets, *set_args(p)]))
                       for p in points]
    first = resolved_points[0]
    run_id = new_run_id()
    run_dir = first.manifest.root / ".imageforge" / "runs" / run_id
    result = SweepResult(run_id=run_id, target=first.target.name, profile=first.profile_name, base_sets=list(sets),
                         workload=workload, points=[SweepPoint(dict(p)) for p in points], run_dir=run_dir,
                         started_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    seqs = [v for p in points for k, v in p.items() if k.removeprefix("serving.") == "max-num-seqs"
            and isinstance(v, int)]
    if seqs and max(seqs) > workload.concurrency:
        echo(f"note: concurrency {workload.concurrency} < the largest max-num-seqs {max(seqs)}: the client cannot "
             "fill the bigger batches (raise --concurrency)")
    echo(f"sweep {result.target}:{result.profile}: {len(points)} points over "
         f"{', '.join(k for k, _ in params)}  run {run_id}  (images tagged in {first.target.image})")
    t0 = time.monotonic()
    for i, (point, resolved) in enumerate(zip(result.points, resolved_points, strict=True), 1):
        label = " ".join(f"{k}={v}" for k, v in point.params.items())
        echo(f"[{i}/{len(points)}] {label}")
        with _quiet_log(run_dir / f"point-{i}.log") as log:
            try:
                built = build(resolved, environ=environ, echo=log)
            except ImageforgeError as exc:
                point.status, point.error = "build-error", _first_line(exc)
                echo(f"  build failed: {point.error}")
                result.write()
                continue
            point.build, point.image_id = build_note(built.steps), built.image_id
            echo(f"  build: {point.build}")
            try:
                bench = bench_target(resolved, workload, environ=environ, echo=log, image=built.image_id,
                                     startup_timeout=startup_timeout, params=point.params)
            except ImageforgeError as exc:
                point.status, point.error = "no-start", _first_line(exc)
                echo(f"  server failed: {point.error}")
                result.write()
                continue
        point.summary, point.startup_seconds = bench.summary(), bench.startup_seconds
        point.scores = [float(r["score"]) for r in bench.repeats]
        before = bench.host.get("loadavg_before")
        point.load = float(before[0]) if before else None
        point.bench_json = str(bench.json_path) if bench.json_path else None
        try:
            verdict(bench)
            point.status = "ok"
        except SmokeError as exc:
            point.status, point.error = "failed", exc.message
        s = bench.summary()
        echo(f"  ready after {bench.startup_seconds or 0:.0f}s; Output {s['output_tps']:.1f} / Input "
             f"{s['input_tps']:.1f} / Cache {s['cache_tps']:.1f} TPS, score {s['score']:.0f}, errors "
             f"{s['errors']}/{s['requests']}" + (f"  ({point.status}: {point.error})" if point.error else ""))
        result.write()
    result.seconds = time.monotonic() - t0
    result.write()
    return result


def sweep_workload(params: Sequence[tuple[str, Sequence[Any]]], workload: Workload, *,
                   requests_given: bool, concurrency_given: bool) -> Workload:
    """Defaults that make a max-num-seqs sweep meaningful: concurrency = the largest max-num-seqs swept
    (the client can fill every batch), requests = 4 x concurrency (a few batches each)."""
    seqs = [v for k, values in params if k.removeprefix("serving.") == "max-num-seqs" for v in values
            if isinstance(v, int) and not isinstance(v, bool)]
    concurrency = workload.concurrency if concurrency_given or not seqs else max(max(seqs), 1)
    requests = workload.requests if requests_given else max(workload.requests, 4 * concurrency)
    return dataclasses.replace(workload, concurrency=concurrency, requests=requests)


def sweep_for_cli(manifest: str | None, target: str | None, profile: str | None, param_items: Sequence[str],
                  sets: Sequence[str], *, workload: Workload, requests_given: bool = True,
                  concurrency_given: bool = True, echo: Log = print) -> SweepResult:
    """``invoke sweep``: the table, sweep.json and sweep.md; exit 4 when no point produced a result."""
    from .manifest import load_manifest, manifest_path

    params = parse_params(param_items)
    workload = sweep_workload(params, workload, requests_given=requests_given, concurrency_given=concurrency_given)
    m = load_manifest(manifest_path(manifest))
    result = sweep(m, target, profile, params, workload, sets=sets, echo=echo)
    print_sweep(result)
    json_path, md_path = result.write()
    best, plateau = result.best, result.plateau
    if best is not None:
        echo(f"best score: {' '.join(f'{k}={v}' for k, v in result.points[best].params.items())} "
             f"({result.points[best].value('score'):.0f})")
    if plateau is not None:
        echo(f"Output TPS plateau (within {PLATEAU_TOLERANCE:.0%} of the max) from: "
             f"{' '.join(f'{k}={v}' for k, v in result.points[plateau].params.items())}")
    elif sum(1 for p in result.points if p.value("output_tps") is not None) > 1:
        echo(f"no Output TPS plateau within the swept values: the last point is more than {PLATEAU_TOLERANCE:.0%} "
             "above every earlier one (sweep further)")
    echo(f"report: {json_path}  {md_path}  ({result.seconds:.0f}s)")
    if best is None:
        raise SmokeError(f"no point of the sweep produced a result ({len(result.points)} tried)",
                         found="; ".join(f"{p.status}: {p.error}" for p in result.points)[:600],
                         hint=f"each point's build and server log: {result.run_dir}/point-N.log")
    return result


__all__ = [
    "SCORE_CACHE_WEIGHT",
    "SCORE_INPUT_WEIGHT",
    "SCORE_OUTPUT_WEIGHT",
    "BenchResult",
    "RequestResult",
    "SweepPoint",
    "SweepResult",
    "Workload",
    "bench_for_cli",
    "bench_target",
    "combinations",
    "counter_delta",
    "metrics_counters",
    "parse_params",
    "percentile",
    "plateau_index",
    "prompt_words",
    "run_bench",
    "score",
    "sweep",
    "sweep_for_cli",
    "verdict",
    "workload_from_cli",
]
