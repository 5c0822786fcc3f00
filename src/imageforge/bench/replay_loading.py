"""The evaluator's replay, loading: a user's own JSONL of chat requests, and the token counters.

* :func:`load_jsonl` -- one OpenAI chat-completions body per line, validated line by line: a bad line is a
  ConfigError naming ``file:line``; an optional ``"_replay"`` object is metadata, never sent.
* :func:`server_counter` (the server's ``/tokenize``): the :data:`.replay_workload.TokenCounter` the generator
  measures its lengths with.
"""

from __future__ import annotations

import json
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


def load_jsonl(path: Path) -> list[ReplayRequest]:
    """Chat requests from ``path``, one JSON object per line (blank lines skipped); every bad line reported.

    A line is an OpenAI chat-completions body (``messages`` at least); ``model``, ``stream`` and
    ``stream_options`` are set by the runner; an optional ``"_replay"`` object is metadata.
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
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = Location(str(path), number)
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            collector.add(Problem(f"not JSON: {exc.msg}", location=Location(str(path), number, exc.colno)))
            continue
        problems = _check_body(data)
        for p in problems:
            collector.add(Problem(p.message, location=where, key_path=p.key_path, expected=p.expected,
                                  found=p.found, hint=p.hint))
        if problems:
            continue
        meta = data.pop(META_KEY, None)
        out.append(ReplayRequest(data, meta, where))
    collector.raise_if_any(f"invalid replay file {path}")
    if not out:
        raise ConfigError(f"replay file {path} holds no request", location=Location(str(path)),
                          hint="one JSON chat request per line")
    return out


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
