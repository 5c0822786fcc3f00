"""check-patches and patch-from against real images (the cpu base, and the tiny test base)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from imageforge.labels import L_TARGET
from imageforge.patches.from_text import apply_steps
from imageforge.steps import PatchSpec
from tests.integration.forge_fixtures import (
    ATTN,
    REPO,
    assert_clean_failure,
    build_containers,
    client,
    invoke,
    read_from_image,
    settles,
    tiny_base,
    write_manifest,
)
from tests.integration.helpers import labelled

pytestmark = pytest.mark.integration

PREFIX_PREFILL = "vllm/v1/attention/ops/prefix_prefill.py"


@pytest.fixture(scope="module")
def cpu_base() -> str:
    from imageforge.base import base_image_status

    status = base_image_status(REPO / "images" / "cpu")
    if not status.vllm_present:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    return status.ref


def test_check_patches_cpu_target(cpu_base: str) -> None:
    before = build_containers()
    proc = invoke("check-patches", "--target", "cpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    rows = {r["step"]: r for r in report["rows"]}
    assert rows["prefill-base-block"]["status"] == "applies"
    assert rows["prefill-num-warps"]["status"] == "applies", "the second patch of the same file sees the first"
    assert report["package_version"] == "0.32.0" and report["base"]["reference"] == cpu_base
    assert all(r["ok"] for r in report["rows"])
    assert settles(lambda: build_containers() <= before), "no container left behind"
    text = invoke("check-patches", "--target", "cpu", "--diff")
    assert text.returncode == 0
    assert "-BASE_BLOCK = 128 if current_platform.has_device_capability(80) else 64" in text.stdout
    assert "+NUM_WARPS = 4  # imageforge" in text.stdout


def test_check_patches_reports_every_failure(tmp_path: Path) -> None:
    steps = """\
          - id: extra
            kind: overlay
            source: overlays/extra.py
            dest: vllm/ops/extra.py
          - id: block
            kind: patch
            file: vllm/ops/attn.py
            old: "BLOCK = 128 if True else 64"
            new: "BLOCK = 64"
          - id: block-again
            kind: patch
            file: vllm/ops/attn.py
            old: "BLOCK = 64\\nNUM_WARPS = 8"
            new: "BLOCK = 64\\nNUM_WARPS = 4"
          - id: drifted
            kind: patch
            file: vllm/ops/attn.py
            old: "NUM_WARPS = 16"
            new: "NUM_WARPS = 2"
          - id: twice
            kind: patch
            file: vllm/ops/attn.py
            old: "    return q"
            new: "    return k"
          - id: moved
            kind: overlay
            source: overlays/extra.py
            dest: vllm/layers/gone/extra.py
          - id: nofile
            kind: patch
            file: vllm/ops/nothere.py
            old: "a"
            new: "b"
