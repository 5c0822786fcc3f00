"""The one precedence chain: manifest -> profile chain -> IMAGEFORGE_SET -> --set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imageforge.errors import ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.model import Manifest
from imageforge.manifest.resolve import Resolved, parse_assignments, resolve, validate_all


@pytest.fixture
def manifest(write_manifest: Callable[..., Path]) -> Manifest:
    return load_manifest(write_manifest())


def values(r: Resolved) -> dict[str, tuple[Any, str]]:
    return {v.key: (v.value, v.source) for v in r.serving}


def test_default_profile_and_sources(manifest: Manifest) -> None:
    r = resolve(manifest, None, None, environ={})
    assert r.profile_name == "small"
    assert values(r)["max-num-seqs"] == (2, "profile:small")
    assert values(r)["model"] == ("/m", "manifest")


def test_extends_chain_applies_ancestors_first(manifest: Manifest) -> None:
    r = resolve(manifest, "t", "big", environ={})
    assert values(r)["max-num-seqs"] == (64, "profile:big")
    assert values(r)["gpu-memory-utilization"] == (0.95, "profile:big")


def test_env_then_cli_precedence(manifest: Manifest) -> None:
    env = {"IMAGEFORGE_SET": "max-num-seqs=16 gpu-memory-utilization=0.8"}
    r = resolve(manifest, "t", "big", environ=env, sets=["serving.max-num-seqs=32"])
    assert values(r)["max-num-seqs"] == (32, "cli:--set")
    assert values(r)["gpu-memory-utilization"] == (0.8, "env:IMAGEFORGE_SET")
    serving = r.serving_args()
    assert serving["max-num-seqs"] == 32


def test_float_accepts_int_and_env_and_run_keys(manifest: Manifest) -> None:
    r = resolve(manifest, "t", None, environ={}, sets=["gpu-memory-utilization=1", "env.FOO=bar", "run.port=9000"])
    assert values(r)["gpu-memory-utilization"] == (1.0, "cli:--set")
    assert r.serving_env() == {"FOO": "bar"}
    assert r.run.port == 9000


def test_unknown_set_key_did_you_mean(manifest: Manifest) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(manifest, "t", None, environ={}, sets=["max-num-seq=4"])
    assert info.value.message == "cli:--set: unknown key 'max-num-seq'"
    assert info.value.hint == "did you mean 'max-num-seqs'?"
    assert info.value.exit_code == 2


def test_wrong_type_set(manifest: Manifest) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(manifest, "t", None, environ={}, sets=["max-num-seqs=lots"])
    err = info.value
    assert err.message == "cli:--set: wrong type for 'max-num-seqs'"
    assert (err.expected, err.found) == ("integer", "string 'lots'")
    with pytest.raises(ConfigError):
        resolve(manifest, "t", None, environ={}, sets=["enforce-eager=3"])
    with pytest.raises(ConfigError):
        resolve(manifest, "t", None, environ={}, sets=["run.port=http"])


def test_malformed_assignment(manifest: Manifest) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(manifest, "t", None, environ={"IMAGEFORGE_SET": "max-num-seqs"})
    assert info.value.message == "env:IMAGEFORGE_SET: cannot read 'max-num-seqs'"


def test_unknown_profile_and_target(manifest: Manifest) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(manifest, "t", "bgi", environ={})
    assert info.value.message == "unknown profile 'bgi' for target 't'"
    assert info.value.hint == "did you mean 'big'?"
    with pytest.raises(ConfigError) as info:
        resolve(manifest, "x", None, environ={})
    assert info.value.message == "unknown target 'x'"


def test_parse_assignments_types() -> None:
    parsed = parse_assignments(["a=1", "b=0.5", "c=true", "d=text", "e=", "f=a=b"], "cli")
    assert [(k, v) for k, v, _ in parsed] == [("a", 1), ("b", 0.5), ("c", True), ("d", "text"), ("e", ""),
                                              ("f", "a=b")]


def test_repo_manifest_profiles_match_the_notes() -> None:
    summary = validate_all(load_manifest(Path(__file__).resolve().parents[2] / "build.yaml"))
    m = summary.manifest
    # bi100 (facts note): the organisers' baseline, then one-request-at-a-time profiles; the default
    # keeps to the evaluator's max_context_tokens, replay-256k takes every replay input
    expect = {"baseline": (1, 8192, 0.9, 100000), "replay": (2, 8192, 0.9, 131072),
              "replay-256k": (2, 8192, 0.9, 256000), "replay-big-chunks": (2, 16384, 0.9, 131072)}
    for profile, (seqs, tokens, util, length) in expect.items():
        args = resolve(m, "bi100", profile, environ={}).serving_args()
        assert (args["max-num-seqs"], args["max-num-batched-tokens"], args["gpu-memory-utilization"],
                args["max-model-len"]) == (seqs, tokens, util, length)
    assert summary.to_json()["ok"] is True
