"""The evaluator's replay, its workload: the request model and a seeded agent-like generator.

* :class:`ReplayRequest` -- one chat request body plus its ``"_replay"`` metadata (session, turn, planned token
  counts; never sent); :class:`ReplaySpec` -- what :func:`generate` makes.
* :func:`generate` -- streamed chat requests shaped like the evaluator's 881 (facts note, "The evaluator"):
  agent *sessions* whose later turns extend the earlier ones (the prefix cache serves the shared part; about
  65 % of the input tokens, token-weighted), tools on ~78 % of the requests, several system messages on a few,
  input:output ~60:1, ~18 % with ``max_completion_tokens`` and ~1 % with ``reasoning_effort``.  Lengths are in
  tokens of the target's tokenizer (a :data:`TokenCounter`: the server's ``/tokenize`` or a ``tokenizer.json``,
  :mod:`.replay_loading`) and scale with the target's max-model-len (the evaluator's mean input is 25.7 % of the
  baseline's 100K).  The same spec and counter give a byte-identical JSONL (:func:`write_jsonl`);
  :func:`stats` says what a workload looks like.

The user's own JSONL is read by :mod:`.replay_loading`; :mod:`.replay` runs either, one request at a time.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Location
from ..workload import bound_problems

#: Counts the tokens of a text (no special tokens).
TokenCounter = Callable[[str], int]

META_KEY = "_replay"

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
