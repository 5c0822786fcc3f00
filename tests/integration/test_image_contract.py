"""The built image stands on its own: started by a generic tool (testcontainers), not by imageforge.

The competition harness builds the submission tree with a plain ``docker build`` and starts the image with its own
``docker run``, as computility-run.yaml says (its command and env); only the image and that file decide what runs.
This module starts that image -- conftest ``cpu_submission``: the tree of the cpu target's ``aggressive`` profile,
built by the docker SDK alone -- with testcontainers-python (wait strategy on /health, labels, cleanup by context
manager), with computility-run.yaml's command and env, and checks both claims on that one vLLM start:

* the image serves its rendered config (the profile's values in the serving config, the profile's env in the image
  config) and passes the smoke suite through ``invoke smoke --url``;
* a server started with computility-run.yaml's command and env passes the dummy smoke suite (was
  test_submission.py's own start; test_submission keeps the filesystem/env equality of the two builds): the same
  run of the suite, one test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
# The reaper (Ryuk) image comes from a registry that cannot be reached here; the context manager cleans up.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
# testcontainers would reach published ports through the docker bridge gateway when it believes it runs
# inside a container (it does here); the ports are published on loopback only, so reach them there.
os.environ["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
os.environ["TESTCONTAINERS_HOST_OVERRIDE"] = "127.0.0.1"


@pytest.fixture(scope="module")
def run_yaml(cpu_submission: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((cpu_submission["tree"] / "computility-run.yaml").read_text())
    return doc


@pytest.fixture(scope="module")
def generic_container(cpu_submission: dict[str, Any], run_yaml: dict[str, Any]) -> Iterator[Any]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    model = REPO / ".imageforge" / "models" / "tiny-qwen3-moe"
    container = (
        DockerContainer(cpu_submission["plain"])
        .with_command(run_yaml["command"])
        .with_exposed_ports(8000)
        .with_volume_mapping(str(model), "/models/tiny-qwen3-moe", "ro")
        # build.yaml's run.volumes: vLLM's cache of the model class, as every server of the target gets it (without
        # it vLLM inspects the model in a subprocess first: ~10 s of CPU; bench/RESULTS.md, "vLLM's cache")
        .with_volume_mapping("imageforge-vllm-cache", "/root/.cache/vllm", "rw")
        .with_kwargs(shm_size="1g", labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test",
                                            "org.imageforge.test": "submission"})
        .waiting_for(HttpWaitStrategy(8000, "/health").for_status_code(200).with_startup_timeout(300))
    )
    for item in run_yaml["env"]:
        container.with_env(item["name"], item["value"])
    # publish on loopback only, on a free port (docker-py form: testcontainers annotates ports as dict[str, int | None])
    container.ports[8000] = ("127.0.0.1", None)  # type: ignore[index, assignment]
    with container as started:
        yield started


def test_image_serves_its_rendered_config_without_imageforge(generic_container: Any, run_yaml: dict[str, Any],
                                                             cpu_submission: dict[str, Any],
                                                             invoke_cli: Callable[..., Any]) -> None:
    """Both claims of the module on its one server: the tree's own build, started with computility-run.yaml's
    command and env, serves the profile's rendered config, and passes the target's dummy smoke suite through
    ``invoke smoke --url`` (the suite ran a second time here, on the same server, through ``run_suite``: that claim
    was test_submission.py's, moved here with its start; one run of the suite holds both)."""
    resolved = cpu_submission["resolved"]
    assert run_yaml["concurrency"] == 1
    assert generic_container.get_wrapped_container().image.id == cpu_submission["plain"]  # the tree's own build
    attrs = generic_container.get_wrapped_container().attrs
    assert attrs["Config"]["Cmd"] == run_yaml["command"]  # started as computility-run.yaml says
    code, out = generic_container.exec(["cat", "/etc/imageforge/serving.yaml"])
    assert code == 0
    config = yaml.safe_load(out)
    assert config["max-num-seqs"] == 32 and config["max-num-batched-tokens"] == 4096
    env = attrs["Config"]["Env"]
    assert "VLLM_CPU_KVCACHE_SPACE=2" in env  # the profile's serving env is in the image config
    assert generic_container.get_container_host_ip() == "127.0.0.1"
    url = f"http://127.0.0.1:{generic_container.get_exposed_port(8000)}"
    # the target's suite with the target's variables (its model name), as the moved claim ran it
    result = invoke_cli("smoke", "--url", url, "--target", resolved.target.name, "--tags", "dummy-ok", "--json")
    assert result.code == 0, result.output
    assert "43 passed, 0 failed" in result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and len(report["checks"]) == 43 >= 5 and report["target"] == "cpu"
    assert Path(report["suite_path"]).resolve() == (resolved.manifest.root / resolved.target.smoke.suite).resolve()
