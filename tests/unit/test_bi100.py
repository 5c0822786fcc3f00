"""The competition target: the organisers' command, the default profile's safety, the deploy order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from imageforge.errors import InfraError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.patches.from_text import apply_steps
from imageforge.plan import make_plan
from imageforge.serve.command import render_serving_config, serving_argv
from imageforge.steps import OverlaySpec, PatchSpec
from tests.cli import imageforge

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
FIXTURES = REPO / "tests" / "fixtures"
BASELINE = FIXTURES / "bi100-baseline" / "qwen3_6_scripts"
VENDOR_SITE = FIXTURES / "bi100-vendor" / "usr/local/corex/lib64/python3/dist-packages"

# The organisers' computility-run.yaml command, as the facts note gives it.
ORGANISERS_COMMAND = ("python3 -m vllm.entrypoints.openai.api_server --model /model --served-model-name llm "
                      "--max-model-len 100000 --gpu-memory-utilization 0.9 --trust-remote-code -tp 4 --max-num-seqs 1 "
                      "--disable-log-requests --disable-frontend-multiprocessing --max-num-batched-tokens 8192 "
                      "--enable-chunked-prefill --max-seq-len-to-capture 32768 --enable-auto-tool-choice "
                      "--tool-call-parser qwen3_coder --reasoning-parser qwen3 --enable-prefix-caching")
ORGANISERS = ORGANISERS_COMMAND.split()


def resolved(profile: str | None) -> object:
    return resolve(load_manifest(REPO / "build.yaml"), "bi100", profile, environ={})


def test_baseline_profile_is_the_organisers_command_exactly() -> None:
    r = resolve(load_manifest(REPO / "build.yaml"), "bi100", "baseline", environ={})
    assert serving_argv(r) == ORGANISERS
    assert r.serving_env() == {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "3600"}
    assert "enforce_eager" in r.target.serving.reasons["max-seq-len-to-capture"], "a flag that does nothing says so"


@pytest.mark.parametrize("profile", ["baseline", "replay", "replay-256k", "replay-big-chunks"])
def test_rendered_config_is_pinned(profile: str) -> None:
    r = resolve(load_manifest(REPO / "build.yaml"), "bi100", profile, environ={})
    rendered = render_serving_config(r)
    assert rendered == (GOLDEN / f"bi100-{profile}.computility-run.yaml").read_bytes(), (
        "the bi100 serving config changed: if intended, regenerate tests/unit/golden/ from build.yaml")
    data = yaml.safe_load(rendered)
    assert all(isinstance(item, str) for item in data["command"]), "each flag and value its own string"
    assert data["env"] == [{"name": "VLLM_ENGINE_ITERATION_TIMEOUT_S", "value": "3600"}]
    argv = data["command"]
    assert argv[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model"]
    assert argv[argv.index("--served-model-name") + 1] == "llm" and argv[argv.index("-tp") + 1] == "4"
    for flag in ("--trust-remote-code", "--disable-log-requests", "--disable-frontend-multiprocessing",
                 "--enable-prefix-caching", "--enable-chunked-prefill", "--enable-auto-tool-choice"):
        assert flag in argv and argv[argv.index(flag) + 1:argv.index(flag) + 2] != ["True"]
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--port" not in argv and "--config" not in argv, "api_server's own default port 8000"


def test_default_profile_serves_one_request_at_a_time_safely() -> None:
    m = load_manifest(REPO / "build.yaml")
    target = m.target("bi100")
    assert target.default_profile == "replay"
    r = resolve(m, "bi100", None, environ={})
    args = r.serving_args()
    assert args["max-num-seqs"] >= 2, "n=2 must not hit serving_chat's n > max-num-seqs guard"
    # the evaluator's max_context_tokens (131072): t3_max_tokens_over's 131073 tokens are refused, as it wants;
    # replay-256k takes every replay input (> 230K tokens) at the price of that check
    assert args["max-model-len"] == 131072
    wide = resolve(m, "bi100", "replay-256k", environ={}).serving_args()
    assert wide["max-model-len"] > 230_000, "replay inputs exceed 230K tokens"
    assert args["served-model-name"] == "llm" and args["tensor-parallel-size"] == 4
    steps = r.steps
    patches = [s.spec for s in steps if isinstance(s.spec, PatchSpec)]
    overlays = [s.spec for s in steps if isinstance(s.spec, OverlaySpec)]
    texts = " ".join([p.new for p in patches] + [o.dest for o in overlays])
    assert "HAS_TRITON" not in texts and "triton_fallback" not in texts, "no step turns Triton on"
    assert not any("_PYTORCH_DECODE_THRESHOLD" in p.old for p in patches)
    assert not any(s.kind == "symlink" for s in steps), "no corex Triton libraries linked"
    assert not any("paged_attention_v2" in str(s.spec) or "use_v1" in str(s.spec) for s in steps), "no V2 decode"
    # applied to the fixture files, the default profile leaves the baseline's hang guards as they are
    patched: dict[str, str] = {}
    for s in steps:
        if s.kind != "patch":
            continue
        name = Path(PatchSpec.of(s).file).name
        source = BASELINE / name if (BASELINE / name).exists() else VENDOR_SITE / PatchSpec.of(s).file
        patched[name] = apply_steps(patched.get(name, source.read_text()), [s.definition()])
    assert "    _PYTORCH_DECODE_THRESHOLD = 32768\n" in patched["paged_attn.py"]
    assert "HAS_TRITON = False" in (VENDOR_SITE / "vllm/triton_utils/importing.py").read_text()


def test_every_profile_says_why_and_none_is_concurrency_oriented() -> None:
    target = load_manifest(REPO / "build.yaml").target("bi100")
    for name, profile in target.profiles.items():
        assert profile.why, name
        seqs = resolve(load_manifest(REPO / "build.yaml"), "bi100", name, environ={}).serving_args()["max-num-seqs"]
        assert seqs <= 2, f"{name}: the evaluator sends one request at a time"
        assert profile.extends is not None or name == "baseline"
        for key in profile.args:
            assert key in profile.reasons or name == "baseline" or profile.why, (name, key)


def test_every_overlay_is_called_by_a_patch() -> None:
    target = load_manifest(REPO / "build.yaml").target("bi100")
    patches = [s for s in target.steps if s.kind == "patch"]
    overlays = [s for s in target.steps if s.kind == "overlay"]
    assert {s.id for s in overlays} == {"prefix-attention-module", "sorted-moe-module"}
    for overlay in overlays:
        module = OverlaySpec.of(overlay).dest.removesuffix(".py").replace("/", ".")
        callers = [p for p in patches if f"from {module} import" in PatchSpec.of(p).new]
        assert len(callers) == 1, f"{overlay.id}: {module} is imported by no call-site patch"
        assert target.steps.index(callers[0]) > target.steps.index(overlay)
    assert target.steps[0].id == "organisers-baseline", "the baseline deploys first"


def test_plan_without_the_folder_and_the_base() -> None:
    plan = make_plan(resolve(load_manifest(REPO / "build.yaml"), "bi100", "replay", environ={}), environ={},
                     probe=None).to_json()
    first = plan["steps"][0]
    assert first["kind"] == "script" and first["directory"] == "${IMAGEFORGE_BI100_SCRIPTS}"
    assert first["command"] == ["bash", "patch_ops.sh"] and first["workdir"] == "/workspace/qwen3_6_scripts"
    assert first["inputs"] == {"directory:IMAGEFORGE_BI100_SCRIPTS": "unset"}
    assert plan["base"]["problem"] == "environment variable IMAGEFORGE_BI100_BASE is not set"
    assert plan["serving_style"] == "argv" and plan["argv"][plan["argv"].index("--max-num-seqs") + 1] == "2"
    assert all(s["cache"] == "UNKNOWN" for s in plan["steps"])
    with_folder = make_plan(resolve(load_manifest(REPO / "build.yaml"), "bi100", "replay", environ={}),
                            environ={"IMAGEFORGE_BI100_SCRIPTS": str(BASELINE)}, probe=None).to_json()
    digest = with_folder["steps"][0]["inputs"]["directory:IMAGEFORGE_BI100_SCRIPTS"]
    assert len(digest) == 64


def test_build_without_vendor_image_fails_fast() -> None:
    from imageforge.build import build_target

    r = resolve(load_manifest(REPO / "build.yaml"), "bi100", None, environ={})
    with pytest.raises(InfraError) as info:
        build_target(r, environ={}, echo=lambda _line: None)
    err = info.value
    assert err.exit_code == 5
    assert "$IMAGEFORGE_BI100_BASE, which is not set" in err.message
    assert err.hint is not None and "docker load -i" in err.hint


def test_build_without_the_scripts_folder_fails_fast() -> None:
    from imageforge.build import build_target

    r = resolve(load_manifest(REPO / "build.yaml"), "bi100", None, environ={})
    with pytest.raises(InfraError) as info:
        build_target(r, environ={"IMAGEFORGE_BI100_BASE": "vendor:never-looked-up"}, echo=lambda _line: None)
    err = info.value
    assert err.exit_code == 5 and "$IMAGEFORGE_BI100_SCRIPTS, which is not set" in err.message
    assert err.hint is not None and "qwen3_6_scripts" in err.hint
    assert err.key_path == "targets.bi100.steps[0].directory"


def test_invoke_build_bi100_exit_code_and_no_traceback() -> None:
    bare: dict[str, str | None] = {**{k: None for k in os.environ}, "PATH": "/usr/bin:/bin", "HOME": "/root"}
    proc = imageforge("build", "--target", "bi100", env=bare)
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr
    assert "IMAGEFORGE_BI100_BASE" in proc.stderr
