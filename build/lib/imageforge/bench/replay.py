"""The evaluator's replay, rehearsed: a seeded agent-like workload, a loader for your own, a one-at-a-time runner.

Over 600 lines: the workload generator, the JSONL loader and the runner share one request model; kept together.

* :func:`generate` -- streamed chat requests shaped like the evaluator's 881 (facts note, "The evaluator"):
  agent *sessions* whose later turns extend the earlier ones (the prefix cache serves the shared part; about
  65 % of the input tokens, token-weighted), tools on ~78 % of the requests, several system messages on a few,
  input:output ~60:1, ~18 % with ``max_completion_tokens`` and ~1 % with ``reasoning_effort``.  Lengths are in
  tokens of the target's tokenizer (a :data:`TokenCounter`: the server's ``/tokenize`` or a ``tokenizer.json``)
  and scale with the target's max-model-len (the evaluator's mean input is 25.7 % of the baseline's 100K).
  The same spec and counter give a byte-identical JSONL (:func:`write_jsonl`).
* :func:`load_jsonl` -- a user's own JSONL of chat requests (one OpenAI chat-completions body per line),
  validated line by line: a bad line is a ConfigError naming ``file:line``.
* :func:`run_replay` -- sends them **one at a time** (concurrency 1) through the bench's request loop
  (:func:`.client.stream_request`, httpx-sse) to an
  OpenAI-compatible server and records, per request, TTFT, total time, prompt / cached / completion tokens
  (``stream_options.include_usage``), the status and the evaluator's error class (:mod:`.evaluator`).
  It stops after a request count or a duration, whichever comes first, and talks only to the URL it is given.

A line may carry a ``"_replay"`` object (the generator writes one: session, turn, planned token counts); it is
metadata, never sent.  With ``planned_output`` (the default: random weights never stop by themselves) a request
that carries no ``max_tokens`` / ``max_completion_tokens`` gets ``max_tokens`` = its planned output length.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime as _dt
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ErrorCollector, Location, Problem, SmokeError
from .client import stream_request
from .evaluator import ErrorClass, EvalReport, RequestRecord, classify_error, evaluate
from .workload import bound_problems

#: Counts the tokens of a text (no special tokens).
TokenCounter = Callable[[str], int]
Log = Callable[[str], None]

META_KEY = "_replay"
CHAT_ENDPOINT = "/v1/chat/completions"

# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class ReplaySpec:
    """What :func:`generate` makes. Fractions are of requests unless said otherwise; lengths scale with
    ``max_model_len`` (tokens)."""

    requests: int = 64
    max_model_len: int = 2048
    seed: int = 0
    model: str = "llm"  # the evaluator's served name; the runner sends the server's own
    tools_fraction: float = 0.78  # 690 of 881
    multi_system_fraction: float = 0.04  # 34 of 881
    max_completion_fraction: float = 0.18  # 162 of 881 carried max_completion_tokens
    reasoning_effort_fraction: float = 0.01  # "a few" (2 of 881 were rejected for it)
    input_output_ratio: float = 60.0
    mean_input_fraction: float = 0.257  # mean input / max-model-len (25.7K of the baseline's 100K)
    max_input_fraction: float = 0.85  # no prompt above this share of max-model-len (room for template + output)

    def validate(self) -> ReplaySpec:
        problems = bound_problems(self, at_least={"requests": 1, "input_output_ratio": 1},
                                  fractions=("tools_fraction", "multi_system_fraction", "max_completion_fraction",
                                             "reasoning_effort_fraction"))
        if self.max_model_len < 256:
            problems.append(f"max-model-len must be >= 256 tokens (got {self.max_model_len})")
        if not 0.0 < self.mean_input_fraction < self.max_input_fraction <= 1.0:
            problems.append("need 0 < mean input fraction < max input fraction <= 1 "
                            f"(got {self.mean_input_fraction}, {self.max_input_fraction})")
        if problems:
            raise ConfigError("invalid replay spec: " + "; ".join(problems))
        return self

    @property
    def max_input(self) -> int:
        return int(self.max_model_len * self.max_input_fraction)

    @property
    def mean_input(self) -> float:
        return self.max_model_len * self.mean_input_fraction


@dataclass(frozen=True)
class ReplayRequest:
    """One chat request to replay: the body as sent (less the model and stream fields the runner sets),
    the generator's metadata (or None) and where it came from."""

    body: dict[str, Any]
    meta: dict[str, Any] | None = None
    source: Location | None = None

    def to_line(self) -> str:
        data = dict(self.body)
        if self.meta is not None:
            data[META_KEY] = self.meta
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"

    @property
    def planned_input(self) -> int | None:
        value = (self.meta or {}).get("input_tokens")
        return value if isinstance(value, int) else None

    @property
    def planned_output(self) -> int | None:
        value = (self.meta or {}).get("output_tokens")
        return value if isinstance(value, int) else None


