"""Make the overlay modules importable by their file names, as they are inside the image.

overlays/bi100/*.py are copied into the vendor image's vllm package by the build, so they are not an
installed package here: their folder goes on sys.path instead. benchmarks/ goes there too, for the naive twins
that the benchmarks compare against (tests/overlays/test_overlays_naive.py checks them).
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


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every test starts from the same global RNG state (tests also use their own generators)."""
    torch.manual_seed(0)
