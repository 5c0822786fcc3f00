"""The competition target: rendered computility-run.yaml per profile, steps in the notes' order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imageforge.errors import InfraError
from imageforge.manifest import load_manifest
from imageforge.plan import make_plan, render_serving_config
from imageforge.resolve import resolve

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("profile", ["baseline", "conservative", "aggressive"])
def test_rendered_config_is_pinned(profile: str) -> None:
    resolved = resolve(load_manifest(REPO / "build.yaml"), "bi100", profile, environ={})
    rendered = render_serving_config(resolved)
    assert rendered == (GOLDEN / f"bi100-{profile}.computility-run.yaml").read_bytes(), (
        "the bi100 serving config changed: if intended, regenerate tests/unit/golden/ from build.yaml")
    data = yaml.safe_load(rendered)
    assert data["tensor-parallel-size"] == 4 and data["max-model-len"] == 100000
    assert data["reasoning-parser"] == "qwen3" and data["enable-auto-tool-choice"] is True
    assert data["enable-prefix-caching"] is True and data["enable-chunked-prefill"] is True
    assert data["max-seq-len-to-capture"] == 65536


def test_aggressive_plan_lists_every_step_in_deploy_order() -> None:
    resolved = resolve(load_manifest(REPO / "build.yaml"), "bi100", "aggressive", environ={})
    assert resolved.target.base.image_env == "IMAGEFORGE_BI100_BASE"
    plan = make_plan(resolved, environ={}, probe=None).to_json()
    ids = [s["id"] for s in plan["steps"]]
    assert ids == [
        "corex-triton-libs", "prefill-triton-tuning", "triton-fallback-module", "enable-triton",
        "decode-threshold", "paged-attention-v2-module", "paged-attention-layout-module", "v2-dispatch-import",
        "enable-v2", "v2-implementation", "partition-size-512", "prefix-attention-module", "sorted-moe-module",
        "verify", "serving-config",
    ]
    patches = [s for s in plan["steps"] if s["kind"] == "patch"]
    assert all(s["verified"] is False and s["file"] and s["old"] and s["why"] for s in patches)
    by_id = {s["id"]: s for s in plan["steps"]}
    assert "NUM_WARPS = 8" in by_id["prefill-triton-tuning"]["old"]
    assert by_id["decode-threshold"]["new"].startswith("_PYTORCH_DECODE_THRESHOLD = 65536")
    assert by_id["corex-triton-libs"]["into"] == "/usr/local/lib"
    assert plan["serving"]["max-num-seqs"] == 256 and plan["serving"]["max-num-batched-tokens"] == 32768
    assert plan["serving"]["gpu-memory-utilization"] == 0.95
    assert plan["base"]["problem"] == "environment variable IMAGEFORGE_BI100_BASE is not set"
    assert all(s["cache"] == "UNKNOWN" for s in plan["steps"])


def test_build_without_vendor_image_fails_fast() -> None:
    from imageforge.build import build_target

    resolved = resolve(load_manifest(REPO / "build.yaml"), "bi100", None, environ={})
    with pytest.raises(InfraError) as info:
        build_target(resolved, environ={}, echo=lambda _line: None)
    err = info.value
    assert err.exit_code == 5
    assert "$IMAGEFORGE_BI100_BASE, which is not set" in err.message
    assert err.hint is not None and "docker load -i" in err.hint


def test_invoke_build_bi100_exit_code_and_no_traceback() -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
    proc = subprocess.run([sys.executable, "-m", "invoke", "build", "--target", "bi100"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr
    assert "IMAGEFORGE_BI100_BASE" in proc.stderr
