"""Make the overlay modules importable by their file names, as they are inside the image.

overlays/bi100/*.py are copied into the vendor image's vllm package by the build, so they are not an
installed package here: their folder goes on sys.path instead. benchmarks/ goes there too, for the naive twins
that the benchmarks compare against (tests/overlays/test_overlays_naive.py checks them).

torch computes on one thread here: `invoke test` runs two workers on the machine's cores (and servers beside them),
and one OpenMP pool per worker, each as wide as the machine, oversubscribes the cores; its threads spin while
waiting. tests/overlays on two workers: 11-18 s on one thread each, 25-46 s on two (2026-12-05, 2 cores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_REPO = Path(__file__).resolve().parents[2]
for _path in (_REPO / "overlays" / "bi100", _REPO / "benchmarks", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every test starts from the same global RNG state (tests also use their own generators)."""
    torch.manual_seed(0)