# --------------------------------------------------------------------------- text of a given token length

# Agent traffic: prose, code and paths. Fixed, so a workload is reproducible from its seed alone.
_VOCABULARY = """
the a of and to in is for on with that this be or it as at by from not are was can will if then else return
def class import self None True False async await yield lambda raise try except finally while for in range
file path src tests main config build run test error value result request response server client cache token
model layer batch queue engine kernel memory block prefix decode prefill stream score weight latency output
input device thread sequence context window tensor expert router patch overlay step profile target image
function method module package object string integer list dict set tuple args kwargs default option flag
read write open close start stop check parse load save update delete create find replace split join format
user assistant system tool call name arguments content message role reasoning answer question task plan
src/app.py src/util.py tests/test_app.py README.md setup.cfg pyproject.toml Makefile docker-compose.yml
{ } ( ) [ ] : ; , . = == != <= >= + - * / -> => # // /* */ 0 1 2 3 4 8 16 32 64 128 256 512 1024
"""
_WORDS = tuple(dict.fromkeys(_VOCABULARY.split()))
_TOOL_NAMES = ("read_file", "write_file", "run_shell", "search_code", "list_dir", "apply_patch", "web_fetch",
               "run_tests", "git_diff", "ask_user", "get_weather", "query_db")


TURNS_MEAN = 1.5  # turns per session: 1 + an exponential draw (mostly short sessions, a few long ones)
TURNS_MAX = 24
TASK = (0.04, 0.10)  # the first user message, share of max-model-len
GROW = (0.04, 0.14)  # what each later turn adds (a tool result or a user message)


def _turns(rng: random.Random) -> int:
    return min(TURNS_MAX, 1 + int(rng.expovariate(1 / TURNS_MEAN)))


class _Text:
    """Deterministic word streams, each cut to an exact token count by the counter."""

    def __init__(self, seed: int, count: TokenCounter) -> None:
        self.seed = seed
        self.count = count

    def words(self, label: str, n: int) -> list[str]:
        rng = random.Random(f"imageforge-replay:{self.seed}:{label}")
        return [rng.choice(_WORDS) for _ in range(n)]

    def tokens(self, label: str, n: int) -> tuple[str, int]:
        """The longest prefix of ``label``'s word stream with at most ``n`` tokens, and its token count.

        The stream is fixed by (seed, label), so the first k words never depend on n: a binary search over k.
        """
        if n <= 0:
            return "", 0
        hi = max(8, n)
        words = self.words(label, hi)
        while self.count(" ".join(words)) < n:
            hi *= 2
            if hi > 64 * n + 64:
                raise ConfigError(f"the tokenizer gives too few tokens for {n}: is the counter right?")
            words = self.words(label, hi)
        lo, best = 0, ("", 0)
        high = hi
        while lo <= high:
            mid = (lo + high) // 2
            text = " ".join(words[:mid])
            got = self.count(text) if mid else 0
            if got <= n:
                best = (text, got)
                lo = mid + 1
            else:
                high = mid - 1
        return best


