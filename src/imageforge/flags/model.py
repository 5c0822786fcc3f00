"""Serving flags, the model: what the target's own vLLM accepts, as a :class:`FlagTable` of frozen :class:`FlagSpec`.

Learnt two ways (:mod:`imageforge.flags.learn`: the parser's source read with :mod:`ast`, or vLLM's own parser
listed inside the image) and checked against the manifest's serving args (:mod:`imageforge.flags.check`).
Nothing here touches Docker or a cache.

Wiring::

    table = read_static({path: text, ...}) or parse_introspection(container_output)
    problems = check_serving_args(serving_args_of_target(manifest, "cpu"), table,
                                  run_port=run_port_of(manifest, "cpu"), suite=suite_models(suite_doc))
    ErrorCollector(problems).raise_if_any("serving flags do not match the image's vLLM")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

FlagType = Literal["int", "float", "str", "bool", "choice", "json", "any"]


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Range:
    """A numeric range; either end may be open (None) or exclusive."""

    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False

    def contains(self, value: float) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.min_exclusive else value < self.minimum):
            return False
        return not (
            self.maximum is not None and (value >= self.maximum if self.max_exclusive else value > self.maximum)
        )

    def text(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f"{'>' if self.min_exclusive else '>='} {_number(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"{'<' if self.max_exclusive else '<='} {_number(self.maximum)}")
        return " and ".join(parts) or "any number"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class FlagSpec:
    """One flag of a vLLM parser. ``name`` has no dashes: ``max-num-seqs``."""

    name: str
    type: FlagType
    choices: tuple[str, ...] = ()
    range: Range | None = None
    negatable: bool = False  # --no-NAME exists (BooleanOptionalAction)
    takes_value: bool = True  # False for store_true/store_false
    multiple: bool = False  # nargs '+' / '*': a list is accepted
    nullable: bool = False  # the type maps "None" / "" to None
    aliases: tuple[str, ...] = ()  # the other option strings, with dashes: ("-tp",)
    also: tuple[str, ...] = ()  # words accepted besides the type (max-model-len: "auto")
    origin: str | None = None  # "vllm/engine/arg_utils.py:123" or "vllm 0.32.0 parser"

    def describe(self) -> str:
        """What the flag takes, in words: ``an integer >= 1``, ``true or false``, ``one of 'a', 'b'``."""
        if self.type == "bool":
            return "true or false" if (self.negatable or self.takes_value) else "true (or no such key)"
        if self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            text = {"int": "an integer", "float": "a number", "str": "text", "json": "a mapping, a list or JSON text",
                    "any": "a value", "choice": "a value"}[self.type]
            if self.range is not None and self.type in ("int", "float"):
                text += " " + self.range.text()
        if self.also:
            text += " or " + " or ".join(repr(a) for a in self.also)
        if self.multiple:
            text += " (or a list of them)"
        return text


@dataclass(frozen=True)
class FlagTable:
    """The flags of one parser, by name; ``source`` says where they came from (for messages)."""

    flags: Mapping[str, FlagSpec]
    source: str

    def __len__(self) -> int:
        return len(self.flags)

    def __contains__(self, name: object) -> bool:
        return name in self.flags

    def get(self, name: str) -> FlagSpec | None:
        return self.flags.get(name)

    def by_alias(self, name: str) -> FlagSpec | None:
        """The flag that ``--name`` / ``-name`` is an alias of."""
        for spec in self.flags.values():
            if f"--{name}" in spec.aliases or f"-{name}" in spec.aliases:
                return spec
        return None


# Known ranges where vLLM has them (0.32 declares most of them in pydantic metadata; 0.6.3 in code).
KNOWN_RANGES: Mapping[str, Range] = {
    "gpu-memory-utilization": Range(0, 1, min_exclusive=True),
    "port": Range(1, 65535),
    "max-num-seqs": Range(1),
    "max-num-batched-tokens": Range(1),
    "max-model-len": Range(1),
    "max-seq-len-to-capture": Range(1),
    "tensor-parallel-size": Range(1),
    "pipeline-parallel-size": Range(1),
    "block-size": Range(0, min_exclusive=True),
    "swap-space": Range(0),
}
