"""PNG plots of a replay and of a sweep (matplotlib, Agg canvas: no display, no global pyplot state).

* :func:`plot_replay` -- per request, TTFT and Output TPS (completion tokens / total time incl. TTFT) against
  the input length; failed requests are marked along the x axis, the evaluator's targets drawn as lines.
* :func:`plot_sweep` -- score, Output TPS p10 and TTFT p90 against the swept value, from plain records
  (``{"value": ..., "score": ..., "output_tps_p10": ..., "ttft_p90_s": ...}``); several records with the same
  value (repeats) are drawn as points with their median joined.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import require_extra
from .evaluator import TARGET_OUTPUT_TPS_P10, TARGET_TTFT_P90_S, RequestRecord

#: What a run says instead of its PNG on a core install (no matplotlib: the card's box, say).
NO_PLOTS = "no PNG (matplotlib is not installed: pip install 'imageforge[plots]')"


def available() -> bool:
    """Whether the ``plots`` extra is installed. Without it a replay or sweep writes its JSON and says so, since
    the card's box gets the core install: the PNG is the only part that needs matplotlib."""
    return importlib.util.find_spec("matplotlib") is not None


def _figure(rows: int, width: float = 8.0, height: float = 3.0) -> Any:
    require_extra("matplotlib", "plots", "the PNG plots of bench --replay and sweep")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_replay(records: Sequence[RequestRecord], path: Path, *, title: str = "replay") -> Path:
    """Two panels (TTFT, Output TPS) against input tokens; writes ``path`` (PNG) and returns it."""
    ok = [r for r in records if r.ok and r.total_s is not None]
    failed = [r for r in records if not r.ok]
    figure = _figure(2)
    ttft_ax, tps_ax = figure.subplots(2, 1, sharex=True)
    xs = [r.input_length for r in ok]
    ttft_ax.scatter(xs, [r.ttft_s if r.ttft_s is not None else float("nan") for r in ok], s=14, label="TTFT")
    ttft_ax.axhline(TARGET_TTFT_P90_S, color="tab:red", linestyle="--", linewidth=1,
                    label=f"target p90 <= {TARGET_TTFT_P90_S:g} s")
    ttft_ax.set_ylabel("TTFT (s)")
    tps_ax.scatter(xs, [r.output_tps or 0.0 for r in ok], s=14, color="tab:green", label="Output TPS")
    tps_ax.axhline(TARGET_OUTPUT_TPS_P10, color="tab:red", linestyle="--", linewidth=1,
                   label=f"target p10 >= {TARGET_OUTPUT_TPS_P10:g} tok/s")
    tps_ax.set_ylabel("Output TPS (tok/s)\ncompletion / total time")
    tps_ax.set_xlabel("input tokens (prompt, cached included)")
    if failed:
        fx = [r.input_length for r in failed]
        for ax in (ttft_ax, tps_ax):
            ax.scatter(fx, [0.0] * len(fx), marker="x", color="tab:red", s=24, label=f"failed ({len(failed)})")
    for ax in (ttft_ax, tps_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    ttft_ax.set_title(f"{title}: {len(ok)} ok, {len(failed)} failed")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


SWEEP_PANELS = (("score", "score (estimate)"), ("output_tps_p10", "Output TPS p10 (tok/s)"),
                ("ttft_p90_s", "TTFT p90 (s)"))


def plot_sweep(points: Sequence[Mapping[str, Any]], path: Path, *, param: str = "value",
               title: str = "sweep") -> Path:
    """Score, Output TPS p10 and TTFT p90 against the swept value; writes ``path`` (PNG) and returns it.

    ``points``: one mapping per measurement with ``value`` (a number or a label) and any of ``score``,
    ``output_tps_p10``, ``ttft_p90_s`` (None or absent: not drawn).  Numeric values are placed on a numeric axis,
    anything else in first-seen order.
    """
    if not points:
        raise ValueError("plot_sweep needs at least one point")
    values = [p.get("value") for p in points]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    order: list[Any] = sorted(set(values)) if numeric else list(dict.fromkeys(str(v) for v in values))
    position = {v: (float(v) if numeric else float(i)) for i, v in enumerate(order)}
    figure = _figure(len(SWEEP_PANELS), height=2.4)
    axes = figure.subplots(len(SWEEP_PANELS), 1, sharex=True)
    for ax, (key, label) in zip(axes, SWEEP_PANELS, strict=True):
        xs: list[float] = []
        ys: list[float] = []
        by_value: dict[Any, list[float]] = {}
        for p in points:
            y = p.get(key)
            if y is None:
                continue
            v = p.get("value") if numeric else str(p.get("value"))
            xs.append(position[v])
            ys.append(float(y))
            by_value.setdefault(v, []).append(float(y))
        ax.scatter(xs, ys, s=18, alpha=0.6)
        med = [(position[v], statistics.median(by_value[v])) for v in order if v in by_value]
        if med:
            ax.plot([m[0] for m in med], [m[1] for m in med], marker="o", linewidth=1.2, label="median")
        if key == "output_tps_p10":
            ax.axhline(TARGET_OUTPUT_TPS_P10, color="tab:red", linestyle="--", linewidth=1, label="target")
        if key == "ttft_p90_s":
            ax.axhline(TARGET_TTFT_P90_S, color="tab:red", linestyle="--", linewidth=1, label="target")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if med:
            ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel(param)
    if not numeric:
        axes[-1].set_xticks([position[v] for v in order], [str(v) for v in order])
    axes[0].set_title(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
