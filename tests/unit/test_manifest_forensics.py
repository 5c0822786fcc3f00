"""Manifest fields for forensics: step ``requires:``/``required:`` and the target's ``equiv:`` tolerances."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import EXIT_CONFIG, ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.tolerances import DEFAULT_PROMPTS, DEFAULT_TOLERANCES
from imageforge.plan import chain_key, step_inputs
from tests.unit.conftest import MINIMAL

REPO = Path(__file__).resolve().parents[2]
FIX = "        new: \"A = 2\"\n"


def error_of(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_manifest(path)
    assert info.value.exit_code == EXIT_CONFIG
    return info.value


def with_fix_fields(extra: str) -> str:
    assert FIX in MINIMAL
    return MINIMAL.replace(FIX, FIX + extra)


def test_requires_and_required_are_parsed(write_manifest: Callable[[str], Path]) -> None:
    m = load_manifest(write_manifest(with_fix_fields("        requires: [over]\n        required: true\n")))
    over, fix = m.targets["t"].steps
    assert fix.requires == ("over",) and fix.required is True
    assert over.requires == () and over.required is False


def test_requires_and_required_stay_out_of_the_cache_key(write_manifest: Callable[..., Path]) -> None:
    plain = load_manifest(write_manifest(MINIMAL))
    marked = load_manifest(write_manifest(with_fix_fields("        requires: [over]\n        required: true\n"),
                                          name="marked.yaml"))
    for a, b in zip(plain.targets["t"].steps, marked.targets["t"].steps, strict=True):
        assert chain_key("sha256:base", a.definition(), step_inputs(a)) == chain_key(
            "sha256:base", b.definition(), step_inputs(b))
    assert "requires" not in marked.targets["t"].steps[1].spec.definition()


def test_requires_an_unknown_id(write_manifest: Callable[[str], Path]) -> None:
    text = error_of(write_manifest(with_fix_fields("        requires: [ovr]\n"))).render()
    assert "targets.t.steps[1].requires[0]: requires an unknown step id" in text
    assert "did you mean 'over'?" in text


def test_requires_a_later_step(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace("        dest: vllm/x.py\n", "        dest: vllm/x.py\n        requires: [fix]\n")
    rendered = error_of(write_manifest(text)).render()
    assert "targets.t.steps[0].requires[0]: requires a LATER step" in rendered
    assert "(this is the first step)" in rendered


def test_a_step_requiring_itself_is_a_cycle(write_manifest: Callable[[str], Path]) -> None:
    rendered = error_of(write_manifest(with_fix_fields("        requires: [fix]\n"))).render()
    assert "a step cannot require itself" in rendered and "(a cycle)" in rendered


def test_two_steps_requiring_each_other_are_reported(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace("        dest: vllm/x.py\n", "        dest: vllm/x.py\n        requires: [fix]\n")
    text = text.replace(FIX, FIX + "        requires: [over]\n")
    err = error_of(write_manifest(text))
    # the backward edge is fine, the forward one closes the cycle and is reported
    assert "steps[0].requires[0]: requires a LATER step" in err.render()
    assert "steps[1].requires" not in err.render()


def test_profile_steps_may_require_shared_steps_not_the_reverse(write_manifest: Callable[..., Path]) -> None:
    profile_step = (
        "      small:\n        args: {max-num-seqs: 2}\n        steps:\n"
        "          - {id: extra, kind: patch, file: vllm/z.py, old: a, new: b, requires: [fix]}\n"
    )
    text = MINIMAL.replace("      small: {args: {max-num-seqs: 2}}\n", profile_step)
    m = load_manifest(write_manifest(text))
    assert m.targets["t"].profiles["small"].steps[0].requires == ("fix",)
    bad = text.replace(FIX, FIX + "        requires: [extra]\n")
    rendered = error_of(write_manifest(bad, name="bad.yaml")).render()
    assert "targets.t.steps[1].requires[0]: requires an unknown step id" in rendered


def test_requires_must_be_a_list_of_ids(write_manifest: Callable[..., Path]) -> None:
    rendered = error_of(write_manifest(with_fix_fields("        requires: over\n"))).render()
    assert "targets.t.steps[1].requires" in rendered and "wrong type" in rendered
    rendered = error_of(write_manifest(with_fix_fields("        required: yes please\n"), name="b.yaml")).render()
    assert "targets.t.steps[1].required" in rendered


# --------------------------------------------------------------------------- equiv block


def test_equiv_defaults(write_manifest: Callable[[str], Path]) -> None:
    eq = load_manifest(write_manifest(MINIMAL)).targets["t"].equiv
    assert eq.dtype == "float32" and eq.top_k == 5 and eq.prompts == DEFAULT_PROMPTS
    assert eq.tolerance() == DEFAULT_TOLERANCES["float32"]
    assert eq.tolerance("bfloat16").max_abs is None
    assert eq.serving_overrides() == {"dtype": "float32"}


EQUIV = """\
    equiv:
      dtype: bfloat16
      top_k: 8
      greedy_tokens: 4
      prompts: ["one", "two"]
      tolerances:
        float32: {max_abs: 0.002}
        bfloat16: {mean_abs: 0.02, p95_abs: null}
