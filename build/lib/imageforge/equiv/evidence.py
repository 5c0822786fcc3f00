"""What one server said about a prompt set: teacher-forced top-k logprobs and a greedy continuation.

Frozen data, JSON both ways (so evidence can be kept under a run directory and compared later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Position:
    """The server's distribution before one token of a teacher-forced sequence.

    ``entries`` maps token id -> (logprob, vocabulary rank or None): vLLM's ``prompt_logprobs``
    returns the top-k plus the sequence's own token (which may rank below k).
    """

    token_id: int
    entries: Mapping[int, tuple[float, int | None]]

    def logprob(self, token_id: int) -> float | None:
        entry = self.entries.get(token_id)
        return None if entry is None else entry[0]

    def top(self, k: int) -> list[tuple[int, float]]:
        """The ``k`` best entries as (token id, logprob), best first: by rank, else by logprob."""
        ranked = sorted(
            self.entries.items(),
            key=lambda item: (item[1][1] if item[1][1] is not None else 1 << 30, -item[1][0], item[0]),
        )
        if any(rank is None for _, (_, rank) in ranked):
            ranked = sorted(self.entries.items(), key=lambda item: (-item[1][0], item[0]))
        return [(token, lp) for token, (lp, _) in ranked[:k]]

    def best_logprob(self) -> float:
        return max(lp for lp, _ in self.entries.values())

    def smallest_logprob(self) -> float:
        return min(lp for lp, _ in self.entries.values())

    def to_json(self) -> dict[str, Any]:
        return {"token_id": self.token_id,
                "entries": {str(t): {"logprob": lp, "rank": rank} for t, (lp, rank) in self.entries.items()}}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Position:
        return Position(
            token_id=int(data["token_id"]),
            entries=MappingProxyType({int(t): (float(e["logprob"]), None if e.get("rank") is None else int(e["rank"]))
                                      for t, e in data["entries"].items()}),
        )


@dataclass(frozen=True)
class PromptEvidence:
    """One prompt: its ids, the teacher-forced sequence scored, one Position per token after the first."""

    name: str
    prompt_ids: tuple[int, ...]
    sequence: tuple[int, ...]  # prompt_ids + the REFERENCE's greedy continuation (same on both sides)
    positions: tuple[Position, ...]  # positions[i] is the distribution before sequence[i + 1]
    greedy: tuple[int, ...]  # this server's own greedy continuation of prompt_ids
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "prompt_ids": list(self.prompt_ids),
                "sequence": list(self.sequence), "greedy": list(self.greedy),
                "positions": [p.to_json() for p in self.positions]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PromptEvidence:
        return PromptEvidence(
            name=str(data["name"]),
            prompt_ids=tuple(int(t) for t in data["prompt_ids"]),
            sequence=tuple(int(t) for t in data["sequence"]),
            positions=tuple(Position.from_json(p) for p in data["positions"]),
            greedy=tuple(int(t) for t in data["greedy"]),
            text=data.get("text"),
        )


@dataclass(frozen=True)
class Evidence:
    """Everything one server answered for a prompt set."""

    url: str
    model: str
    top_k: int
    prompts: tuple[PromptEvidence, ...]
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "top_k": self.top_k, "notes": list(self.notes),
                "prompts": [p.to_json() for p in self.prompts]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Evidence:
        return Evidence(url=str(data["url"]), model=str(data["model"]), top_k=int(data["top_k"]),
                        prompts=tuple(PromptEvidence.from_json(p) for p in data["prompts"]),
                        notes=tuple(str(n) for n in data.get("notes", ())))


def position(token_id: int, entries: Mapping[int, float | tuple[float, int | None]]) -> Position:
    """Build a Position; plain float entries get ranks from their order by logprob (ties: lower id first)."""
    if all(isinstance(v, tuple) for v in entries.values()):
        return Position(token_id, MappingProxyType({t: v for t, v in entries.items() if isinstance(v, tuple)}))
    plain = {t: (v if isinstance(v, float | int) else v[0]) for t, v in entries.items()}
    order = sorted(plain, key=lambda t: (-plain[t], t))
    return Position(token_id, MappingProxyType({t: (float(plain[t]), order.index(t) + 1) for t in plain}))


def same_sequences(a: Sequence[PromptEvidence], b: Sequence[PromptEvidence]) -> list[str]:
    """Names of prompts whose teacher-forced sequences differ (they must not: both sides score the same ids)."""
    out = [x.name for x, y in zip(a, b, strict=False) if x.sequence != y.sequence or len(x.positions) !=
           len(y.positions)]
    if len(a) != len(b):
        out.append(f"{len(a)} prompts vs {len(b)}")
    return out
