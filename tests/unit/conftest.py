"""Helpers for unit tests: write small manifests into tmp dirs."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

MINIMAL = """\
version: 1
default_target: t
targets:
  t:
    base: {image: "debian:bookworm"}
    package: {import: vllm, distribution: vllm, version: "1.0"}
    steps:
      - id: over
        kind: overlay
        source: overlays/x.py
        dest: vllm/x.py
      - id: fix
        kind: patch
        file: vllm/y.py
        old: "A = 1"
        new: "A = 2"
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}
    default_profile: small
    profiles:
      small: {args: {max-num-seqs: 2}}
      big: {extends: small, args: {max-num-seqs: 64, gpu-memory-utilization: 0.95}}
"""


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[str], Path]:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "x.py").write_text("X = 1\n")

    def write(text: str = MINIMAL, name: str = "build.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write
