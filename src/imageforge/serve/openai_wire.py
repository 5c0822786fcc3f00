"""The OpenAI-compatible server's wire formats, for smoke and bench alike.

* :func:`check_url` -- an http(s) URL with a host, or ConfigError (exit 2).
* Streams: server-sent events are decoded by the kept library ``httpx-sse``; :class:`StreamReader` turns
  the events of one OpenAI stream into JSON chunks, notices ``[DONE]`` and what is wrong with the stream
  (data after ``[DONE]``, ``[DONE]`` twice, event data that is not JSON).  :func:`parse_sse` reads a stream
  already received as text (smoke keeps the raw text for its reports); :func:`open_stream` reads one as it
  arrives (bench times the first token; :func:`open_stream_sync`: the same on a blocking ``httpx.Client``, for
  the one-at-a-time replay).  :func:`assemble_stream` rebuilds the non-stream answer from the
  chunks, :func:`comparable_choices` is what "stream == non-stream" compares.
* ``/metrics``: :func:`parse_metrics` reads the Prometheus text format with ``prometheus_client.parser``;
  :func:`metric_value` sums the series of one name whose labels match.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent, aconnect_sse, connect_sse

from ..errors import ConfigError

SSE_CONTENT_TYPE = "text/event-stream"
DONE = "[DONE]"

MetricRow = tuple[str, dict[str, str], float]


def check_url(url: str) -> None:
    """An http(s) URL with a host, or ConfigError (exit 2)."""
    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise ConfigError(f"not a URL: {url!r}", expected="http://HOST:PORT", found=str(exc)) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"not an http URL: {url!r}", expected="http://127.0.0.1:8000")


def short(value: Any, limit: int = 120) -> str:
    """A value for a message: strings quoted, everything else as JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- streams


@dataclass
class StreamReader:
    """The events of one OpenAI stream -> JSON chunks, whether ``[DONE]`` came, and the stream's problems."""

    chunks: list[Any] = field(default_factory=list)
    done: bool = False
    problems: list[str] = field(default_factory=list)

    def feed(self, event: ServerSentEvent) -> Any | None:
        """Read one event; its JSON payload (None for ``[DONE]``, an empty or a broken event)."""
        payload = event.data
        if not payload:
            return None
        if payload.strip() == DONE:
            if self.done:
                self.problems.append(f"{DONE} sent twice")
            self.done = True
            return None
        if self.done:
            self.problems.append(f"data after {DONE}")
        try:
            chunk = json.loads(payload)
        except ValueError:
            self.problems.append(f"event data is not JSON: {short(payload)}")
            return None
        self.chunks.append(chunk)
        return chunk


def parse_sse(text: str) -> tuple[list[Any], bool, list[str]]:
    """A whole stream received as text -> (JSON payloads, saw [DONE], problems)."""
    if text and not text.endswith("\n\n"):
        text += "\n\n"  # the last event counts even when the server did not end it with a blank line
    response = httpx.Response(200, headers={"content-type": SSE_CONTENT_TYPE}, content=text.encode())
    reader = StreamReader()
    for event in EventSource(response).iter_sse():
        reader.feed(event)
    return reader.chunks, reader.done, reader.problems


@contextlib.asynccontextmanager
async def open_stream(client: httpx.AsyncClient, endpoint: str, body: Mapping[str, Any], *,
                      reader: StreamReader | None = None
                      ) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[Any]]]:
    """POST ``body`` to ``endpoint`` as a stream: the response and its JSON chunks as they arrive.

    The chunks end at ``[DONE]``; a 200 answer that is not ``text/event-stream`` raises
    ``httpx_sse.SSEError`` when the chunks are read.  Read the response's body yourself for other statuses.
    ``reader``: a StreamReader of the caller's, to learn afterwards whether ``[DONE]`` came (``reader.done``).
    """
    feeder = reader if reader is not None else StreamReader()
    async with aconnect_sse(client, "POST", endpoint, json=dict(body)) as source:

        async def chunks() -> AsyncIterator[Any]:
            async for event in source.aiter_sse():
                chunk = feeder.feed(event)
                if feeder.done:
                    return
                if chunk is not None:
                    yield chunk

        yield source.response, chunks()


@contextlib.contextmanager
def open_stream_sync(client: httpx.Client, endpoint: str, body: Mapping[str, Any], *,
                     reader: StreamReader | None = None, timeout: httpx.Timeout | None = None
                     ) -> Iterator[tuple[httpx.Response, Iterator[Any]]]:
    """:func:`open_stream` on a blocking client: no event loop (a client that sends one request at a time).

    ``timeout``: this request's, instead of the client's (e.g. a read timeout cut short by a deadline).
    """
    feeder = reader if reader is not None else StreamReader()
    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    with connect_sse(client, "POST", endpoint, json=dict(body), **extra) as source:

        def chunks() -> Iterator[Any]:
            for event in source.iter_sse():
                chunk = feeder.feed(event)
                if feeder.done:
                    return
                if chunk is not None:
                    yield chunk

        yield source.response, chunks()


