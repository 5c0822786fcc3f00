"""The ``requires:`` graph of a target's ordered steps.

A step's ``requires:`` names EARLIER step ids (the manifest checks that), so the graph is acyclic
and every prefix of the order is closed under it: the image after step k holds every step a
step <= k needs.  Only subsets that are not prefixes need :func:`with_predecessors` (bisect over
chosen steps) or :func:`dependents` (ablate: a variant without a step is also without every step
that needs it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from ..errors import ConfigError
from ..manifest.yaml_messages import did_you_mean


class StepLike(Protocol):
    """What forensics needs of a step (:class:`imageforge.manifest.model.Step` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def requires(self) -> tuple[str, ...]: ...

    @property
    def required(self) -> bool: ...


def index_of(steps: Sequence[StepLike]) -> dict[str, int]:
    return {s.id: i for i, s in enumerate(steps)}


def check_ids(steps: Sequence[StepLike], ids: Iterable[str], what: str) -> list[str]:
    """``ids`` in manifest order, each checked to be a step id (ConfigError with "did you mean")."""
    known = index_of(steps)
    ids = list(dict.fromkeys(ids))
    for ident in ids:
        if ident not in known:
            raise ConfigError(
                f"{what}: unknown step id {ident!r}",
                expected="one of " + ", ".join(known) if known else "a step (the target has none)",
                found=repr(ident),
                hint=did_you_mean(ident, known),
            )
    return sorted(ids, key=known.__getitem__)


def dependents(steps: Sequence[StepLike], ident: str) -> list[str]:
    """Every step that requires ``ident``, directly or through other steps, in manifest order."""
    out: set[str] = set()
    frontier = {ident}
    for step in steps:  # requires point backwards: one forward pass closes the set
        if frontier.intersection(step.requires):
            out.add(step.id)
            frontier.add(step.id)
    return [s.id for s in steps if s.id in out]


def predecessors(steps: Sequence[StepLike], ident: str) -> list[str]:
    """Every step ``ident`` requires, directly or transitively, in manifest order."""
    by_id: Mapping[str, StepLike] = {s.id: s for s in steps}
    out: set[str] = set()
    todo = list(by_id[ident].requires)
    while todo:
        current = todo.pop()
        if current in out or current not in by_id:
            continue
        out.add(current)
        todo.extend(by_id[current].requires)
    return [s.id for s in steps if s.id in out]


def with_predecessors(steps: Sequence[StepLike], chosen: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """``chosen`` plus every step one of them requires, in manifest order; and why each was added.

    A bisect over chosen steps uses this so no candidate image ever lacks a required predecessor.
    """
    picked = check_ids(steps, chosen, "bisect --steps")
    added: dict[str, str] = {}
    for ident in picked:
        for pred in predecessors(steps, ident):
            if pred not in picked and pred not in added:
                added[pred] = f"required by {ident}"
    order = index_of(steps)
    return sorted({*picked, *added}, key=order.__getitem__), added
