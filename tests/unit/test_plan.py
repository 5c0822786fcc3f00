"""Plan: chained cache keys, rendering; a fake probe stands in for the daemon."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.plan import chain_key, format_plan, make_plan


class FakeProbe:
    def __init__(self, known: set[str]) -> None:
        self.known = known

    def base_image_id(self, reference: str) -> str | None:
        return "sha256:" + "b" * 64

    def lookup(self, key: str) -> str | None:
        return "sha256:" + key if key in self.known else None


def plan_for(path: Path, profile: str | None = None, probe: FakeProbe | None = None, sets: list[str] | None = None):  # type: ignore[no-untyped-def]
    r = resolve(load_manifest(path), "t", profile, environ={}, sets=sets or [])
    return make_plan(r, environ={}, probe=probe)


def test_plan_without_daemon_is_unknown(write_manifest: Callable[..., Path]) -> None:
    plan = plan_for(write_manifest())
    assert [s.cache for s in plan.steps] == ["UNKNOWN"] * 4
    assert [s.kind for s in plan.steps] == ["overlay", "patch", "verify", "config"]
    data = plan.to_json()
    assert data["target"] == "t" and data["profile"] == "small" and data["serving"]["max-num-seqs"] == 2
    assert {"id", "kind", "cache"} <= set(data["steps"][0])
    assert "cache: UNKNOWN" in format_plan(plan)


def test_keys_chain_and_profile_change_touches_only_config(write_manifest: Callable[..., Path]) -> None:
    path = write_manifest()
    small = plan_for(path, "small", FakeProbe(set()))
    big = plan_for(path, "big", FakeProbe(set()))
    assert [s.key for s in small.steps[:3]] == [s.key for s in big.steps[:3]]
    assert small.steps[3].key != big.steps[3].key
    assert all(s.cache == "MISS" for s in small.steps)
    known = {s.key for s in small.steps if s.key}
    assert all(s.cache == "HIT" for s in plan_for(path, "small", FakeProbe(known)).steps)
    assert [s.cache for s in plan_for(path, "big", FakeProbe(known)).steps] == ["HIT", "HIT", "HIT", "MISS"]


def test_overlay_bytes_change_the_key_and_everything_after(write_manifest: Callable[..., Path]) -> None:
    path = write_manifest()
    before = plan_for(path, probe=FakeProbe(set()))
    (path.parent / "overlays" / "x.py").write_text("X = 2\n")
    after = plan_for(path, probe=FakeProbe(set()))
    assert all(a.key != b.key for a, b in zip(before.steps, after.steps, strict=True))


def test_set_changes_only_the_config_key(write_manifest: Callable[..., Path]) -> None:
    path = write_manifest()
    a = plan_for(path, probe=FakeProbe(set()))
    b = plan_for(path, probe=FakeProbe(set()), sets=["max-num-seqs=5"])
    assert [s.key for s in a.steps[:3]] == [s.key for s in b.steps[:3]] and a.final.key != b.final.key
    assert yaml.safe_load(b.serving_config)["max-num-seqs"] == 5
    # A variant never takes the profile's own tags.
    assert a.tags[0] == "imageforge/t:small" and len(b.tags) == 1
    assert b.tags[0].startswith("imageforge/t:small-custom-")
    c = plan_for(path, probe=FakeProbe(set()), sets=["max-num-seqs=6"])
    assert c.tags != b.tags


def test_a_false_boolean_reaches_vllm_serve_as_no_flag(write_manifest: Callable[..., Path]) -> None:
    """vLLM's config loader drops `FLAG: false` for `vllm serve` (the default stays on): the file says no-FLAG."""
    path = write_manifest()
    text = path.read_text().replace("enforce-eager: true}", "enforce-eager: true, enable-prefix-caching: true}")
    path.write_text(text)
    plan = plan_for(path, probe=FakeProbe(set()), sets=["enable-prefix-caching=false"])
    doc = yaml.safe_load(plan.serving_config)
    assert doc["no-enable-prefix-caching"] is True and "enable-prefix-caching" not in doc
    assert doc["enforce-eager"] is True and doc["max-num-seqs"] == 2
    assert plan.resolved.serving_args()["enable-prefix-caching"] is False  # the manifest's own spelling is kept
    assert list(doc) == [*(("no-" + k) if v is False else k for k, v in plan.resolved.serving_args().items())]


def test_chain_key_is_canonical() -> None:
    assert chain_key("p", {"a": 1, "b": 2}, {}) == chain_key("p", {"b": 2, "a": 1}, {})
    assert chain_key("p", {"a": 1}, {}) != chain_key("q", {"a": 1}, {})
