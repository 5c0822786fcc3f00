"""The built image stands on its own: started by a generic tool (testcontainers), not by imageforge.

The competition harness starts the shipped image with its own `docker run`; only the image's CMD and the
rendered serving config decide what runs. This test starts the `aggressive` profile of the cpu target with
testcontainers-python (wait strategy on /health, labels, cleanup by context manager) and runs the smoke
suite against it through `invoke smoke --url`.
"""

from __future__ import annotations

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
def aggressive_image(docker_ready: None) -> str:
    from imageforge.build import build_target
    from imageforge.manifest_load import load_manifest
    from imageforge.resolve import resolve

    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", "aggressive", environ=os.environ)
    result = build_target(resolved, environ=os.environ, echo=lambda _line: None)
    return result.tags[0]


@pytest.fixture(scope="module")
def generic_container(aggressive_image: str) -> Iterator[Any]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import HttpWaitStrategy

    model = REPO / ".imageforge" / "models" / "tiny-qwen3-moe"
    container = (
        DockerContainer(aggressive_image)
        .with_exposed_ports(8000)
        .with_volume_mapping(str(model), "/models/tiny-qwen3-moe", "ro")
        .with_kwargs(shm_size="1g", labels={"org.imageforge.tool": "imageforge", "org.imageforge.kind": "test"})
        .waiting_for(HttpWaitStrategy(8000, "/health").for_status_code(200).with_startup_timeout(300))
    )
    # publish on loopback only, on a free port (docker-py form: testcontainers annotates ports as dict[str, int | None])
    container.ports[8000] = ("127.0.0.1", None)  # type: ignore[index, assignment]
    with container as started:
        yield started


def test_image_serves_its_rendered_config_without_imageforge(generic_container: Any,
                                                             invoke_cli: Callable[..., Any]) -> None:
    code, out = generic_container.exec(["cat", "/etc/imageforge/serving.yaml"])
    assert code == 0
    config = yaml.safe_load(out)
    assert config["max-num-seqs"] == 32 and config["max-num-batched-tokens"] == 4096
    env = generic_container.get_wrapped_container().attrs["Config"]["Env"]
    assert "VLLM_CPU_KVCACHE_SPACE=2" in env  # the profile's serving env is in the image config
    assert generic_container.get_container_host_ip() == "127.0.0.1"
    url = f"http://127.0.0.1:{generic_container.get_exposed_port(8000)}"
    result = invoke_cli("smoke", "--url", url, "--tags", "dummy-ok")
    assert result.code == 0, result.output
    assert "43 passed, 0 failed" in result.output