class _Quota:
    """Spreads a fraction evenly over a sequence of decisions (error diffusion): exact shares for any N."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.done = 0.0
        self.taken = 0

    def take(self, weight: int = 1) -> bool:
        """Whether the next ``weight`` requests (one session, say) get the feature."""
        want = (self.done + weight) * self.fraction
        # take it when that brings the share closer to the target than leaving it
        take = abs(self.taken + weight - want) < abs(self.taken - want)
        self.done += weight
        if take:
            self.taken += weight
        return take

    def settle(self, planned: int, actual: int, taken: bool) -> None:
        """A session planned for ``planned`` requests gave ``actual``: count what really happened."""
        self.done += actual - planned
        if taken:
            self.taken += actual - planned


# --------------------------------------------------------------------------- the generator


def _tool_schema(name: str, text: _Text, label: str, description_tokens: int) -> tuple[dict[str, Any], int]:
    description, used = text.tokens(label, description_tokens)
    schema = {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}}}
    return schema, used


@dataclass
class _Kind:
    """An agent kind: its system prompt and tool set, shared by every session of that kind."""

    system: str
    system_tokens: int
    tools: list[dict[str, Any]]
    tools_tokens: int


def generate(spec: ReplaySpec, count: TokenCounter) -> list[ReplayRequest]:
    """``spec.requests`` chat requests in replay order (sessions one after another), lengths in ``count``'s tokens.

    Layout, lengths as shares of max-model-len M (times ``mean_input_fraction / 0.257``): 4 agent kinds, each a
    system prompt (2-4 % M) and a tool set (4-6 tools) shared by all its sessions; a session starts with a task
    (:data:`TASK`) and each later turn appends the previous answer (a tool call with the planned output's
    length, or text) and a tool result or user message (:data:`GROW`); sessions have 1 + Exp(mean
    :data:`TURNS_MEAN`) turns, cut where the next prompt would pass ``max_input_fraction``.  Turn k starts with
    every token of turn k-1: the token-weighted prefix reuse (``stats()['designed_prefix_reuse']``, ~0.65 at
    M=2048) and the mean input (~0.26 M) were tuned on 881 requests; the tail reaches ~0.8 M.
    """
    spec = spec.validate()
    rng = random.Random(f"imageforge-replay-plan:{spec.seed}")
    text = _Text(spec.seed, count)
    m = spec.max_model_len
    scale = spec.mean_input_fraction / ReplaySpec.mean_input_fraction  # the layout below gives the default mean
    kinds: list[_Kind] = []
    for k in range(4):
        system, sys_tokens = text.tokens(f"kind{k}/system", max(8, round(m * scale * rng.uniform(0.02, 0.04))))
        tools: list[dict[str, Any]] = []
        names = rng.sample(_TOOL_NAMES, rng.randint(4, 6))
        for t, name in enumerate(names):
            schema, _ = _tool_schema(name, text, f"kind{k}/tool{t}", max(4, round(m * scale * 0.008)))
            tools.append(schema)
        tools_tokens = count(json.dumps(tools, ensure_ascii=False))
        kinds.append(_Kind(system, sys_tokens, tools, tools_tokens))

    tools_quota = _Quota(spec.tools_fraction)
    multi_quota = _Quota(spec.multi_system_fraction)
    mct_quota = _Quota(spec.max_completion_fraction)
    effort_quota = _Quota(spec.reasoning_effort_fraction)
    seen_heads: set[tuple[int, bool]] = set()
    out: list[ReplayRequest] = []
    session = 0
    while len(out) < spec.requests:
        planned_turns = min(spec.requests - len(out), _turns(rng))
        kind_i = rng.randrange(len(kinds))
        kind = kinds[kind_i]
        with_tools = tools_quota.take(planned_turns)
        multi_system = multi_quota.take(planned_turns)
        label = f"s{session}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": kind.system}]
        tokens = kind.system_tokens + (kind.tools_tokens if with_tools else 0)
        # the system prompt (and tools) of a kind already sent is in the cache: the first turn's shared part
        shared = tokens if (kind_i, with_tools) in seen_heads else 0
        seen_heads.add((kind_i, with_tools))
        task, task_tokens = text.tokens(f"{label}/task", round(m * scale * rng.uniform(*TASK)))
        messages.append({"role": "user", "content": task})
        tokens += task_tokens
        if multi_system:
            extra, _ = text.tokens(f"{label}/system2", max(8, round(m * scale * 0.02)))
            content = "Environment: " + extra
            messages.append({"role": "system", "content": content})
            tokens += count(content)
        made = 0
        for turn in range(planned_turns):
            if turn:
                previous = out[-1].meta or {}
                answer_tokens = int(previous.get("output_tokens") or 1)
                shared = int(previous.get("input_tokens") or 0)
                grow = round(m * scale * rng.uniform(*GROW))
                if with_tools:
                    name = kind.tools[rng.randrange(len(kind.tools))]["function"]["name"]
                    arg, _ = text.tokens(f"{label}/t{turn}/arg", answer_tokens)
                    call_id = f"call_{session}_{turn}"
                    arguments = json.dumps({"path": arg}, ensure_ascii=False)
                    messages.append({"role": "assistant", "content": None, "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})
                    result, result_tokens = text.tokens(f"{label}/t{turn}/result", grow)
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
                    tokens += count(arguments) + result_tokens
                else:
                    reply, reply_tokens = text.tokens(f"{label}/t{turn}/reply", answer_tokens)
                    messages.append({"role": "assistant", "content": reply})
                    follow, follow_tokens = text.tokens(f"{label}/t{turn}/user", grow)
                    messages.append({"role": "user", "content": follow})
                    tokens += reply_tokens + follow_tokens
            planned_out = max(1, round(tokens / spec.input_output_ratio * rng.uniform(0.5, 1.5)))
            if tokens + planned_out > spec.max_input:
                break
            body: dict[str, Any] = {"model": spec.model, "messages": copy.deepcopy(messages), "stream": True,
                                    "stream_options": {"include_usage": True}}
            if with_tools:
                body["tools"] = copy.deepcopy(kind.tools)
                body["tool_choice"] = "auto"
            if mct_quota.take():
                body["max_completion_tokens"] = planned_out
            if effort_quota.take():
                body["reasoning_effort"] = ("low", "medium", "high")[rng.randrange(3)]
            meta = {"session": session, "turn": turn, "input_tokens": tokens, "output_tokens": planned_out,
                    "shared_tokens": min(shared, tokens)}
            out.append(ReplayRequest(body, meta))
            made += 1
        if made == 0 and not out and session > 32:
            raise ConfigError("no request fits max-model-len with this spec", hint="lower mean_input_fraction")
        tools_quota.settle(planned_turns, made, with_tools)
        multi_quota.settle(planned_turns, made, multi_system)
        session += 1
    return out


def write_jsonl(requests: Iterable[ReplayRequest], path: Path) -> Path:
    """One request per line (compact JSON, UTF-8, ``\\n``): the same requests always give the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for request in requests:
            fh.write(request.to_line())
    return path