def assemble_stream(chunks: Sequence[Any], done: bool) -> dict[str, Any]:
    """Chat/completion chunks -> one answer shaped like the non-stream one (plus ``chunks``)."""
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    finish_chunks = 0
    first: Mapping[str, Any] = chunks[0] if chunks and isinstance(chunks[0], Mapping) else {}
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            continue
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            slot = choices.setdefault(index, {"index": index, "finish_reason": None, "_chat": False, "_text": None,
                                              "_content": None, "_reasoning": None, "_role": None, "_tools": {}})
            if choice.get("finish_reason") is not None:
                slot["finish_reason"] = choice["finish_reason"]
                finish_chunks += 1
            if "text" in choice:
                slot["_text"] = (slot["_text"] or "") + (choice.get("text") or "")
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                slot["_chat"] = True
                if delta.get("role"):
                    slot["_role"] = delta["role"]
                if delta.get("content"):
                    slot["_content"] = (slot["_content"] or "") + delta["content"]
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if reasoning:
                    slot["_reasoning"] = (slot["_reasoning"] or "") + reasoning
                for call in delta.get("tool_calls") or []:
                    ti = int(call.get("index", 0))
                    tool = slot["_tools"].setdefault(ti, {"id": None, "type": "function",
                                                          "function": {"name": None, "arguments": ""}})
                    if call.get("id"):
                        tool["id"] = call["id"]
                    fn = call.get("function") or {}
                    if fn.get("name"):
                        tool["function"]["name"] = fn["name"]
                    if fn.get("arguments"):
                        tool["function"]["arguments"] += fn["arguments"]
    out_choices: list[dict[str, Any]] = []
    for index in sorted(choices):
        slot = choices[index]
        item: dict[str, Any] = {"index": index, "finish_reason": slot["finish_reason"]}
        if slot["_chat"]:
            message: dict[str, Any] = {"role": slot["_role"], "content": slot["_content"],
                                       "reasoning": slot["_reasoning"]}
            tools = [slot["_tools"][k] for k in sorted(slot["_tools"])]
            message["tool_calls"] = tools
            item["message"] = message
        else:
            item["text"] = slot["_text"] or ""
        out_choices.append(item)
    return {
        "id": first.get("id"),
        "object": first.get("object"),
        "model": first.get("model"),
        "choices": out_choices,
        "usage": usage,
        "chunks": list(chunks),
        "done": done,
        "finish_reason_chunks": finish_chunks,
    }


def comparable_choices(body: Any) -> list[dict[str, Any]]:
    """What stream == non-stream compares: per choice text/content, reasoning, tool calls, finish."""
    out: list[dict[str, Any]] = []
    choices = body.get("choices") if isinstance(body, Mapping) else None
    for choice in choices or []:
        item: dict[str, Any] = {"index": choice.get("index"), "finish_reason": choice.get("finish_reason")}
        message = choice.get("message")
        if isinstance(message, Mapping):
            item["content"] = message.get("content") or ""
            item["reasoning"] = message.get("reasoning") or message.get("reasoning_content") or ""
            item["tool_calls"] = [
                {"name": (t.get("function") or {}).get("name"), "arguments": (t.get("function") or {}).get("arguments")}
                for t in message.get("tool_calls") or []
            ]
        else:
            item["text"] = choice.get("text") or ""
        out.append(item)
    return out


# --------------------------------------------------------------------------- /metrics


def parse_metrics(text: str) -> list[MetricRow]:
    """Prometheus text format -> (name, labels, value) rows, one per sample.

    Raises ValueError for text that is not the Prometheus format (the hand-written parser this replaces
    skipped such lines; vLLM's exporter never writes them).
    """
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def metric_value(rows: Sequence[tuple[str, Mapping[str, str], float]], name: str,
                 labels: Mapping[str, str] | None = None) -> float | None:
    """Sum of the series called ``name`` whose labels include ``labels`` (None: no such series)."""
    total: float | None = None
    for row_name, row_labels, value in rows:
        if row_name != name:
            continue
        if labels and any(row_labels.get(k) != v for k, v in labels.items()):
            continue
        total = (total or 0.0) + value
    return total


__all__ = [
    "DONE",
    "SSE_CONTENT_TYPE",
    "MetricRow",
    "StreamReader",
    "assemble_stream",
    "check_url",
    "comparable_choices",
    "metric_value",
    "open_stream",
    "parse_metrics",
    "parse_sse",
]
