"""The evaluator's replay, loading: a user's own JSONL of chat requests, and the token counters.

* :func:`load_jsonl` -- a replay dataset in either format, told apart by content: imageforge's (one OpenAI
  chat-completions body per line; an optional ``"_replay"`` object is metadata, never sent) or the evaluator
  harness's matched requests (``request_id`` + ``request_body`` as JSON text); validated line by line, a bad
  line is a ConfigError naming ``file:line`` and what was expected.
* :func:`server_counter` (the server's ``/tokenize``): the
  :data:`.replay_workload.TokenCounter` the generator measures its lengths with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ..errors import ConfigError, ErrorCollector, Location, Problem, SmokeError
from .replay_workload import META_KEY, ReplayRequest, TokenCounter

# --------------------------------------------------------------------------- the loader

_ROLES = ("system", "user", "assistant", "tool", "developer")


def _check_body(body: Any) -> list[Problem]:
    """Problems of one chat request body (key paths relative to the line)."""
    problems: list[Problem] = []

    def bad(key: str, message: str, expected: str | None = None, found: Any = None) -> None:
        problems.append(Problem(message, key_path=key, expected=expected,
                                found=None if found is None else json.dumps(found, ensure_ascii=False)[:120]))

    if not isinstance(body, dict):
        bad("", "a line must be a JSON object (an OpenAI chat-completions request body)", "{...}", body)
        return problems
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        bad("messages", "needs a non-empty list of messages", "[{\"role\": ..., \"content\": ...}]",
            messages if messages is not None else "missing")
        return problems
    for i, msg in enumerate(messages):
        key = f"messages[{i}]"
        if not isinstance(msg, dict):
            bad(key, "a message must be an object", "{\"role\": ..., \"content\": ...}", msg)
            continue
        role = msg.get("role")
        if role not in _ROLES:
            bad(f"{key}.role", "unknown or missing role", " | ".join(_ROLES), role if role is not None else "missing")
        content = msg.get("content")
        if content is None and not (role == "assistant" and msg.get("tool_calls")):
            bad(f"{key}.content", "missing content (only an assistant message with tool_calls may omit it)")
        elif content is not None and not isinstance(content, str | list):
            bad(f"{key}.content", "content must be a string or a list of parts", "string | list", content)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)):
        bad("tools", "tools must be a list of {\"type\": \"function\", \"function\": {...}}", found=tools)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            bad(name, f"{name} must be a positive integer", ">= 1", value)
    meta = body.get(META_KEY)
    if meta is not None and not isinstance(meta, dict):
        bad(META_KEY, "the replay metadata must be an object", found=meta)
    return problems


#: The two dataset formats, told apart by each line's content.
FORMAT_CHAT = "chat-request"  # imageforge's own: one chat-completions body per line (+ optional "_replay")
FORMAT_MATCHED = "matched-request"  # the harness's: {"request_id": ..., "request_body": "<JSON text>", ...}
EXPECTED_LINE = ("a chat-completions body {\"messages\": [...], ...} (imageforge's format) or the evaluator "
                 "harness's matched request {\"request_id\": ..., \"request_body\": \"{...}\", ...}")


def line_format(data: Any) -> str | None:
    """Which format one parsed line is in: a ``request_body`` key makes it the harness's, ``messages`` ours."""
    if not isinstance(data, dict):
        return None
    if "request_body" in data:
        return FORMAT_MATCHED
    if "messages" in data:
        return FORMAT_CHAT
    return None


