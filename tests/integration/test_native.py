"""The cpu target's native step for real: the pinned extension against the cpu base, installed by the image build,
and built again in a box by `native build --in-place`.

* the checks without the device read the real base image's libraries (a container of it, never started): the pinned
  extension passes; a planted reference to a c10 function the base's torch does not define is named, demangled;
* the image build installs the pinned bytes, and inside the image the extension (imported after torch) groups as
  ``torch.sort(stable=True)`` + ``searchsorted`` do, through the patched ``sort_pairs`` too (native_probe.py);
* the session's box (a container of the cpu base with imageforge installed offline: box_fixture; this file runs in
  the in-place group, after the in-place files) builds it with the base's toolchain stage and ``--check`` says the
  committed pin is what a fresh build makes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge.docker_engine import client
from imageforge.steps import ContainerFS
from imageforge.steps.native import elf_findings, native_findings
from tests.cli import imageforge
from tests.integration import helpers
from tests.integration.box_fixture import Box

pytestmark = pytest.mark.integration

REPO = helpers.REPO
SITE = "/opt/venv/lib/python3.11/site-packages"
STEP = "moe-group-kernel"


@pytest.fixture(scope="module")
def cpu_resolved_here(docker_ready: None) -> Any:
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve

    return resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={})


@pytest.fixture(scope="module")
def base_fs(docker_ready: None) -> Iterator[ContainerFS]:
    container = client().containers.create(helpers.cpu_base_refs()[1], command=["true"], network_disabled=True,
                                           labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test"})
    try:
        yield ContainerFS(container, pristine=True)  # created from the base, only read
    finally:
        container.remove(force=True)


def native_step(resolved: Any) -> Any:
    return next(s for s in resolved.steps if s.id == STEP)


def test_the_pinned_extension_passes_every_check_against_the_cpu_base(cpu_resolved_here: Any,
                                                                        base_fs: ContainerFS) -> None:
    assert native_findings(native_step(cpu_resolved_here), base_fs, SITE, {}) == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this host")
def test_a_c10_symbol_the_base_does_not_define_is_named(cpu_resolved_here: Any, base_fs: ContainerFS,
                                                        tmp_path: Path) -> None:
    step = native_step(cpu_resolved_here)
    folder = tmp_path / "native"
    folder.mkdir()
    name = "imageforge_moe_group.cpython-311-x86_64-linux-gnu.so"
    src = tmp_path / "planted.c"
    src.write_text("extern void _ZN3c106detail17imageforgeMissingEv(void);\n"
                   "extern void *PyModule_Create2(void *, int);\n"
                   "void *PyInit_imageforge_moe_group(void) { _ZN3c106detail17imageforgeMissingEv();"
                   " return PyModule_Create2(0, 3); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(src),
                    f"-I{sysconfig.get_paths()['include']}"], check=True)
    planted = type(step)(**{**step.__dict__, "directory_path": folder})
    found = elf_findings(planted, base_fs, SITE, {})
    assert [f.message for f in found] == [
        "undefined symbol c10::detail::imageforgeMissing() (_ZN3c106detail17imageforgeMissingEv) is defined by no "
        "library of the DT_NEEDED closure nor one loaded before"]


def test_the_image_build_installs_the_pinned_file_and_it_groups_like_torch_sort(docker_ready: None) -> None:
    done = imageforge("build", "--target", "cpu", "--json", expect=0, timeout=1800)
    image = json.loads(done.stdout)["image_id"]
    container = client().containers.create(
        image, entrypoint=["python", "-B", "/tmp/native_probe.py"], network_disabled=True,
        environment={"VLLM_TARGET_DEVICE": "cpu"},
        labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test"})
    try:
        from imageforge.docker_engine.containers import file_entry, tar_of

        probe = (Path(__file__).parent / "native_probe.py").read_bytes()
        entry = file_entry("/tmp/native_probe.py", probe, mode=0o644)
        assert container.put_archive("/", tar_of([entry], {entry.name: probe}))
        container.start()
        code = container.wait(timeout=300)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        assert code == 0, container.logs(stdout=False, stderr=True).decode()[-3000:]
    finally:
        container.remove(force=True)
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"cases": 4, "refuses_out_of_range": True,
                      "file": f"{SITE}/vllm/model_executor/layers/fused_moe/"
                              "imageforge_moe_group.cpython-311-x86_64-linux-gnu.so",
                      "doc": "group_by_expert(topk_ids: torch.Tensor, num_experts: typing.SupportsInt | "
                             "typing.SupportsIndex) -> list[torch.Tensor]"}


@pytest.mark.timeout(2400)
def test_built_in_the_box_a_fresh_build_matches_the_committed_pin(box: Box) -> None:
    """In the session's box (tests/integration/conftest.py), after the in-place files: --check writes nothing."""
    _, out, _ = box.imageforge("native build --target cpu --step moe-group-kernel --in-place "
                               "--python /opt/venv/bin/python --check --json", timeout=1800)  # exit 0, or it fails
    report = json.loads(out)  # stdout is the JSON document alone: the build's own output went to stderr
    assert report["findings"] == [] and [p["changed"] for p in report["pins"]] == [False]
    assert report["imports"]["modules"][0]["functions"] == {
        "group_by_expert": "group_by_expert(topk_ids: torch.Tensor, num_experts: typing.SupportsInt | "
                           "typing.SupportsIndex) -> list[torch.Tensor]"}