def stats(requests: Sequence[ReplayRequest]) -> dict[str, Any]:
    """What a workload looks like, in the evaluator's terms (planned counts: message text only, no template)."""
    n = len(requests)
    planned = [r.planned_input for r in requests if r.planned_input is not None]
    outputs = [r.planned_output for r in requests if r.planned_output is not None]
    shared = sum(int((r.meta or {}).get("shared_tokens") or 0) for r in requests)

    def share(pred: Callable[[ReplayRequest], bool]) -> int:
        return sum(1 for r in requests if pred(r))

    return {
        "requests": n,
        "with_tools": share(lambda r: bool(r.body.get("tools"))),
        "several_system_messages": share(
            lambda r: sum(1 for m in r.body["messages"] if m.get("role") == "system") > 1),
        "max_completion_tokens": share(lambda r: "max_completion_tokens" in r.body),
        "reasoning_effort": share(lambda r: "reasoning_effort" in r.body),
        "sessions": len({(r.meta or {}).get("session") for r in requests if r.meta}),
        "input_tokens_mean": round(sum(planned) / len(planned), 1) if planned else None,
        "input_tokens_max": max(planned) if planned else None,
        "output_tokens_mean": round(sum(outputs) / len(outputs), 1) if outputs else None,
        "input_output_ratio": round(sum(planned) / sum(outputs), 1) if planned and outputs and sum(outputs) else None,
        "designed_prefix_reuse": round(shared / sum(planned), 4) if planned and sum(planned) else None,
    }


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


