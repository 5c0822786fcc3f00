"""What one bench sends: the workload (N requests at concurrency C, prompt/output lengths, shared prefix) and
its deterministic prompts."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

APIS = ("completions", "chat")

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
    request_rate: float = 0.0  # requests/s arriving as a Poisson process (seeded); 0: all at once (concurrency-gated)

    def validate(self) -> Workload:
        problems = bound_problems(self, at_least={"requests": 1, "concurrency": 1, "prompt_tokens": 1,
                                                  "output_tokens": 1, "warmup": 0, "repeat": 1},
                                  fractions=("shared_prefix", "max_error_rate"))
        if self.api not in APIS:
            problems.append(f"api must be one of {', '.join(APIS)} (got {self.api!r})")
        if self.duration <= 0 or self.timeout <= 0:
            problems.append("duration and timeout must be > 0")
        if self.request_rate < 0:
            problems.append(f"request rate must be >= 0 (got {self.request_rate})")
        if problems:
            raise ConfigError("invalid bench workload: " + "; ".join(problems),
                              hint="see `invoke --help bench` for the workload options")
        return self

    def arrivals(self) -> list[float]:
        """Seconds from the start at which each measured request is sent: a Poisson process of ``request_rate``
        per second (exponential gaps from ``random.Random(seed)``, the first at 0), or all at 0 when the rate is 0."""
        if self.request_rate <= 0:
            return [0.0] * self.requests
        rng = random.Random(f"arrivals-{self.seed}")
        out, t = [], 0.0
        for _ in range(self.requests):
            out.append(t)
            t += rng.expovariate(self.request_rate)
        return out

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


@dataclass(frozen=True)
class Prompt:
    index: int
    body: str | list[int]  # token IDs (exact length) or text
    tokens: int | None  # the exact prompt length when known before sending


def bound_problems(spec: object, *, at_least: Mapping[str, float] = MappingProxyType({}),
                   fractions: Sequence[str] = ()) -> list[str]:
    """``NAME must be >= MIN (got V)`` for each field under its minimum, ``NAME must be within 0..1 (got V)`` for
    each fraction outside it (names with spaces for underscores): the checks every bench spec shares."""
    problems = []
    for name, minimum in at_least.items():
        if (value := getattr(spec, name)) < minimum:
            problems.append(f"{name.replace('_', ' ')} must be >= {minimum:g} (got {value})")
    for name in fractions:
        if not 0.0 <= (value := getattr(spec, name)) <= 1.0:
            problems.append(f"{name.replace('_', ' ')} must be within 0..1 (got {value})")
    return problems