def _matched_body(data: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Problem], dict[str, Any]]:
    """A harness line -> (the chat body it replays, problems, metadata kept from the line)."""
    problems: list[Problem] = []
    raw = data.get("request_body")
    request_id = data.get("request_id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        problems.append(Problem("a matched request needs its request_id", key_path="request_id",
                                expected="a string", found=json.dumps(request_id)[:120]))
    if not isinstance(raw, str):
        problems.append(Problem("request_body must be the request's JSON text (a string)", key_path="request_body",
                                expected="a string of JSON text", found=json.dumps(raw)[:120]))
        return None, problems, {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        problems.append(Problem(f"request_body is not JSON: {exc.msg}", key_path="request_body",
                                expected="a chat-completions body as JSON text", found=raw[:120]))
        return None, problems, {}
    for p in _check_body(body):
        key = f"request_body.{p.key_path}" if p.key_path else "request_body"
        problems.append(Problem(p.message, key_path=key, expected=p.expected, found=p.found, hint=p.hint))
    meta = {"request_id": str(request_id), "format": FORMAT_MATCHED}
    for key in ("timestamp", "source_file", "line_no"):
        if data.get(key) is not None:
            meta[key] = data[key]
    return body if isinstance(body, dict) else None, problems, meta


def load_jsonl(path: Path) -> list[ReplayRequest]:
    """The requests of a replay dataset, one JSON object per line (blank lines skipped); every bad line reported.

    Two formats, told apart by content (the first request line decides, every line must then be in it):

    * imageforge's: an OpenAI chat-completions body (``messages`` at least); ``model``, ``stream`` and
      ``stream_options`` are set by the runner; an optional ``"_replay"`` object is metadata;
    * the evaluator harness's matched requests (``modelsphere/llm-bench``, ``log_replay_tool.py extract``):
      ``request_id`` and ``request_body``, the body as JSON *text*; the other keys (``source_file``,
      ``line_no``, ``timestamp``, ``request_json``, ...) are kept or ignored.  The body is replayed as the
      harness replays it (its model replaced by the served one; streamed, with usage).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"replay file {path} does not exist",
                          hint="write one with `invoke bench --replay --replay-out FILE`, or give a JSONL of chat "
                          "requests") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read replay file {path}: {exc}") from None
    collector = ErrorCollector()
    out: list[ReplayRequest] = []
    chosen: tuple[str, int] | None = None  # the format and the line that decided it
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = Location(str(path), number)
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            collector.add(Problem(f"not JSON: {exc.msg}", location=Location(str(path), number, exc.colno),
                                  expected=EXPECTED_LINE))
            continue
        kind = line_format(data)
        if kind is None:
            found = (f"an object with keys {sorted(data)[:8]}" if isinstance(data, dict)
                     else f"a JSON {type(data).__name__}")
            collector.add(Problem("not a replay request", location=where, expected=EXPECTED_LINE, found=found))
            continue
        if chosen is None:
            chosen = (kind, number)
        elif kind != chosen[0]:
            collector.add(Problem(f"a {kind} line in a {chosen[0]} file (line {chosen[1]} decided the format)",
                                  location=where, expected=f"every line a {chosen[0]}"))
            continue
        if kind == FORMAT_MATCHED:
            body, problems, meta = _matched_body(data)
        else:
            problems = _check_body(data)
            body, meta = data, None
        for p in problems:
            collector.add(Problem(p.message, location=where, key_path=p.key_path, expected=p.expected,
                                  found=p.found, hint=p.hint))
        if problems or body is None:
            continue
        if kind == FORMAT_CHAT:
            meta = body.pop(META_KEY, None)
        out.append(ReplayRequest(body, meta, where))
    collector.raise_if_any(f"invalid replay file {path}")
    if not out:
        raise ConfigError(f"replay file {path} holds no request", location=Location(str(path)),
                          expected=EXPECTED_LINE)
    return out


def dataset_format(requests: Sequence[ReplayRequest]) -> str:
    """The format the requests were read in (generated workloads are imageforge's)."""
    first = requests[0].meta if requests else None
    return FORMAT_MATCHED if isinstance(first, dict) and first.get("format") == FORMAT_MATCHED else FORMAT_CHAT


# --------------------------------------------------------------------------- token counters


def server_counter(url: str, model: str, *, timeout: float = 30.0, transport: Any = None) -> TokenCounter:
    """A counter that asks the server's ``/tokenize`` (vLLM), caching each text's count."""
    client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout, transport=transport)
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if not text:
            return 0
        if text not in cache:
            try:
                response = client.post("/tokenize", json={"model": model, "prompt": text,
                                                          "add_special_tokens": False})
            except httpx.HTTPError as exc:
                raise SmokeError(f"POST {url}/tokenize failed", found=f"{type(exc).__name__}: {exc}") from None
            if response.status_code != 200:
                raise SmokeError(f"POST {url}/tokenize answered HTTP {response.status_code}",
                                 found=response.text[:300], hint="give --tokenizer tokenizer.json instead")
            cache[text] = int(response.json()["count"])
        return cache[text]

    return count