def tokenizer_counter(tokenizer_json: Path) -> TokenCounter:
    """A counter from a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library), no special tokens."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as exc:  # tokenizers raises its own Exception types
        raise ConfigError(f"cannot load tokenizer {tokenizer_json}: {exc}") from None

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids) if text else 0

    return count


def server_counter(url: str, model: str, *, timeout: float = 30.0, transport: Any = None) -> TokenCounter:
    """A counter that asks the server's ``/tokenize`` (vLLM), caching each text's count."""
    import httpx

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


# --------------------------------------------------------------------------- the runner


@dataclass
class ReplayRun:
    """A finished replay: records in send order, plus where and how it ran."""

    url: str
    model: str
    started_at: str
    wall_s: float
    records: list[RequestRecord]
    stopped_by: str  # "all requests", "request count", "duration"
    planned_output: bool
    host: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> EvalReport:
        return evaluate(self.records)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "started_at": self.started_at,
                "wall_s": round(self.wall_s, 3), "stopped_by": self.stopped_by, "concurrency": 1,
                "planned_output": self.planned_output, "host": self.host, "report": self.report.to_json(),
                "requests": [r.to_json() for r in self.records]}


def prepare_body(request: ReplayRequest, model: str, *, planned_output: bool) -> dict[str, Any]:
    """The body actually sent: the served model, streamed with usage, and (``planned_output``) a max_tokens."""
    body = copy.deepcopy(request.body)
    body["model"] = model
    body["stream"] = True
    options = body.get("stream_options")
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if (planned_output and request.planned_output is not None
            and "max_tokens" not in body and "max_completion_tokens" not in body):
        body["max_tokens"] = request.planned_output
    return body


async def send_one(client: Any, index: int, body: dict[str, Any], *,
                   planned_input: int | None = None) -> RequestRecord:
    """POST one streamed chat request and measure it (``client``: an ``httpx.AsyncClient`` on the server),
    through the bench's one request loop (:func:`.client.stream_request`)."""
    got = await stream_request(client, CHAT_ENDPOINT, body)
    completed = got.done and got.error_text is None and got.exception is None
    error_class: ErrorClass | None = classify_error(got.status, got.error_text, got.exception, completed=completed)
    error = None
    if error_class is not None:
        error = (f"{type(got.exception).__name__}: {got.exception}" if got.exception is not None
                 else (got.error_text or "the stream ended without [DONE]"))[:300]
    return RequestRecord(index=index, status=got.status, error_class=error_class, error=error,
                         ttft_s=got.ttft, total_s=got.total, prompt_tokens=got.prompt_tokens,
                         completion_tokens=got.completion_tokens, cached_tokens=got.cached_tokens,
                         input_tokens_planned=planned_input)


def discover_model(url: str, model: str | None = None, *, transport: Any = None) -> tuple[str, int | None]:
    """The served model (``model`` if listed, else the first) and its max_model_len (vLLM lists it)."""
    import httpx

    try:
        with httpx.Client(transport=transport, timeout=15.0) as client:
            response = client.get(url.rstrip("/") + "/v1/models")
    except httpx.HTTPError as exc:
        raise SmokeError(f"no server answers at {url}", found=f"{type(exc).__name__}: {exc}",
                         hint="start one with `invoke run --target T` (it prints URL=...)") from None
    try:
        entries = response.json()["data"]
        entry = next((e for e in entries if e["id"] == model), entries[0])
    except (ValueError, KeyError, IndexError, TypeError):
        raise SmokeError(f"GET {url}/v1/models lists no model", found=response.text[:300]) from None
    limit = entry.get("max_model_len")
    return str(entry["id"]), int(limit) if isinstance(limit, int) else None


