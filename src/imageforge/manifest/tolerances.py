"""The accuracy gate's settings: a target's ``equiv:`` block as frozen data, with defaults.

Pure data, no imports from the rest of imageforge: :mod:`imageforge.manifest.model` builds an
:class:`EquivSettings` from the manifest (after the schema check), and :mod:`imageforge.equiv`
gates a comparison with the :class:`Tolerance` of the dtype both servers ran in.

Why two dtypes have different gates (numbers measured on this project's machine):
the stock CPU MoE kernel and the ``sorted_moe`` overlay, same real-scale weights, differ by
max |delta logprob| 4e-6 in float32, but in bfloat16 by max 0.67, mean 0.015, p95 0.039 and
top-1 agreement 149/152.  One bf16 rounding flip can move one logprob by more than half a nat
without any bug, so bf16 is gated on mean, p95 and top-1 agreement and never on the max;
float32 is tight enough for a max gate.

Manifest form (every key optional)::

    equiv:
      dtype: float32          # what both servers are served in (equiv sets `dtype` on both)
      top_k: 5                # prompt_logprobs asked of each server
      greedy_tokens: 16       # greedy continuation length, for the first-divergence measure
      prompts: ["...", ...]   # replaces the built-in prompt set
      tolerances:
        float32:  {max_abs: 1.0e-3, mean_abs: 1.0e-4, p95_abs: 5.0e-4, top1_min: 0.99}
        bfloat16: {mean_abs: 0.05, p95_abs: 0.1, top1_min: 0.95}
      memory: {params_billion: 35, devices: 4, device_gb: 32}   # refuse a dtype whose weights do not fit

A tolerance key the manifest gives replaces that key of the default; ``null`` switches it off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal

Dtype = Literal["float32", "bfloat16"]
DTYPES: tuple[Dtype, ...] = ("float32", "bfloat16")
BYTES_PER_VALUE: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2})


@dataclass(frozen=True)
class Tolerance:
    """Limits of one gate; ``None`` means "not gated".

    * ``max_abs``  -- largest |delta logprob| over every reference top-k token of every position;
    * ``mean_abs`` -- mean of those |delta|s;  ``p95_abs`` -- their 95th percentile;
    * ``top1_min`` -- fraction (0..1) of positions where both servers rank the same token first;
    * ``kl_max``   -- mean per-position KL estimate (nats), see :mod:`imageforge.equiv.compare`.
    """

    max_abs: float | None = None
    mean_abs: float | None = None
    p95_abs: float | None = None
    top1_min: float | None = None
    kl_max: float | None = None

    def merged(self, overrides: Mapping[str, Any]) -> Tolerance:
        """This tolerance with the keys of ``overrides`` replaced (a ``None`` value switches a gate off)."""
        known = {f.name for f in fields(self)}
        return replace(self, **{k: (None if v is None else float(v)) for k, v in overrides.items() if k in known})

    def gates(self) -> dict[str, float]:
        """The active limits, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


DEFAULT_TOLERANCES: Mapping[Dtype, Tolerance] = MappingProxyType({
    # float32: measured 4e-6 between two correct MoE kernels; the team's hand check was "< 0.001".
    "float32": Tolerance(max_abs=1e-3, mean_abs=1e-4, p95_abs=5e-4, top1_min=0.99),
    # bfloat16: measured mean 0.015, p95 0.039, top-1 0.98 between two correct kernels; ~3x headroom.
    "bfloat16": Tolerance(mean_abs=0.05, p95_abs=0.1, top1_min=0.95),
})

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Translate to German: The weather is nice today.",
    "1, 2, 3, 5, 8, 13, 21,",
    "Once upon a time, in a small village by the sea, there lived",
    "SELECT name, count(*) FROM orders GROUP BY",
    "水是生命之源，",
    "The mixture of experts layer routes each token to",
)


@dataclass(frozen=True)
class EquivSettings:
    """A target's ``equiv:`` block, defaults filled in."""

    dtype: Dtype = "float32"
    top_k: int = 5
    greedy_tokens: int = 16
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    tolerances: Mapping[Dtype, Tolerance] = field(default_factory=lambda: DEFAULT_TOLERANCES)
    memory: Mapping[str, float] | None = None  # params_billion, devices, device_gb

    def fits(self, dtype: Dtype) -> str | None:
        """None when the weights fit the devices in ``dtype``; else the arithmetic that says they do not."""
        if not self.memory:
            return None
        params, devices, per = (float(self.memory[k]) for k in ("params_billion", "devices", "device_gb"))
        need = params * BYTES_PER_VALUE[dtype]
        have = devices * per
        if need <= have:
            return None
        return (f"{params:g}B x {BYTES_PER_VALUE[dtype]} B = {need:g} GB of weights in {dtype} > "
                f"{devices:g} x {per:g} GB = {have:g} GB")

    def tolerance(self, dtype: Dtype | None = None) -> Tolerance:
        """The gate for ``dtype`` (default: the block's own dtype)."""
        return self.tolerances[dtype or self.dtype]

    def serving_overrides(self) -> dict[str, str]:
        """``--set`` values equiv applies to BOTH servers so they compute in the same dtype."""
        return {"dtype": self.dtype}


def equiv_settings(raw: Mapping[str, Any] | None) -> EquivSettings:
    """Build settings from a schema-checked ``equiv:`` mapping (``None``: all defaults)."""
    raw = raw or {}
    given = raw.get("tolerances", {}) or {}
    tolerances = {d: DEFAULT_TOLERANCES[d].merged(given.get(d, {}) or {}) for d in DTYPES}
    prompts = tuple(str(p) for p in raw.get("prompts", ())) or DEFAULT_PROMPTS
    return EquivSettings(
        dtype=raw.get("dtype", "float32"),
        top_k=int(raw.get("top_k", 5)),
        greedy_tokens=int(raw.get("greedy_tokens", 16)),
        prompts=prompts,
        tolerances=MappingProxyType(tolerances),
        memory=MappingProxyType({k: float(v) for k, v in raw["memory"].items()}) if raw.get("memory") else None,
    )
