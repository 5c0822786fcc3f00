"""The PNGs: written, decodable, of the size asked, and not blank."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from imageforge.bench.evaluator import RequestRecord
from imageforge.bench.plots import plot_replay, plot_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _decoded(path: Path) -> tuple[int, int, float]:
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    return width, height, float(pixels[..., :3].std())


def test_replay_plot(tmp_path: Path) -> None:
    records = [RequestRecord(i, 200, ttft_s=0.05 * i, total_s=1.0 + 0.1 * i, prompt_tokens=100 * (i + 1),
                             completion_tokens=20, cached_tokens=50) for i in range(12)]
    records.append(RequestRecord(12, 400, "ctx_overflow", "too long", total_s=0.01, input_tokens_planned=2000))
    path = plot_replay(records, tmp_path / "sub" / "replay.png", title="t",
                       shares={"output": 0.2, "uncached_input": 0.6, "cached": 0.2})
    width, height, spread = _decoded(path)
    assert (width, height) == (1200, 680)  # 12 x 6.8 inches at 100 dpi: TTFT, prefill rate, Output TPS, shares
    assert spread > 0.05  # something was drawn
    # the shares panel is drawn from the numbers given: another split gives another picture
    other = plot_replay(records, tmp_path / "other.png", title="t",
                        shares={"output": 0.9, "uncached_input": 0.05, "cached": 0.05})
    assert other.read_bytes() != path.read_bytes()


def test_sweep_plot_numeric_and_labels(tmp_path: Path) -> None:
    points: list[dict[str, float | None]] = [
        {"value": v, "weighted_tps": 100.0 * v + r, "output_tps_p10": 30.0 - v, "ttft_p90_s": 0.1 * v}
        for v in (1, 2, 4, 8) for r in (0, 5)]
    points.append({"value": 16, "weighted_tps": None, "output_tps_p10": None, "ttft_p90_s": None})  # a failed point
    width, height, spread = _decoded(plot_sweep(points, tmp_path / "sweep.png", param="max-num-seqs"))
    assert (width, height) == (800, 720) and spread > 0.05
    labelled = [{"value": "max-num-seqs=1,max-num-batched-tokens=2048", "weighted_tps": 1.0, "output_tps_p10": 2.0,
                 "ttft_p90_s": 0.5}, {"value": "max-num-seqs=4,max-num-batched-tokens=2048", "weighted_tps": 3.0}]
    assert _decoded(plot_sweep(labelled, tmp_path / "labels.png"))[0] == 800


def test_sweep_plot_needs_points(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        plot_sweep([], tmp_path / "x.png")
