"""The accuracy gate of ``invoke equiv``: does the patched image compute what the reference does?

* :mod:`.client` -- collects teacher-forced evidence from a vLLM server over httpx (see its
  docstring for how ``invoke equiv`` wires two servers into it);
* :mod:`.compare` -- the pure comparison (max/mean/p95 |delta logprob|, top-1 agreement, a KL
  estimate, first greedy divergence), the gate and its text/JSON reports;
* :mod:`.evidence` -- the frozen data between them.
* :mod:`.runner` -- ``invoke equiv`` itself: the two sides served (or one at a time, in place, against a
  recorded reference), compared and gated, the reports written.

Tolerances come from the target's ``equiv:`` block (:mod:`imageforge.manifest.tolerances`).
"""

from __future__ import annotations

from .client import EquivClient, collect_against, collect_reference
from .compare import Comparison, EquivError, Stats, Verdict, compare, first_divergence, gate, raise_if_failed
from .evidence import Evidence, Position, PromptEvidence, position

__all__ = [
    "Comparison",
    "EquivClient",
    "EquivError",
    "Evidence",
    "Position",
    "PromptEvidence",
    "Stats",
    "Verdict",
    "collect_against",
    "collect_reference",
    "compare",
    "first_divergence",
    "gate",
    "position",
    "raise_if_failed",
]