"""
    manifest, target = write_manifest(tmp_path / "m", tiny_base(), steps=steps)
    images_before = {i.id for i in client().images.list(all=True, filters={"label": f"org.imageforge.target={target}"})}
    proc = invoke("check-patches", "--manifest", str(manifest), "--diff")
    assert_clean_failure(proc, 3)
    out = proc.stdout
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln[:1].isdigit()}
    assert "applies" in lines["block"] and "applies" in lines["block-again"]
    assert "anchor missing" in lines["drifted"]
    assert "near line 4" in out and "NUM_WARPS = 8" in out, "near-matches for a missing anchor"
    assert "ambiguous" in lines["twice"] and "2 times" in lines["twice"]
    assert "destination missing" in lines["moved"] and "destination missing" in lines["nofile"]
    assert "-NUM_WARPS = 8\n+NUM_WARPS = 4" in out, "--diff on the in-memory copy, after the first patch"
    assert "4 would fail" in out
    assert "drifted: anchor missing" in proc.stderr
    # nothing built, nothing left
    assert {i.id for i in client().images.list(all=True, filters={"label": f"org.imageforge.target={target}"})} \
        == images_before
    assert labelled({L_TARGET: target}) == []


def test_check_patches_without_the_vendor_base() -> None:
    env = {k: v for k, v in os.environ.items() if k != "IMAGEFORGE_BI100_BASE"}
    env["IMAGEFORGE_BI100_BASE"] = ""
    proc = invoke("check-patches", "--target", "bi100", env=env)
    assert_clean_failure(proc, 5)
    assert "IMAGEFORGE_BI100_BASE" in proc.stderr and "docker load -i" in proc.stderr


def test_patch_from_cpu_file_reproduces_the_edit(cpu_base: str, tmp_path: Path) -> None:
    """The printed steps, applied to the file as the target's steps leave it, give the edited file exactly."""
    from imageforge.manifest.load import load_manifest

    site = "/opt/venv/lib/python3.11/site-packages"
    pristine = read_from_image(cpu_base, f"{site}/{PREFIX_PREFILL}").decode()
    cpu = load_manifest(REPO / "build.yaml").targets["cpu"]
    existing = [s.definition() for s in cpu.steps if isinstance(s.spec, PatchSpec) and s.spec.file == PREFIX_PREFILL]
    original = apply_steps(pristine, existing)
    lines = original.splitlines(keepends=True)
    # three edits: change a line, insert after the imports, delete one near the end
    first_def = next(i for i, ln in enumerate(lines) if ln.startswith("def "))
    edited_lines = list(lines)
    edited_lines[first_def] = edited_lines[first_def].replace("def ", "def  ", 1)
    edited_lines.insert(3, "IMAGEFORGE_MARK = 1\n")
    del edited_lines[-3]
    edited = "".join(edited_lines)
    path = tmp_path / "prefix_prefill.py"
    path.write_text(edited)
    proc = invoke("patch-from", "--target", "cpu", "--file", PREFIX_PREFILL, "--edited", str(path))
    assert proc.returncode == 0, proc.stderr
    steps = yaml.safe_load(proc.stdout)
    assert 1 <= len(steps) <= 3
    assert all(s["kind"] == "patch" and s["file"] == PREFIX_PREFILL for s in steps)
    assert apply_steps(original, steps) == edited
    assert "Paste at the end of targets.cpu.steps" in proc.stdout
    # --base-only diffs against the pristine file: the existing patches show up as changes too
    base_only = invoke("patch-from", "--target", "cpu", "--file", f"{site}/{PREFIX_PREFILL}", "--edited", str(path),
                       "--base-only")
    steps_b = yaml.safe_load(base_only.stdout)
    assert apply_steps(pristine, steps_b) == edited


def test_patch_from_output_pasted_builds_the_edited_file(tmp_path: Path) -> None:
    """End to end on the tiny base: edit, patch-from, paste into the manifest, build; the image has the edit."""
    base = tiny_base()
    manifest, target = write_manifest(tmp_path / "m", base)
    edited = ATTN.replace("NUM_WARPS = 8", "NUM_WARPS = 4").replace(
        "def other(q, k):\n    return q", "def other(q, k):\n    return k").replace("BLOCK = 128 if True else 64",
                                                                                "BLOCK = 32")
    edited += "\n\nADDED = True\n"
    local = tmp_path / "attn.py"
    local.write_text(edited)
    proc = invoke("patch-from", "--manifest", str(manifest), "--file", "vllm/ops/attn.py", "--edited", str(local))
    assert proc.returncode == 0, proc.stderr
    doc = manifest.read_text()
    anchor = "          - id: script\n"
    doc = doc.replace("    verify:\n", proc.stdout + "    verify:\n", 1)
    assert anchor.strip() in doc
    manifest.write_text(doc)
    check = invoke("check-patches", "--manifest", str(manifest))
    assert check.returncode == 0, check.stdout + check.stderr
    invoke("build", "--manifest", str(manifest), check=True)
    built = read_from_image(f"imageforge-test/{target}:small",
                            "/usr/local/lib/python3.11/dist-packages/vllm/ops/attn.py").decode()
    assert built == edited