def run_replay(requests: Sequence[ReplayRequest], url: str, *, model: str | None = None,
               max_requests: int | None = None, duration: float = 3600.0, timeout: float = 1000.0,
               planned_output: bool = True, log: Log | None = None, transport: Any = None) -> ReplayRun:
    """Send ``requests`` one at a time; stop after ``max_requests`` or once ``duration`` seconds have passed.

    ``timeout`` bounds each request (the evaluator's redline is a total-time p99 of 999,999 ms); the duration
    is checked between requests, so the last one may run past it by at most ``timeout``.
    """
    import httpx

    if duration <= 0 or timeout <= 0:
        raise ConfigError("duration and timeout must be > 0")
    if max_requests is not None and max_requests < 1:
        raise ConfigError(f"max requests must be >= 1 (got {max_requests})")
    served, _ = discover_model(url, model, transport=transport)
    limit = len(requests) if max_requests is None else min(max_requests, len(requests))
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    load_before = _loadavg()
    records: list[RequestRecord] = []
    stopped_by = "all requests" if limit == len(requests) else "request count"
    begin = time.monotonic()

    async def loop() -> str:
        async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=httpx.Timeout(timeout, connect=10.0),
                                     transport=transport) as client:
            for i, request in enumerate(requests[:limit]):
                if time.monotonic() - begin >= duration:
                    return "duration"
                body = prepare_body(request, served, planned_output=planned_output)
                record = await send_one(client, i, body, planned_input=request.planned_input)
                records.append(record)
                if log is not None:
                    state = "ok" if record.ok else f"{record.error_class} ({record.error})"
                    ttft = "-" if record.ttft_s is None else f"{record.ttft_s:.3f}s"
                    log(f"  [{i + 1}/{limit}] {state}: prompt {record.prompt_tokens} (cached "
                        f"{record.cached_tokens}), out {record.completion_tokens}, ttft {ttft}, "
                        f"total {record.total_s or 0:.3f}s")
        return stopped_by

    stopped_by = asyncio.run(loop())
    return ReplayRun(url=url, model=served, started_at=started_at, wall_s=time.monotonic() - begin,
                     records=records, stopped_by=stopped_by, planned_output=planned_output,
                     host={"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": _loadavg()})


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


# --------------------------------------------------------------------------- invoke bench --replay


@dataclass(frozen=True)
class ReplayOptions:
    """What ``invoke bench --replay [FILE]`` asks for."""

    file: Path | None = None  # a user's JSONL; None: generate one
    out: Path | None = None  # where the generated JSONL goes (default: the run directory's replay.jsonl)
    requests: int = 32  # generated requests (a user's file: stop after this many, 0: all)
    seed: int = 0
    max_model_len: int | None = None  # default: the server's (/v1/models), else the target's serving args
    planned_output: bool = True
    duration: float = 3600.0
    timeout: float = 1000.0
    max_error_rate: float = 0.0
    require_targets: bool = False  # exit 4 when a target line does not PASS

    def validate(self) -> ReplayOptions:
        problems = []
        if self.requests < 0:
            problems.append(f"requests must be >= 0 (got {self.requests})")
        if self.max_model_len is not None and self.max_model_len < 256:
            problems.append(f"max-model-len must be >= 256 (got {self.max_model_len})")
        if self.duration <= 0 or self.timeout <= 0:
            problems.append("duration and timeout must be > 0")
        if not 0.0 <= self.max_error_rate <= 1.0:
            problems.append(f"max error rate must be within 0..1 (got {self.max_error_rate})")
        if self.file is not None and self.out is not None:
            problems.append("--replay FILE replays your file: --replay-out only keeps a generated workload")
        if problems:
            raise ConfigError("invalid replay options: " + "; ".join(problems))
        return self


@dataclass
class ReplayBench:
    """A replay as ``invoke bench --replay`` ran it: the run, the workload, where everything went."""

    run: ReplayRun
    workload: dict[str, Any]  # source (generated / file), path, spec, stats
    run_dir: Path
    json_path: Path | None = None
    png_path: Path | None = None
    target: str | None = None
    profile: str | None = None
    startup_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": "replay", "target": self.target, "profile": self.profile,
                "startup_seconds": None if self.startup_seconds is None else round(self.startup_seconds, 2),
                "workload": self.workload, **self.run.to_json()}

    def lines(self) -> list[str]:
        w = self.workload
        host = self.run.host
        out = [f"replay {self.run.url} model {self.run.model}: {len(self.run.records)} requests one at a time "
               f"({w['source']}: {w['path']}); stopped by {self.run.stopped_by}; wall {self.run.wall_s:.1f} s; "
               f"load {host.get('loadavg_before')} -> {host.get('loadavg_after')} on {host.get('cpus')} CPUs"]
        out.extend(self.run.report.lines())
        return out


