"""Serving values against the evaluator's functional checks, before any build (imageforge.flags.evaluator).

The rules and numbers expected here are the evaluator's (its harness: t3 sends max_context_tokens + 1 and
max_context_tokens - min(2048, ctx / 4); the organisers' serving_chat.py refuses n > max_num_seqs), worked
out by hand, not read from the module.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imageforge.errors import ConfigError
from imageforge.flags.evaluator import n_guard_in_tree, report_risks, serving_risks
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, Value, resolve
from tests.cli import imageforge, without_imageforge_settings

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "fixtures" / "bi100-baseline" / "qwen3_6_scripts"
BI100_SCRIPTS = {"IMAGEFORGE_BI100_SCRIPTS": str(SCRIPTS)}


def bi100(profile: str) -> Resolved:
    return resolve(load_manifest(REPO / "build.yaml"), "bi100", profile, environ=BI100_SCRIPTS)


def with_args(resolved: Resolved, **args: Any) -> Resolved:
    """``resolved`` with serving args changed (None: left out), none of them explained by a reason."""
    keep = [v for v in resolved.serving if v.key not in args]
    new = [Value(k, v, "cli:--set", None) for k, v in args.items() if v is not None]
    return replace(resolved, serving=(*keep, *new), profile=None)


def checks(resolved: Resolved, environ: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return {r.check: r for r in serving_risks(resolved, BI100_SCRIPTS if environ is None else environ, **kw)}


def test_the_bi100_default_profiles_pass_every_rule() -> None:
    for profile in ("replay", "replay-big-chunks"):
        assert serving_risks(bi100(profile), BI100_SCRIPTS) == [], profile


def test_the_other_bi100_profiles_take_their_risks_on_purpose() -> None:
    baseline = checks(bi100("baseline"))
    assert set(baseline) == {"t3_max_tokens_max", "t2_n_2"}
    assert all(r.accepted and r.check in r.accepted for r in baseline.values())
    wide = checks(bi100("replay-256k"))
    assert set(wide) == {"t3_max_tokens_over"} and "t3_max_tokens_over" in str(wide["t3_max_tokens_over"].accepted)
    report = report_risks([bi100(p) for p in ("baseline", "replay", "replay-256k")], BI100_SCRIPTS, strict=True)
    assert report.warnings == () and len(report.notes) == 3


def test_max_model_len_against_max_context_tokens() -> None:
    over = checks(with_args(bi100("replay"), **{"max-model-len": 256000}))
    assert set(over) == {"t3_max_tokens_over"} and over["t3_max_tokens_over"].accepted is None
    line = over["t3_max_tokens_over"].line("target bi100, profile replay")
    assert "t3_max_tokens_over" in line and "256000" in line and "131072" in line and "131073" in line
    # 131072 - 2048 = 129024 tokens plus the prompt need the whole window; 65536 + prompt need 65600
    assert set(checks(with_args(bi100("replay"), **{"max-model-len": 129087}))) == {"t3_max_tokens_max"}
    assert checks(with_args(bi100("replay"), **{"max-model-len": 129088})) == {}
    assert set(checks(with_args(bi100("replay"), **{"max-model-len": 65599}))) == {"t3_max_tokens_max",
                                                                                  "t3_max_tokens_mid"}
    # the evaluator's parameter moves the boundaries: 2048 -> reserve 512, max 1536
    small = with_args(bi100("replay"), **{"max-model-len": 2048})
    assert checks(small, max_context_tokens=2048) == {}
    assert set(checks(small, max_context_tokens=4096)) == {"t3_max_tokens_max", "t3_max_tokens_mid"}


def test_n_guard_read_from_the_tree_the_steps_make(tmp_path: Path) -> None:
    guard = n_guard_in_tree(bi100("baseline"), BI100_SCRIPTS)
    assert guard.kept is True and str(SCRIPTS / "serving_chat.py") in guard.where
    one_seq = with_args(bi100("replay"), **{"max-num-seqs": 1})
    risk = checks(one_seq)["t2_n_2"]
    assert "max-num-seqs 1" in risk.message and risk.accepted is None
    # the organisers' folder unset: the guard cannot be read, the risk is still named
    unknown = checks(one_seq, environ={})["t2_n_2"]
    assert "cannot be read" in unknown.message
    # a folder whose serving_chat.py has no guard: n=2 is served, no risk
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "serving_chat.py").write_text((SCRIPTS / "serving_chat.py").read_text().replace(
        "request.n > self.max_num_seqs", "False"))
    assert "t2_n_2" not in checks(one_seq, environ={"IMAGEFORGE_BI100_SCRIPTS": str(folder)})
    # max-num-seqs 2 is fine with the guard; upstream vLLM (the cpu target) has no guard at all
    assert "t2_n_2" not in checks(bi100("replay"))
    cpu = resolve(load_manifest(REPO / "build.yaml"), "cpu", "baseline", environ={})
    assert cpu.serving_args()["max-num-seqs"] == 1 and n_guard_in_tree(cpu, {}).kept is False
    assert "t2_n_2" not in checks(cpu, environ={})


def test_parsers_and_prefix_caching() -> None:
    replay = bi100("replay")
    assert set(checks(with_args(replay, **{"tool-call-parser": None}))) == {"d03_tool_call", "t5_function_calling"}
    assert set(checks(with_args(replay, **{"enable-auto-tool-choice": None}))) == {"d03_tool_call",
                                                                                   "t5_function_calling"}
    assert set(checks(with_args(replay, **{"reasoning-parser": None}))) == {"d07_reasoning_plus_content"}
    assert set(checks(with_args(replay, **{"enable-prefix-caching": False}))) == {"d06_cache_hit"}
    # left out: vLLM 0.6.3's default is off (the V0 engine); upstream 0.8+ turns it on
    left_out = checks(with_args(replay, **{"enable-prefix-caching": None}))
    assert set(left_out) == {"d06_cache_hit"} and "0.6.3" in left_out["d06_cache_hit"].message
    cpu = resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ={})
    assert "d06_cache_hit" not in checks(with_args(cpu, **{"enable-prefix-caching": None}), environ={})


def test_strict_refuses_a_risk_nobody_took() -> None:
    wide = with_args(bi100("replay"), **{"max-model-len": 256000})
    assert report_risks([wide], BI100_SCRIPTS).warnings
    with pytest.raises(ConfigError, match="make an evaluator check fail") as info:
        report_risks([wide], BI100_SCRIPTS, strict=True)
    assert "t3_max_tokens_over" in str(info.value.found)


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """``imageforge ARGS`` with the tool's defaults (no ``IMAGEFORGE_*`` of this process)."""
    return imageforge(*args, env=without_imageforge_settings())


def test_validate_and_plan_call_it() -> None:
    data = json.loads(invoke("validate", "--json", "--strict").stdout)
    assert data["warnings"] == [] and any("accepted evaluator risk t2_n_2" in n for n in data["notes"])
    warned = invoke("plan", "--target", "bi100", "--profile", "replay", "--no-daemon", "--json",
                    "--set", "max-model-len=256000")
    assert warned.returncode == 0, warned.stderr
    warnings = json.loads(warned.stdout)["warnings"]
    assert len(warnings) == 1 and "t3_max_tokens_over" in warnings[0] and "256000" in warnings[0]
    refused = invoke("plan", "--target", "bi100", "--profile", "replay", "--no-daemon", "--strict",
                     "--set", "max-model-len=256000")
    assert refused.returncode == 2 and "t3_max_tokens_over" in refused.stderr and "131072" in refused.stderr
