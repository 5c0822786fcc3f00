"""Step forensics over a target's ordered, individually cached steps.

* :mod:`.search` -- ``invoke bisect``: the first step whose image fails a check (pure search
  over cut points with a ``probe(k)`` callback);
* :mod:`.ablate` -- ``invoke ablate``: variants without a step (and its dependents), the ABAB
  schedule against the full image, the result table (text/JSON/CSV);
* :mod:`.graph` -- the ``requires:`` graph both use.

Those three build, serve and bench nothing: the callers pass callbacks and results in.  The commands
themselves, with real builds and servers: :mod:`.bisect_runner` (``invoke bisect``), :mod:`.ablate_runner`
(``invoke ablate``, also in place), over :mod:`.subsets` (the images of step subsets both build).
"""

from __future__ import annotations

from .ablate import AblationPlan, AblationTable, Metrics, RunResult, ScheduledRun, Variant, plan_ablation, summarize
from .graph import dependents, predecessors, with_predecessors
from .search import BisectResult, Outcome, Point, bisect, probe_bound, raise_for

__all__ = [
    "AblationPlan",
    "AblationTable",
    "BisectResult",
    "Metrics",
    "Outcome",
    "Point",
    "RunResult",
    "ScheduledRun",
    "Variant",
    "bisect",
    "dependents",
    "plan_ablation",
    "predecessors",
    "probe_bound",
    "raise_for",
    "summarize",
    "with_predecessors",
]
