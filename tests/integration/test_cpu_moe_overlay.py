"""The cpu target's two cpu_moe.py patches route vLLM's unquantized CPU MoE through the sorted_moe overlay.

The manifest's own patch steps are applied (imageforge's anchored patching) to the real cpu_moe.py read
from the cpu base image; a container of that base image then runs tests/integration/cpu_moe_probe.py
against the patched file, and against the stock file as the control. Expected values come from the
probe's float64 loop, never from the code under test.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from imageforge.docker_engine import client
from imageforge.patches.from_text import apply_steps
from tests.integration.forge_fixtures import read_from_image

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SITE = "/opt/venv/lib/python3.11/site-packages"
CPU_MOE = "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py"
SORTED_MOE = "vllm/model_executor/layers/fused_moe/sorted_moe.py"
STEP_IDS = ("cpu-moe-skip-prepack", "cpu-moe-apply-sorted")


@pytest.fixture(scope="module")
def cpu_base() -> str:
    from imageforge.base import base_image_status

    status = base_image_status(REPO / "images" / "cpu")
    if not status.vllm_present:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    return status.ref


def _cpu_steps() -> list[dict[str, Any]]:
    target = yaml.safe_load((REPO / "build.yaml").read_text())["targets"]["cpu"]
    return [s for s in target["steps"] if s["id"] in STEP_IDS]


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _probe(image: str, cpu_moe_text: str, *args: str) -> dict[str, Any]:
    files = {
        f"{SITE}/{CPU_MOE}": cpu_moe_text.encode(),
        f"{SITE}/{SORTED_MOE}": (REPO / "overlays" / "bi100" / "sorted_moe.py").read_bytes(),
        "/tmp/cpu_moe_probe.py": (Path(__file__).parent / "cpu_moe_probe.py").read_bytes(),
    }
    container = client().containers.create(
        image, entrypoint=["python", "-B", "/tmp/cpu_moe_probe.py"], command=list(args), network_disabled=True,
        environment={"VLLM_TARGET_DEVICE": "cpu", "TORCH_COMPILE_DISABLE": "1"},
        labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test"})
    try:
        assert container.put_archive("/", _tar(files))
        container.start()
        code = container.wait(timeout=300)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
        assert code == 0, err[-3000:]
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def stock_text(cpu_base: str) -> str:
    return read_from_image(cpu_base, f"{SITE}/{CPU_MOE}").decode()


def test_manifest_has_both_patches_on_the_real_file(stock_text: str) -> None:
    steps = _cpu_steps()
    assert [s["id"] for s in steps] == list(STEP_IDS)
    patched = apply_steps(stock_text, steps)  # raises unless each anchor occurs exactly once, in order
    assert patched.count("cpu_fused_moe(") == stock_text.count("cpu_fused_moe(") == 1
    assert "_imageforge_fused_experts" in patched and "_imageforge_fused_experts" not in stock_text


def test_patched_apply_calls_sorted_moe(cpu_base: str, stock_text: str) -> None:
    result = _probe(cpu_base, apply_steps(stock_text, _cpu_steps()), "--x86-without-amx")
    assert {(c["class"], c["dtype"]) for c in result["cases"]} == {
        ("CPUUnquantizedExperts", "torch.float32"), ("X86CPUUnquantizedExperts", "torch.bfloat16")}
    for case in result["cases"]:
        name = f"{case['class']} {case['dtype']} top{case['top_k']} on_input={case['apply_router_weight_on_input']}"
        assert case["calls"] == {"sorted_moe.fused_experts": 1, "cpu_fused_moe": 0, "cpu_prepack_moe_weight": 0}, name
        assert case["w13_unchanged"] and case["w2_unchanged"], name  # no prepack: the plain layout stays
        assert case["finite"], name
        assert case["sorted_on_layer_weights_err"] == case["max_abs_err"], name  # the same weights, the same path
        tol = 1e-4 if case["dtype"] == "torch.float32" else 0.05 * case["ref_max_abs"]
        assert case["max_abs_err"] <= tol, (name, case)


def test_stock_file_prepacks_and_calls_cpu_fused_moe(cpu_base: str, stock_text: str) -> None:
    """The control: without the patches the probe sees the stock path, and the prepack changes the data."""
    result = _probe(cpu_base, stock_text)
    for case in result["cases"]:
        name = f"{case['class']} {case['dtype']}"
        assert case["calls"] == {"sorted_moe.fused_experts": 0, "cpu_fused_moe": 1, "cpu_prepack_moe_weight": 2}, name
        assert not (case["w13_unchanged"] and case["w2_unchanged"]), name  # permuted data ...
        assert case["w13_shape"] == [8, 64, 64], name  # ... in the same shape
        # ... which sorted_moe turns into garbage without an error: why the prepack must go
        assert case["sorted_on_layer_weights_err"] > 0.2 * case["ref_max_abs"], (name, case)
        # the stock kernel on its packed weights computes the same MoE (the reference is right about vLLM)
        tol = 1e-3 if case["dtype"] == "torch.float32" else 0.05 * case["ref_max_abs"]
        assert case["max_abs_err"] <= tol, (name, case)
