"""The ``native`` step kind: its apply on an in-memory image, its facts, its load, and the submission applier's op.

The extensions are the real ELF fixtures of test_elfcheck (compiled by the host's C compiler); a stale pin and an
unpinned binary are planted in the step's folder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.errors import Location
from imageforge.manifest.model import Step
from imageforge.steps import ApplyContext, Changes, FileChange, StepProblem, kind
from imageforge.steps.native import NativeSpec, native_findings
from imageforge.submission.applier import applier_source
from tests.unit import test_elfcheck as elf
from tests.unit.test_elfcheck import CC, SITE, image

built = elf.built  # the compiled ELF fixtures (a module fixture of test_elfcheck)

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this host")

NAME = "good.cpython-311-x86_64-linux-gnu.so"
DEST = f"pkg/{NAME}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def native_step(folder: Path, pins: dict[str, str]) -> Step:
    spec = NativeSpec(directory="native", extensions=tuple({"file": f, "dest": f"pkg/{f}", "sha256": h,
                                                            "python": True} for f, h in pins.items()),
                      interpreter="/usr/bin/python3", loaded_before=("torch/lib/libbefore.so",))
    return Step("moe-group", "native", None, Location("build.yaml", 9), "targets.t.steps[2]", None, spec,
                directory_path=folder)


def test_apply_installs_the_pinned_file_and_its_facts_are_the_pins(tmp_path: Path, built: dict[str, bytes]) -> None:
    (tmp_path / NAME).write_bytes(built["good"])
    (tmp_path / "moe_group.cpp").write_text("// the source stays in the folder\n")
    step = native_step(tmp_path, {NAME: sha(built["good"])})
    fs = image(built)
    changes = kind("native").apply(step, fs, ApplyContext(site=SITE))
    assert changes == Changes("applies", f"{SITE}/{DEST}", "1 pinned extension(s), ELF checks passed",
                              f"installed 1 pinned extension(s): {NAME}",
                              files=(FileChange(f"{SITE}/{DEST}", built["good"], 0o755),))
    assert kind("native").facts(step, {}, SITE).overlays == {f"{SITE}/{DEST}": sha(built["good"])}
    fs.files[f"{SITE}/{DEST}"] = built["good"]
    assert kind("native").apply(step, fs, ApplyContext(site=SITE, checking=True)).status == "already applied"
    assert kind("native").touches(step, SITE) == (f"{SITE}/{DEST}",)


def test_a_stale_pin_and_an_unpinned_binary_are_findings(tmp_path: Path, built: dict[str, bytes]) -> None:
    (tmp_path / NAME).write_bytes(built["good"])
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "leftover.so").write_bytes(built["no-pyinit"])
    step = native_step(tmp_path, {NAME: "0" * 64})
    found = native_findings(step, image(built), SITE, {})
    assert [(f.code, f.path) for f in found] == [("pin-mismatch", NAME), ("unpinned", "old/leftover.so")]
    assert found[0].message == (f"sha256 {sha(built['good'])} is not its pin {'0' * 64} (a stale pin: imageforge "
                                "native build rewrites the pins)")
    with pytest.raises(StepProblem) as caught:
        kind("native").apply(step, image(built), ApplyContext(site=SITE, checking=True))
    assert caught.value.status == "fails its checks" and "2 finding(s)" in caught.value.error.message
    assert "unpinned: old/leftover.so" in str(caught.value.error.found)


def test_an_elf_defect_fails_the_step_naming_it(tmp_path: Path, built: dict[str, bytes]) -> None:
    (tmp_path / NAME).write_bytes(built["undefined"])
    step = native_step(tmp_path, {NAME: sha(built["undefined"])})
    with pytest.raises(StepProblem) as caught:
        kind("native").apply(step, image(built), ApplyContext(site=SITE))
    assert "undefined symbol ixformer::infer()" in caught.value.detail
    missing = native_step(tmp_path, {"absent.so": "1" * 64, NAME: sha(built["undefined"])})
    assert [f.code for f in native_findings(missing, image(built), SITE, {})][:1] == ["file-missing"]


def test_the_submission_applier_copies_only_a_file_that_is_its_pin(tmp_path: Path, built: dict[str, bytes]) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "apply.py").write_text(applier_source())
    (stage / "00-good.so").write_bytes(built["good"])
    dest = tmp_path / "root" / "site" / "pkg" / NAME
    spec = {"op": "install", "step": "moe-group", "site": str(tmp_path / "root" / "site"),
            "files": [{"source": "00-good.so", "path": str(dest), "sha256": sha(built["good"]), "mode": 0o755}]}
    (stage / "step.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(stage / "apply.py"), str(stage / "step.json")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert dest.read_bytes() == built["good"] and dest.stat().st_mode & 0o777 == 0o755
    assert f"installed {dest} (sha256 {sha(built['good'])[:12]}, its pin)" in done.stdout
    stage.mkdir()
    (stage / "apply.py").write_text(applier_source())
    (stage / "00-good.so").write_bytes(built["no-pyinit"])  # not the pinned bytes
    (stage / "step.json").write_text(json.dumps(spec))
    bad = subprocess.run([sys.executable, str(stage / "apply.py"), str(stage / "step.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 3 and f"not its pin {sha(built['good'])}" in bad.stderr
    assert dest.read_bytes() == built["good"]
