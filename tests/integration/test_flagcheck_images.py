"""Serving flags learnt from real images: the bi100 fixture read statically after the fake baseline,
the cpu base introspected by its own vLLM; then ``invoke validate`` / ``plan`` use what was learnt.

Each test keeps its flag cache in its own folder (``IMAGEFORGE_CACHE`` passed in the environ given to
imageforge.flags.images, and to ``invoke validate``, which reads nothing else from the cache). Manifest variants
are written beside build.yaml (their relative paths must resolve as the repository's do) and removed after.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.flags.images import flags_cache_dir, learn_flags
from imageforge.manifest.load import load_manifest
from tests.integration.bi100_fixture import BASELINE, vendor_image
from tests.integration.forge_fixtures import REPO, assert_clean_failure, client, invoke, settles
from tests.integration.helpers import this_session

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vendor() -> str:
    return vendor_image()


@pytest.fixture
def variant() -> Iterator[Path]:
    path = REPO / f".flagcheck-test-{secrets.token_hex(4)}.yaml"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def line_of(path: Path, text: str, after: str = "") -> int:
    lines = path.read_text().splitlines()
    start = lines.index(after) if after else 0
    return next(i for i, line in enumerate(lines, 1) if i > start and text in line)


def flag_containers() -> list[object]:
    return this_session(client().containers.list(all=True, ignore_removed=True,
                                                 filters={"label": "org.imageforge.kind=flags"}))



def sandbox_images() -> set[str]:
    # IDs from one list call (images.list inspects each, which fails on one the other worker removes meanwhile)
    return set(client().api.images(all=True, quiet=True, filters={"label": "org.imageforge.kind=check-patches-script"}))


def test_bi100_flags_are_read_statically_after_the_baseline(vendor: str, tmp_path: Path) -> None:
    env = {"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": str(BASELINE),
           "IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    images_before = sandbox_images()
    table = learn_flags(load_manifest(REPO / "build.yaml"), "bi100", environ={**os.environ, **env})
    assert table is not None
    assert table.source == "the vLLM 0.6.3+corex.3.2.3 parser source after step organisers-baseline"
    reasoning, tools = table.get("reasoning-parser"), table.get("tool-call-parser")
    assert reasoning is not None and reasoning.choices == ("qwen3",)  # the baseline's cli_args.py
    assert tools is not None and "qwen3_coder" in tools.choices
    assert reasoning.origin is not None and reasoning.origin.startswith("vllm/entrypoints/openai/cli_args.py:")
    seqs = table.get("max-num-seqs")
    assert seqs is not None and seqs.type == "int" and seqs.origin is not None
    assert seqs.origin.startswith("vllm/engine/arg_utils.py:")  # the vendor's engine args, untouched
    assert list(flags_cache_dir({"IMAGEFORGE_CACHE": str(tmp_path / "cache")}).glob("*-static.json"))
    assert settles(lambda: sandbox_images() <= images_before), "the baseline's throwaway image is removed"

    proc = invoke("validate", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("target bi100: serving flags checked against the vLLM 0.6.3+corex.3.2.3 parser source after step "
            "organisers-baseline (cached)") in proc.stdout


def test_bi100_without_the_baseline_step_does_not_know_reasoning_parser(vendor: str, tmp_path: Path,
                                                                       variant: Path) -> None:
    text = (REPO / "build.yaml").read_text()
    start = text.index("      - id: organisers-baseline\n")
    end = text.index("      - id: ", start + 10)
    variant.write_text(text[:start] + text[end:])
    env = {"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": str(BASELINE),
           "IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    proc = invoke("plan", "--target", "bi100", "--manifest", str(variant), env=env)
    assert_clean_failure(proc, 2)
    line = line_of(variant, "        reasoning-parser: qwen3", after="  bi100:")
    assert f"{variant.name}:{line}:" in proc.stderr, proc.stderr
    assert "targets.bi100.serving.args.reasoning-parser: unknown serving flag 'reasoning-parser'" in proc.stderr
    assert "a flag of the vLLM 0.6.3+corex.3.2.3 parser source" in proc.stderr
    assert "tool-call-parser" not in proc.stderr  # the vendor's --tool-call-parser takes any name


def test_cpu_flags_by_introspection_then_validate_finds_the_issue_mistakes(tmp_path: Path, variant: Path) -> None:
    from imageforge.base import base_image_status

    if not base_image_status(REPO / "images" / "cpu").vllm_present:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    env = {"IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    table = learn_flags(load_manifest(REPO / "build.yaml"), "cpu", environ={**os.environ, **env})
    assert table is not None and table.source.startswith("vLLM 0.32.0's parser (")
    assert settles(lambda: flag_containers() == []), "the introspection container is removed"

    assert invoke("validate", env=env).returncode == 0  # the repository's cpu target passes

    text = (REPO / "build.yaml").read_text()
    for old, new in [
        ("        max-num-seqs: 8\n        max-num-batched-tokens: 2048\n",
         "        max-num-seq: 8\n        gpu-memory-utilization: 1.5\n        max-num-batched-tokens: 2048\n"),
        ("        args: {max-num-seqs: 8}\n", '        args: {max-num-seqs: "8"}\n'),
        ("        args: {max-num-seqs: 32, max-num-batched-tokens: 4096}\n",
         "        args: {max-num-seqs: many, max-num-batched-tokens: 4096}\n"),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    variant.write_text(text)
    proc = invoke("validate", "--manifest", str(variant), env=env)
    assert_clean_failure(proc, 2)
    err = proc.stderr
    expected = [
        ("max-num-seq: 8", "targets.cpu.serving.args.max-num-seq: unknown serving flag 'max-num-seq'"),
        ("gpu-memory-utilization: 1.5", "targets.cpu.serving.args.gpu-memory-utilization: "
                                        "gpu-memory-utilization is out of range"),
        ('max-num-seqs: "8"', "targets.cpu.profiles.conservative.args.max-num-seqs: "
                              "max-num-seqs takes an integer >= 1"),
        ("max-num-seqs: many", "targets.cpu.profiles.aggressive.args.max-num-seqs: "
                               "max-num-seqs takes an integer >= 1"),
    ]
    for line_text, message in expected:
        assert f"{variant.name}:{line_of(variant, line_text)}:" in err and message in err, (line_text, err)
    assert "did you mean 'max-num-seqs'" in err
    assert "write it without quotes: 8" in err

    # plan (daemon or not), build and the submission entry point refuse the same manifest before any build work
    quoted = 'max-num-seqs: "8"'
    conservative_line = f"{variant.name}:{line_of(variant, quoted)}:"
    for args in (["plan", "--target", "cpu", "--manifest", str(variant), "--no-daemon"],
                 ["plan", "--target", "cpu", "--manifest", str(variant)],
                 ["build", "--target", "cpu", "--manifest", str(variant)]):
        proc = invoke(*args, env=env)
        assert_clean_failure(proc, 2)
        assert conservative_line in proc.stderr and "unknown serving flag 'max-num-seq'" in proc.stderr, proc.stderr
    out = tmp_path / "submission"
    proc = invoke("submission", "--target", "cpu", "--manifest", str(variant), "--out", str(out), env=env)
    assert_clean_failure(proc, 2)
    assert conservative_line in proc.stderr and not out.exists()
