"""Tests find their base images by reference (the recipe's computed tag), never by a label another image inherits.

An image built FROM the OS image carries its ``org.imageforge.kind=os-base`` label: a user's own
``FROM imageforge/os:...``, the dangling last layer of a plain ``docker build`` of a submission tree, a test's
committed probe. Before, the fixtures took "the newest image with that label" and so built the bi100 vendor fixture
on such an image, with its files in it (test_bi100_vendor_layout then saw "already applied"). Here such an image is
made first, newer than the OS image, and nothing the fixtures make may change.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import tarfile
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from tests.integration import bi100_fixture, forge_fixtures, helpers

pytestmark = pytest.mark.integration
MARKER = "etc/imageforge-derived-image-marker"


@pytest.fixture
def derived_from_os_image(docker_ready: None) -> Iterator[Any]:
    """A newer image built FROM the OS image (it inherits the os-base label), with a marker file; removed after."""
    c = forge_fixtures.client()
    base = helpers.os_image(c)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"a derived image's own file\n"
        info = tarfile.TarInfo(MARKER)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    container = c.containers.create(base.id, command=["true"])
    tag = f"derived-{secrets.token_hex(4)}"
    try:
        container.put_archive("/", buf.getvalue())
        image = container.commit(repository="imageforge-test/derived-os", tag=tag,
                                 conf={"Labels": {"org.imageforge.test": "derived-os"}})
    finally:
        container.remove(force=True)
    assert image.labels.get("org.imageforge.kind") == "os-base"  # inherited: the trap this test is about
    try:
        yield image
    finally:
        with contextlib.suppress(docker.errors.APIError):
            c.images.remove(image.id, force=True)


def _has_marker(c: docker.DockerClient, image: str) -> bool:
    container = c.containers.create(image, entrypoint=["/bin/true"], command=[])
    try:
        container.get_archive("/" + MARKER)
        return True
    except docker.errors.NotFound:
        return False
    finally:
        container.remove(force=True)


def test_a_derived_os_image_changes_nothing(derived_from_os_image: Any) -> None:
    c = forge_fixtures.client()
    os_ref, _ = helpers.cpu_base_refs()
    os_id = c.images.get(os_ref).id
    assert derived_from_os_image.id != os_id
    assert helpers.os_image(c).id == os_id
    assert bi100_fixture.os_image(c).id == os_id
    assert forge_fixtures._os_image(c).id == os_id
    # what the fixtures build on the OS image has none of the derived image's files
    assert not _has_marker(c, bi100_fixture.vendor_image(c))
    tiny = forge_fixtures.tiny_base(c, unique=True)
    try:
        assert not _has_marker(c, tiny)
    finally:
        c.images.remove(tiny, force=True)
