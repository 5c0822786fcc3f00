"""The bi100 target against the vendor-layout fixture: the baseline runs for real, then every
team step applies to the files as the baseline leaves them; a drifted line fails with its step's name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.integration.bi100_fixture import BASELINE, SITE, site_file, vendor_files, vendor_image
from tests.integration.forge_fixtures import assert_clean_failure, build_containers, client, invoke, settles

pytestmark = pytest.mark.integration

TEAM_STEPS = ["prefill-triton-tuning", "prefix-attention-module", "prefix-attention-call", "sorted-moe-module",
              "sorted-moe-call", "protocol-openai-fields"]


def sandbox_images() -> list[str]:
    # IDs from one list call (images.list inspects each, which fails on one the other worker removes meanwhile)
    script = {"label": "org.imageforge.kind=check-patches-script"}
    return list(client().api.images(all=True, quiet=True, filters=script))


@pytest.fixture(scope="module")
def vendor() -> str:
    return vendor_image()


def env_for(base: str, scripts: Path) -> dict[str, str]:
    return {"IMAGEFORGE_BI100_BASE": base, "IMAGEFORGE_BI100_SCRIPTS": str(scripts)}


def test_check_patches_bi100_every_step_applies_after_the_baseline(vendor: str) -> None:
    before_images, before_containers = set(sandbox_images()), build_containers()
    proc = invoke("check-patches", "--target", "bi100", "--json", env=env_for(vendor, BASELINE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["site"] == SITE and report["package_version"] == "0.6.3+corex.3.2.3"
    rows = {r["step"]: r for r in report["rows"]}
    assert [r["step"] for r in report["rows"]] == ["organisers-baseline", *TEAM_STEPS]
    assert rows["organisers-baseline"]["status"] == "ran", rows["organisers-baseline"]
    assert "baseline files deployed" in rows["organisers-baseline"]["detail"], "patch_ops.sh's last line"
    for step in TEAM_STEPS:
        assert rows[step]["status"] == "applies", rows[step]
    # these anchors exist only after patch_ops.sh: the checks saw the script's result
    assert rows["sorted-moe-call"]["path"] == f"{SITE}/vllm/model_executor/models/qwen3_5.py"
    assert settles(lambda: set(sandbox_images()) <= before_images), "the throwaway image is removed"
    assert settles(lambda: build_containers() <= before_containers), "no container left behind"

    text = invoke("check-patches", "--target", "bi100", "--diff", env=env_for(vendor, BASELINE))
    assert text.returncode == 0, text.stdout + text.stderr
    assert "-        NUM_WARPS = 8" in text.stdout and "+        NUM_WARPS = 4  # imageforge" in text.stdout
    assert "+            return _imageforge_sorted_moe(hidden_states, w13, w2, topk_weights, topk_ids)" in text.stdout
    assert "7 of 7 step(s) ok" in text.stdout and "final state: " in text.stdout
    assert "+    max_completion_tokens: Optional[int] = None" in text.stdout


def test_one_line_indented_differently_fails_with_its_step_and_the_near_line(vendor: str) -> None:
    rel = site_file("vllm/attention/ops/prefix_prefill.py")
    original = vendor_files()[rel].decode()
    drifted = original.replace("        NUM_WARPS = 8\n", "    NUM_WARPS = 8\n")
    assert drifted != original
    wanted_line = drifted.splitlines().index("    NUM_WARPS = 8") + 1
    image = vendor_image(overrides={rel: drifted})
    try:
        proc = invoke("check-patches", "--target", "bi100", env=env_for(image, BASELINE))
        assert_clean_failure(proc, 3)
        out = proc.stdout + proc.stderr
        row = next(line for line in proc.stdout.splitlines() if "prefill-triton-tuning" in line)
        assert "anchor missing" in row, proc.stdout
        assert f"near line {wanted_line - 1} " in proc.stdout or f"near line {wanted_line} " in proc.stdout, out
        assert "1 step(s) would fail" in out and "prefill-triton-tuning: anchor missing" in proc.stderr, out
        # the steps after it were still checked
        assert all(f"{step}" in proc.stdout for step in TEAM_STEPS[1:])
    finally:
        client().images.remove(image, force=True)


def test_a_failing_script_reports_its_exit_code_and_tail_and_skips_the_rest(vendor: str, tmp_path: Path) -> None:
    scripts = tmp_path / "qwen3_6_scripts"
    shutil.copytree(BASELINE, scripts)
    (scripts / "patch_ops.sh").write_text(
        "#!/bin/bash\necho \"cwd=$(pwd)\"\nls /sys/class/net\necho 'pip: no network'\nexit 7\n")
    before = set(sandbox_images())
    proc = invoke("check-patches", "--target", "bi100", "--json", env=env_for(vendor, scripts))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    rows = {r["step"]: r for r in json.loads(proc.stdout)["rows"]}
    script = rows["organisers-baseline"]
    assert script["status"] == "script failed" and script["ok"] is False
    assert script["detail"].startswith("exit code 7")
    tail = script["log_tail"]
    assert "cwd=/workspace/qwen3_6_scripts" in tail, "the script runs inside the copied folder"
    assert "lo" in tail and not any(line.startswith("eth") for line in tail), "network off: loopback only"
    assert tail[-1] == "pip: no network"
    for step in TEAM_STEPS:
        assert rows[step]["status"] == "not checked" and rows[step]["detail"] == "not checked (a script before failed)"
    assert settles(lambda: set(sandbox_images()) <= before), "a failed script leaves no image"
    text = invoke("check-patches", "--target", "bi100", env=env_for(vendor, scripts))
    assert_clean_failure(text, 3)
    assert "| pip: no network" in text.stdout, "the log tail is printed under the row"


def test_unset_scripts_folder_is_exit_5_with_the_hint(vendor: str) -> None:
    proc = invoke("check-patches", "--target", "bi100", env={"IMAGEFORGE_BI100_BASE": vendor,
                                                             "IMAGEFORGE_BI100_SCRIPTS": ""})
    assert_clean_failure(proc, 5)
    assert "IMAGEFORGE_BI100_SCRIPTS, which is not set" in proc.stderr
    build = invoke("build", "--target", "bi100", env={"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": ""})
    assert_clean_failure(build, 5)
    assert "IMAGEFORGE_BI100_SCRIPTS, which is not set" in build.stderr
    assert "qwen3_6_scripts" in build.stderr, "the load hint"