def replay_workload(options: ReplayOptions, url: str, model: str, server_len: int | None,
                    run_dir: Path, *, transport: Any = None) -> tuple[list[ReplayRequest], dict[str, Any]]:
    """The requests to replay: the user's file, or a seeded workload (counted in the server's tokens, scaled to
    ``options.max_model_len`` or the server's max-model-len) kept as JSONL."""
    if options.file is not None:
        requests = load_jsonl(options.file)
        if options.requests:
            requests = requests[:options.requests]
        return requests, {"source": "file", "path": str(options.file), "stats": stats(requests)}
    max_len = options.max_model_len or server_len
    if max_len is None:
        raise ConfigError("the server does not list its max_model_len: the replay cannot be scaled",
                          hint="pass --max-model-len N")
    spec = ReplaySpec(requests=options.requests or ReplaySpec.requests, seed=options.seed, max_model_len=max_len)
    requests = generate(spec, server_counter(url, model, transport=_sync(transport)))
    path = write_jsonl(requests, options.out or run_dir / "replay.jsonl")
    return requests, {"source": "generated", "path": str(path), "spec": dataclasses.asdict(spec),
                      "stats": stats(requests)}


def replay_bench(url: str, options: ReplayOptions, run_dir: Path, *, echo: Log = print,
                 transport: Any = None) -> ReplayBench:
    """Generate (or load), replay one at a time, write ``bench.json`` and ``bench.png`` into ``run_dir``."""
    options.validate()
    if options.file is not None:
        load_jsonl(options.file)  # a bad file is exit 2 before any server is asked
    model, server_len = discover_model(url, transport=transport)
    requests, workload = replay_workload(options, url, model, server_len, run_dir, transport=transport)
    echo(f"workload ({workload['source']}): {workload['path']} {json.dumps(workload['stats'])}")
    run = run_replay(requests, url, model=model, duration=options.duration, timeout=options.timeout,
                     planned_output=options.planned_output, log=echo, transport=transport)
    result = ReplayBench(run, workload, run_dir)
    write_replay(result)
    return result


def write_replay(result: ReplayBench) -> None:
    from .plots import plot_replay

    result.run_dir.mkdir(parents=True, exist_ok=True)
    result.json_path = result.run_dir / "bench.json"
    result.json_path.write_text(json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    title = f"replay of {len(result.run.records)} requests on {result.run.model}, one at a time"
    result.png_path = plot_replay(result.run.records, result.run_dir / "bench.png", title=title)


def _sync(transport: Any) -> Any:
    """A MockTransport serves sync and async clients alike; anything else is async-only (None: the network)."""
    import httpx

    return transport if isinstance(transport, httpx.MockTransport) else None


def replay_verdict(result: ReplayBench, options: ReplayOptions) -> None:
    """SmokeError (exit 4): error rate above ``max_error_rate``, no token back, or (``require_targets``) a target
    line that does not PASS."""
    report = result.run.report
    first = next((r.error for r in result.run.records if r.error), None)
    if report.completion_tokens == 0:
        raise SmokeError(f"the replay of {result.run.url} got no tokens back "
                         f"({report.attempted - report.succeeded} of {report.attempted} requests failed)",
                         found=first, hint=f"the per-request errors are in {result.json_path}")
    failed = report.attempted - report.succeeded
    rate = failed / report.attempted if report.attempted else 0.0
    if rate > options.max_error_rate:
        raise SmokeError(f"{failed} of {report.attempted} replayed requests failed (error rate {rate:.1%} > "
                         f"{options.max_error_rate:.1%})", found=first,
                         hint="raise --max-error-rate to accept some; the per-request errors are in "
                         f"{result.json_path}")
    if options.require_targets and not report.passed:
        missed = [t.render() for t in report.targets if t.verdict != "PASS"]
        raise SmokeError("the replay misses the evaluator's targets", found="; ".join(missed))


def replay_options(replay: str | bool, replay_out: str = "", **fields: Any) -> ReplayOptions | None:
    """The task's ``--replay [FILE]`` / ``--replay-out FILE`` (+ workload fields) -> options; None: no replay.

    ``replay``: ``""``/False (no replay), True (bare ``--replay``: generate) or a file name.  ``max_model_len``
    0 means the server's.
    """
    if not replay:
        if replay_out:
            raise ConfigError("--replay-out keeps a generated replay workload: add --replay")
        return None
    max_len = fields.pop("max_model_len", 0) or None
    file = Path(replay) if isinstance(replay, str) and replay not in ("True", "true") else None
    return ReplayOptions(file=file, out=Path(replay_out) if replay_out else None, max_model_len=max_len,
                         **fields).validate()
