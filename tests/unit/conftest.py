"""Helpers for unit tests: write small manifests into tmp dirs."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve

REPO = Path(__file__).resolve().parents[2]

#: The head of every small test manifest: one target ``t`` on a Debian base, package vllm 1.0 (the target's other keys
#: follow, indented four spaces: :func:`manifest_text`).
HEAD = """\
version: 1
default_target: t
targets:
  t:
    base: {image: "debian:bookworm"}
    package: {import: vllm, distribution: vllm, version: "1.0"}
"""


def manifest_text(body: str) -> str:
    """A test manifest: :data:`HEAD`, then ``body`` (the rest of target ``t``, as written in the file)."""
    return HEAD + body


MINIMAL = manifest_text("""\
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
""")


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[str], Path]:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "x.py").write_text("X = 1\n")

    def write(text: str = MINIMAL, name: str = "build.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(scope="module")
def cpu() -> Resolved:
    """The repository's cpu target, its default profile, no environment."""
    return resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={})


@pytest.fixture(scope="module")
def bi100(request: pytest.FixtureRequest) -> Resolved:
    """The repository's bi100 target with the profile a test names (``@pytest.mark.parametrize("bi100", ["baseline"],
    indirect=True)``), else its default, no environment."""
    return resolve(load_manifest(REPO / "build.yaml"), "bi100", getattr(request, "param", None), environ={})
