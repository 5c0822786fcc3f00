"""Hostile YAML is a config error (exit 2) within a second, even under a 2 GiB address-space limit.

Each case runs the real loader (``load_manifest``) in a fresh Python process whose address space is
capped with ``resource.setrlimit(RLIMIT_AS)``: a loader that expanded the alias bomb would die of
MemoryError (or be killed) instead of exiting 2, and a parser recursion would print a traceback.
The < 1 s bound is on the CPU time of ``load_manifest`` (see the assertion).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LIMIT = 2 * 1024**3

RUNNER = textwrap.dedent(
    """
    import json, sys, time
    from imageforge.errors import ImageforgeError
    from imageforge.manifest.load import load_manifest
    t0, c0 = time.monotonic(), time.process_time()
    try:
        load_manifest(sys.argv[1])
    except ImageforgeError as exc:
        print(json.dumps({"message": exc.message, "found": exc.found, "location": str(exc.location),
                          "wall": time.monotonic() - t0, "cpu": time.process_time() - c0}))
        sys.exit(exc.exit_code)
    print(json.dumps({"message": "loaded"}))
    """
)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def alias_bomb() -> str:
    """Nine levels of ten aliases each: 10^9 strings once expanded (the 'billion laughs')."""
    lines = ['version: 1', 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


CASES = {
    "alias-bomb": (alias_bomb(), "manifest expands to too many values"),
    "self-alias": ("version: 1\nx: &a [1, *a]\n", "an alias contains itself"),
    "self-alias-mapping": ("version: 1\nx: &a {k: *a}\n", "an alias contains itself"),
    "5000-brackets": ("version: 1\nx: " + "[" * 5000 + "\n", "manifest is nested too deeply"),
    "5000-braces": ("version: 1\nx: " + "{a: " * 5000 + "\n", "manifest is nested too deeply"),
    "5000-dashes": ("version: 1\nx:\n  " + "- " * 5000 + "1\n", "manifest is nested too deeply"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_yaml_exits_2_quickly_under_a_memory_limit(tmp_path: Path, case: str) -> None:
    text, message = CASES[case]
    path = tmp_path / "build.yaml"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path)],
        capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["message"] == message
    # CPU seconds of the load itself (the interpreter's start-up and imports are not the loader's, and wall
    # time on this shared 2-core machine measures the neighbours): a bomb walked to the end would take hours.
    assert report["cpu"] < 1.0, report


def test_deep_but_legal_nesting_still_loads(tmp_path: Path) -> None:
    from imageforge.manifest.yamldoc import load_yaml

    path = tmp_path / "ok.yaml"
    path.write_text("x: " + "[" * 30 + "]" * 30 + "\n" + "a: &a [1, 2]\nb: [*a, *a, *a]\n")
    doc = load_yaml(path)
    assert doc.data["b"] == [[1, 2]] * 3
    assert doc.positions[("b", 2, 1)] == (2, 11)  # an alias's items point at the anchored list
