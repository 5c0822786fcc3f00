"""A patch that "applies" leaves code that compiles, on the bi100 vendor-layout fixture.

Two baseline variants (the organisers' folder copied, its ``qwen3_5.py`` changed) make ``sorted-moe-call``
fail the way a real drift would, and each must fail at that step, with the same message, in all three
faces: ``check-patches`` (its row), ``build`` (exit 3) and the emitted submission tree's plain
``docker build`` (``imageforge: step sorted-moe-call failed: ...``):

* **deeper**: the loop one level deeper (16 spaces): the 12-space two-line anchor is missing, and the message
  says which line holds its first line at which indentation (a one-line anchor matching only *inside* a deeper
  line is ``inside line``: tests/unit/test_patching.py, test_submission.py's applier test);
* **unbound**: the method's parameter renamed (``router_weights``): the patch still compiles, but loads
  ``topk_weights``, which nothing binds there (a NameError at the first prefill, caught here instead).

A third case is a user's patch with a syntax error (an unclosed parenthesis) on the cpu target, through the
same three faces.

Every image a test makes is removed, the plain builds' intermediate layers included (they inherit the OS
base's labels).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.bi100_fixture import BASELINE, SITE, vendor_image
from tests.integration.forge_fixtures import assert_clean_failure, client, invoke
from tests.integration.helpers import plain_docker_build
from tests.integration.test_submission import bi100_tree, build_layers, remove_layers

pytestmark = pytest.mark.integration

QWEN = f"{SITE}/vllm/model_executor/models/qwen3_5.py"


def deeper(text: str) -> str:
    """The `else:` block's lines one level deeper, under an `if T > 1:`."""
    lines = text.split("\n")
    start = lines.index("        else:")
    end = lines.index("        return out  # partial, all-reduce done in forward()")
    body = ["    " + ln if ln.strip() else ln for ln in lines[start + 1:end]]
    return "\n".join([*lines[:start + 1], "            if T > 1:", *body, *lines[end:]])


def unbound(text: str) -> str:
    start = text.index("    def _pure_pytorch_experts(")
    end = text.index("        return out  # partial")
    return text[:start] + text[start:end].replace("topk_weights", "router_weights") + text[end:]


VARIANTS = {
    # a multi-line anchor 12 spaces deep cannot match a block 16 deep at all: "anchor missing", with both indentations
    "deeper": (deeper, "anchor missing", "line {line} holds the anchor's first line indented 16 spaces, "
               "the anchor 12 spaces"),
    "unbound": (unbound, "breaks the file", "NameError: name 'topk_weights' is not bound in its scope"),
}


def scripts_variant(tmp: Path, name: str) -> tuple[Path, str]:
    change, _, message = VARIANTS[name]
    scripts = tmp / "qwen3_6_scripts"
    shutil.copytree(BASELINE, scripts)
    text = change((BASELINE / "qwen3_5.py").read_text())
    (scripts / "qwen3_5.py").write_text(text)
    if name == "deeper":
        line = text.split("\n").index("                out = torch.zeros_like(hidden_states)") + 1
        message = message.format(line=line)
    return scripts, message


def image_ids() -> set[str]:
    return {i["Id"] for i in client().api.images(all=True)}


@contextlib.contextmanager
def removes_what_it_builds(vendor: str) -> Iterator[list[str]]:
    """Yields a list to put plain-build layer ids in; afterwards removes those, and the new images that
    ``imageforge build --target bi100`` made on ``vendor``.

    Only the build's own images: those labelled with the target *and* the vendor image as their base. The other
    worker's ``preflight`` / ``check-patches`` sandbox images are labelled with the target too (not with a base),
    and removing one of those while it reads it fails that run with "an image disappeared"."""
    before = image_ids()
    layers: list[str] = []
    base_id = client().images.get(vendor).id
    try:
        yield layers
    finally:
        c = client()
        labels = ["org.imageforge.target=bi100", f"org.imageforge.base-id={base_id}"]
        fresh = [i for i in c.api.images(all=True, filters={"label": labels}) if i["Id"] not in before]
        for raw in sorted(fresh, key=lambda i: -int(i.get("Created") or 0)):
            with contextlib.suppress(docker.errors.APIError):
                c.api.remove_image(raw["Id"], force=True)
        remove_layers(layers)
        left = image_ids() - before
        assert not {i for i in left if any(i.startswith("sha256:" + x) for x in layers)}, "plain-build layers left"