"""


def test_equiv_block_overrides_single_keys(write_manifest: Callable[[str], Path]) -> None:
    eq = load_manifest(write_manifest(MINIMAL.replace("    default_profile: small\n",
                                                      EQUIV + "    default_profile: small\n"))).targets["t"].equiv
    assert (eq.dtype, eq.top_k, eq.greedy_tokens, eq.prompts) == ("bfloat16", 8, 4, ("one", "two"))
    f32 = eq.tolerance("float32")
    assert f32.max_abs == 0.002 and f32.mean_abs == DEFAULT_TOLERANCES["float32"].mean_abs
    bf16 = eq.tolerance()
    assert bf16.mean_abs == 0.02 and bf16.p95_abs is None
    assert bf16.top1_min == DEFAULT_TOLERANCES["bfloat16"].top1_min
    assert eq.serving_overrides() == {"dtype": "bfloat16"}


def write_equiv(write_manifest: Callable[[str], Path], block: str) -> Path:
    return write_manifest(MINIMAL.replace("    default_profile: small\n", block + "    default_profile: small\n"))


def test_bf16_is_never_gated_on_the_max(write_manifest: Callable[[str], Path]) -> None:
    block = "    equiv:\n      tolerances:\n        bfloat16: {max_abs: 0.5}\n"
    rendered = error_of(write_equiv(write_manifest, block)).render()
    assert "targets.t.equiv.tolerances.bfloat16.max_abs: bfloat16 is never gated on the max" in rendered


def test_a_gate_with_every_limit_off_is_refused(write_manifest: Callable[[str], Path]) -> None:
    block = ("    equiv:\n      tolerances:\n        float32: {max_abs: null, mean_abs: null, p95_abs: null, "
             "top1_min: null}\n")
    rendered = error_of(write_equiv(write_manifest, block)).render()
    assert "the float32 gate has no limit left" in rendered


@pytest.mark.parametrize(("block", "key"), [
    ("    equiv: {dtype: float16}\n", "targets.t.equiv.dtype"),
    ("    equiv: {top_k: 0}\n", "targets.t.equiv.top_k"),
    ("    equiv: {tolerances: {bfloat16: {top1_min: 1.5}}}\n", "targets.t.equiv.tolerances.bfloat16.top1_min"),
    ("    equiv: {tolerances: {float32: {mean: 0.1}}}\n", "targets.t.equiv.tolerances.float32.mean"),
    ("    equiv: {tolerances: {float32: {max_abs: -1}}}\n", "targets.t.equiv.tolerances.float32.max_abs"),
])
def test_equiv_schema(write_manifest: Callable[[str], Path], block: str, key: str) -> None:
    assert key in error_of(write_equiv(write_manifest, block)).render()


def test_repo_manifest_loads_with_default_equiv_settings() -> None:
    m = load_manifest(REPO / "build.yaml")
    for target in m.targets.values():
        assert target.equiv.tolerance("float32") == DEFAULT_TOLERANCES["float32"]
    # only the organisers' baseline is required (bi100 cannot serve Qwen3.6 without it: equiv's reference)
    assert {(t.name, s.id) for t in m.targets.values() for s in t.steps if s.required} == {
        ("bi100", "organisers-baseline")}
    # the cpu MoE patches need the overlay they call (bisect/ablate drop them together); nothing else declares any
    requires = {s.id: s.requires for t in m.targets.values() for s in t.steps if s.requires}
    assert requires == {"cpu-moe-skip-prepack": ("sorted-moe-module",),
                        "cpu-moe-native-grouping": ("cpu-moe-skip-prepack", "moe-group-kernel"),
                        "cpu-moe-apply-sorted": ("cpu-moe-skip-prepack",)}


def test_equiv_memory_block(write_manifest: Callable[[str], Path]) -> None:
    block = "    equiv: {memory: {params_billion: 7, devices: 1, device_gb: 24}}\n"
    m = load_manifest(write_equiv(write_manifest, block))
    settings = m.targets["t"].equiv
    assert settings.fits("bfloat16") is None
    assert settings.fits("float32") == "7B x 4 B = 28 GB of weights in float32 > 1 x 24 GB = 24 GB"
    error = error_of(write_equiv(write_manifest, "    equiv: {memory: {params_billion: 7}}\n")).render()
    assert "targets.t.equiv.memory" in error
