"""PNG plots of a replay and of a sweep (matplotlib, Agg canvas: no display, no global pyplot state).

* :func:`plot_replay` -- per request, TTFT, the prefill rate (prompt / TTFT) and Output TPS (completion tokens
  / total time incl. TTFT) against the input length, and the three terms' shares of the score; failed requests
  are marked along the x axis, the organisers' targets drawn as lines.
* :func:`plot_sweep` -- weighted_tps, Output TPS p10 and TTFT p90 against the swept value, from plain records
  (``{"value": ..., "weighted_tps": ..., "output_tps_p10": ..., "ttft_p90_s": ...}``); several records with the same
  value (repeats) are drawn as points with their median joined.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import require_extra
from .evaluator import RequestRecord
from .redlines import REDLINES

OUTPUT_TPS_P10_TARGET = next(r.threshold for r in REDLINES if r.key == "output_tps_p10")
TTFT_P90_TARGET_S = next(r.threshold for r in REDLINES if r.key == "ttft_p90_ms") / 1000

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


def plot_replay(records: Sequence[RequestRecord], path: Path, *, title: str = "replay",
                shares: Mapping[str, float] | None = None) -> Path:
    """Four panels: TTFT, the prefill rate (prompt / TTFT: Input TPS) and Output TPS against input tokens, and
    what the score is made of (``shares``: each term's share of the weighted rate); writes ``path`` (PNG)."""
    ok = [r for r in records if r.ok and r.total_s is not None]
    failed = [r for r in records if not r.ok]
    figure = _figure(2, width=12.0, height=3.4)
    (ttft_ax, prefill_ax), (tps_ax, share_ax) = figure.subplots(2, 2)
    xs = [r.input_length for r in ok]
    ttft_ax.scatter(xs, [r.ttft_s if r.ttft_s is not None else float("nan") for r in ok], s=14, label="TTFT")
    ttft_ax.axhline(TTFT_P90_TARGET_S, color="tab:red", linestyle="--", linewidth=1,
                    label=f"organisers' p90 <= {TTFT_P90_TARGET_S:g} s")
    ttft_ax.set_ylabel("TTFT (s)")
    prefill_ax.scatter(xs, [r.input_tps for r in ok], s=14, color="tab:purple", label="Input TPS")
    prefill_ax.set_ylabel("prefill rate (tok/s)\nprompt / TTFT")
    tps_ax.scatter(xs, [r.output_tps for r in ok], s=14, color="tab:green", label="Output TPS")
    tps_ax.axhline(OUTPUT_TPS_P10_TARGET, color="tab:red", linestyle="--", linewidth=1,
                   label=f"organisers' p10 >= {OUTPUT_TPS_P10_TARGET:g} tok/s")
    tps_ax.set_ylabel("Output TPS (tok/s)\ncompletion / total time")
    for ax in (ttft_ax, prefill_ax, tps_ax):
        ax.set_xlabel("input tokens (prompt, cached included)")
        if failed:
            fx = [r.input_length for r in failed]
            ax.scatter(fx, [0.0] * len(fx), marker="x", color="tab:red", s=24, label=f"failed ({len(failed)})")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    names = ("output", "uncached_input", "cached")
    values = [100 * (shares or {}).get(n, 0.0) for n in names]
    share_ax.bar([n.replace("_", " ") for n in names], values, color=["tab:green", "tab:purple", "tab:gray"])
    for i, v in enumerate(values):
        share_ax.text(i, v, f"{v:.1f}%", ha="center", va="bottom", fontsize=8)
    share_ax.set_ylabel("share of the score (%)")
    share_ax.set_title("16.796 x output + 2.799 x uncached input + 0.56 x cached", fontsize=9)
    share_ax.set_ylim(0, 105)
    ttft_ax.set_title(f"{title}: {len(ok)} ok, {len(failed)} failed", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


SWEEP_PANELS = (("weighted_tps", "weighted tokens/s (score)"), ("output_tps_p10", "Output TPS p10 (tok/s)"),
                ("ttft_p90_s", "TTFT p90 (s)"))


def plot_sweep(points: Sequence[Mapping[str, Any]], path: Path, *, param: str = "value",
               title: str = "sweep") -> Path:
    """weighted_tps, Output TPS p10 and TTFT p90 against the swept value; writes ``path`` (PNG) and returns it.

    ``points``: one mapping per measurement with ``value`` (a number or a label) and any of ``weighted_tps``,
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
            ax.axhline(OUTPUT_TPS_P10_TARGET, color="tab:red", linestyle="--", linewidth=1, label="target")
        if key == "ttft_p90_s":
            ax.axhline(TTFT_P90_TARGET_S, color="tab:red", linestyle="--", linewidth=1, label="target")
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
