"""The pure parts of the equiv/bisect/ablate orchestration: step subsets, serving overrides, selections.

Expected values are written from the repository's build.yaml (the cpu target's steps and verify list).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imageforge.equiv.runner import check_dtype, served_dtype, sides, with_serving_value
from imageforge.errors import ConfigError
from imageforge.forensics.ablate_runner import metrics_of
from imageforge.forensics.bisect_runner import select_checks
from imageforge.forensics.subsets import kept_imports, subset_resolved
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.plan import make_plan
from imageforge.smoke import load_suite
from imageforge.steps import kind

REPO = Path(__file__).resolve().parents[2]
CPU_STEPS = ["prefill-base-block", "prefill-num-warps", "sorted-moe-module", "moe-group-kernel",
             "cpu-moe-skip-prepack", "cpu-moe-native-grouping", "cpu-moe-apply-sorted", "torch-libs-into-usr-local",
             "ldconfig", "cpu-engine-start-method"]


@pytest.fixture(scope="module")
def cpu() -> Any:
    return resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ={})


def test_the_cpu_steps_are_what_these_tests_assume(cpu: Any) -> None:
    assert [s.id for s in cpu.steps] == CPU_STEPS


def test_a_prefix_keeps_the_order_the_keys_and_only_the_imports_its_overlays_provide(cpu: Any) -> None:
    prefix = subset_resolved(cpu, CPU_STEPS[:2], suffix="bisect")
    assert [s.id for s in prefix.steps] == CPU_STEPS[:2]
    assert prefix.target.image == "imageforge/cpu-bisect"
    # sorted-moe-module (dropped) provides fused_moe/sorted_moe.py: its import goes, the others stay
    assert prefix.target.verify.imports == (
        "vllm.v1.attention.ops.prefix_prefill",
        "vllm.model_executor.layers.fused_moe.experts.cpu_moe",  # a package file: kept by every cut
    )
    full = make_plan(cpu, environ={}, probe=None)
    part = make_plan(prefix, environ={}, probe=None)
    assert part.steps[0].key is None  # no daemon: keys are UNKNOWN without the base ID, so compare definitions
    assert [p.definition for p in part.steps[:2]] == [p.definition for p in full.steps[:2]]
    assert [p.id for p in part.steps] == [*CPU_STEPS[:2], "verify", "serving-config"]


def test_the_base_cut_has_no_steps_and_imports_only_what_the_package_has(cpu: Any) -> None:
    base = subset_resolved(cpu, [], suffix="bisect")
    assert base.steps == ()
    assert base.target.verify.imports == ("vllm.v1.attention.ops.prefix_prefill",
                                          "vllm.model_executor.layers.fused_moe.experts.cpu_moe")


def test_a_variant_without_a_middle_step_keeps_the_later_ones(cpu: Any) -> None:
    moe = ("sorted-moe-module", "moe-group-kernel", "cpu-moe-skip-prepack", "cpu-moe-native-grouping",
           "cpu-moe-apply-sorted")
    keep = [s for s in CPU_STEPS if s not in moe]
    variant = subset_resolved(cpu, keep, suffix="ablate")
    assert [s.id for s in variant.steps] == keep == ["prefill-base-block", "prefill-num-warps",
                                                      "torch-libs-into-usr-local", "ldconfig",
                                                      "cpu-engine-start-method"]
    assert "vllm.model_executor.layers.fused_moe.sorted_moe" not in variant.target.verify.imports
    # the native step's extension module goes with the step (its kind's provides)
    assert "vllm.model_executor.layers.fused_moe.imageforge_moe_group" not in variant.target.verify.imports
    assert len(variant.target.verify.imports) == 2
    with pytest.raises(ConfigError, match="unknown step id"):
        subset_resolved(cpu, ["nope"], suffix="x")


def test_kept_imports_matches_packages_too(cpu: Any) -> None:
    over = next(s for s in cpu.steps if s.id == "sorted-moe-module")
    assert kept_imports(["vllm.model_executor.layers.fused_moe.sorted_moe", "vllm.x"], [over]) == ("vllm.x",)
    assert kept_imports(["vllm.model_executor.layers.fused_moe"], [over]) == ("vllm.model_executor.layers.fused_moe",)


def test_the_dtype_override_replaces_or_adds_a_serving_value(cpu: Any) -> None:
    assert cpu.serving_args()["dtype"] == "bfloat16"
    f32 = with_serving_value(cpu, "dtype", "float32")
    assert f32.serving_args()["dtype"] == "float32"
    assert f32.overridden  # a variant: its image never takes the profile's tags
    assert make_plan(f32, environ={}, probe=None).tags[0].startswith("imageforge/cpu:conservative-custom-")
    added = with_serving_value(cpu, "new-flag", 3)
    assert added.serving_args()["new-flag"] == 3 and len(added.serving) == len(cpu.serving) + 1
    assert served_dtype(cpu) == "bfloat16" and served_dtype(f32) == "float32"
    assert served_dtype(with_serving_value(cpu, "dtype", "float16")) is None


def test_sides_for_base_and_for_a_profile(cpu: Any) -> None:
    cand, ref = sides(cpu, "base", dtype="float32")
    assert ref.base and ref.image is None and cand.base is False
    assert cand.resolved.target.image == "imageforge/cpu-equiv"
    assert cand.resolved.serving_args()["dtype"] == "float32" == ref.resolved.serving_args()["dtype"]
    cand, ref = sides(cpu, "baseline", dtype="bfloat16")
    assert ref.resolved.profile_name == "baseline" and not ref.base
    assert ref.resolved.serving_args()["dtype"] == "bfloat16"
    assert ref.resolved.serving_args()["max-num-seqs"] == 1
    with pytest.raises(ConfigError, match="is the profile under test"):
        sides(cpu, "conservative", dtype="float32")
    with pytest.raises(ConfigError, match="unknown dtype"):
        check_dtype("fp8")


def test_changed_files_of_a_patch_is_its_file_and_diff(cpu: Any) -> None:
    step = cpu.steps[1]
    lines = kind(step.kind).describe(step)
    assert lines[0] == "vllm/v1/attention/ops/prefix_prefill.py (patched x1)"
    assert "    -NUM_WARPS = 4 if current_platform.is_rocm() else 8" in lines
    assert "    +NUM_WARPS = 4  # imageforge: occupancy on a bandwidth-bound device" in lines
    assert kind(cpu.steps[2].kind).describe(cpu.steps[2]) == [
        "vllm/model_executor/layers/fused_moe/sorted_moe.py (overlaid from overlays/bi100/sorted_moe.py)"]


def test_select_checks_by_name_and_by_tag() -> None:
    suite = load_suite(REPO / "smoke" / "dummy.yaml")
    one = select_checks(suite, ["tokenize-count", "models-lists-served-name"], ("dummy-ok",))
    assert [c.id for c in one.checks] == ["tokenize-count", "models-lists-served-name"]
    assert len(select_checks(suite, [], ("dummy-ok",)).checks) == len(suite.select(("dummy-ok",)))
    with pytest.raises(ConfigError, match="no check 'models-list-served-name'") as info:
        select_checks(suite, ["models-list-served-name"], ("dummy-ok",))
    assert "did you mean 'models-lists-served-name'?" in info.value.render()


class _Bench:
    def __init__(self, error_rate: float, tokens: int) -> None:
        self.worst_error_rate, self.completion_tokens = error_rate, tokens
        self.weighted_tps, self.output_tps, self.uncached_input_tps, self.cache_tps = 10.0, 1.0, 2.0, 3.0


def test_metrics_of_a_failed_bench_is_none() -> None:
    from imageforge.bench import Workload

    w = Workload()
    assert metrics_of(_Bench(0.0, 5), w) is not None  # type: ignore[arg-type]
    assert metrics_of(_Bench(0.1, 5), w) is None  # type: ignore[arg-type]
    assert metrics_of(_Bench(0.0, 0), w) is None  # type: ignore[arg-type]