@pytest.fixture(scope="module")
def vendor() -> str:
    return vendor_image()


def test_bi100_check_patches_is_n_of_n_with_the_final_state_checked(vendor: str) -> None:
    env = {"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": str(BASELINE)}
    proc = invoke("check-patches", "--target", "bi100", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 of 7 step(s) ok" in proc.stdout
    final = next(ln for ln in proc.stdout.splitlines() if ln.startswith("final state:"))
    # the steps' .py files and those patch_ops.sh copied (docker diff of the sandbox), overlays by hash
    assert final.endswith(": ok") and "2 overlay hash(es)" in final, final
    assert int(final.split("final state: ")[1].split(" ")[0]) >= 7, final


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_breaking_step_fails_check_patches_build_and_the_plain_docker_build_alike(vendor: str, tmp_path: Path,
                                                                                     name: str) -> None:
    scripts, message = scripts_variant(tmp_path, name)
    status = VARIANTS[name][1]
    env = {"IMAGEFORGE_BI100_BASE": vendor, "IMAGEFORGE_BI100_SCRIPTS": str(scripts)}
    with removes_what_it_builds(vendor) as layers:
        check = invoke("check-patches", "--target", "bi100", env=env)
        assert_clean_failure(check, 3)
        row = next(ln for ln in check.stdout.splitlines() if ln.split()[1:2] == ["sorted-moe-call"])
        assert status in row and message in row, check.stdout
        assert "6 of 7 step(s) ok, 1 would fail" in check.stdout

        build = invoke("build", "--target", "bi100", env=env)
        assert_clean_failure(build, 3)
        assert message in build.stderr and "sorted-moe-call" in build.stderr, build.stderr

        image, lines = plain_docker_build(bi100_tree(tmp_path / "tree", vendor, scripts=scripts))
        layers.extend(build_layers(lines))
        log = "\n".join(lines)
        assert image is None, "the plain docker build must fail"
        failed = [ln for ln in lines if "imageforge: step " in ln and " failed: " in ln]  # stderr lines: ANSI red
        assert failed and "imageforge: step sorted-moe-call failed: " in failed[0], log[-3000:]
        assert "imageforge: step protocol-openai-fields" not in log, "the build stops at the failing step"
        assert message in log and "returned a non-zero code: 3" in log
        assert "step verify" not in log, "it fails at the step, not at verify"


def test_a_syntax_breaking_patch_fails_its_step_in_all_three_faces(cpu_variant: Any, tmp_path: Path,
                                                                   remove_images: list[str]) -> None:
    """A user's patch with a typo (an unclosed parenthesis) on the cpu target: check-patches' row, build (exit 3)
    and the emitted tree's plain docker build all fail at that step with the compiler's message."""
    image = "imageforge-test/syntax-break"
    remove_images.append(image)
    manifest = cpu_variant(image, steps=[{
        "id": "break-it", "kind": "patch", "file": "vllm/v1/attention/ops/prefix_prefill.py",
        "old": "NUM_WARPS = 4  # imageforge: occupancy on a bandwidth-bound device",
        "new": "NUM_WARPS = (4  # a typo: the parenthesis is never closed"}])
    message = "'(' was never closed"
    check = invoke("check-patches", "--manifest", str(manifest), "--target", "cpu")
    assert_clean_failure(check, 3)
    row = next(ln for ln in check.stdout.splitlines() if ln.split()[1:2] == ["break-it"])
    assert "breaks the file" in row and message in row, check.stdout

    build = invoke("build", "--manifest", str(manifest), "--target", "cpu")
    assert_clean_failure(build, 3)
    assert "break-it" in build.stderr and message in build.stderr, build.stderr

    tree = tmp_path / "tree"
    written = invoke("submission", "--manifest", str(manifest), "--target", "cpu", "--out", str(tree))
    assert written.returncode == 0, written.stdout + written.stderr
    layers: list[str] = []
    try:
        built, lines = plain_docker_build(tree)
        layers.extend(build_layers(lines))
        log = "\n".join(lines)
        assert built is None, "the plain docker build must fail"
        failed = [ln for ln in lines if "imageforge: step " in ln and " failed: " in ln]
        assert failed and "imageforge: step break-it failed: " in failed[0], log[-3000:]
        assert message in log and "returned a non-zero code: 3" in log
        assert "step verify" not in log, "it fails at the step, not at verify"
    finally:
        remove_layers(layers)
