"""export / push: the deliverable tarball, its checksum and description; a push to a local registry;
the real cpu image loaded on a clean second daemon, where it serves."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.integration.box_fixture import vllm_cache_tar
from tests.integration.forge_fixtures import (
    REPO,
    Registry,
    assert_clean_failure,
    client,
    free_port,
    invoke,
    second_daemon,
    tiny_base,
    write_manifest,
)
from tests.integration.helpers import GIB, labelled, scratch_dir

pytestmark = pytest.mark.integration
EXPORT_REPO = "imageforge-test/cpu-export"


def tar_manifest(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            if member.name == "manifest.json":
                fh = tar.extractfile(member)
                assert fh is not None
                data: list[dict[str, object]] = json.loads(fh.read())
                return data
    raise AssertionError("no manifest.json in the tarball")


def test_export_tiny_image(tmp_path: Path) -> None:
    manifest, target = write_manifest(tmp_path / "m", tiny_base())
    out = tmp_path / "dist"
    missing = invoke("export", "--manifest", str(manifest), "--out", str(out))
    assert_clean_failure(missing, 5)
    assert f"invoke build --target {target} --profile small" in missing.stderr
    invoke("build", "--manifest", str(manifest), check=True)

    proc = invoke("export", "--manifest", str(manifest), "--out", str(out), "--json", check=True)
    result = json.loads(proc.stdout)
    tarball = Path(result["tarball"])
    assert tarball.name == f"imageforge-test-{target}-small.tar" and tarball.parent == out
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert result["sha256"] == digest
    assert (out / f"{tarball.name}.sha256").read_text() == f"{digest}  {tarball.name}\n"
    desc = json.loads((out / f"imageforge-test-{target}-small.json").read_text())
    image = client().images.get(f"imageforge-test/{target}:small")
    assert desc["image"]["id"] == image.id and desc["image"]["size"] == image.attrs["Size"]
    assert set(desc["image"]["tags"]) == set(image.tags)
    assert desc["image"]["labels"]["org.imageforge.target"] == target
    assert desc["serving"]["args"]["max-num-seqs"] == 2 and "max-num-seqs: 2" in desc["serving"]["config"]
    assert desc["serving"]["config_path"] == "/etc/imageforge/serving.yaml"
    assert desc["file_bytes"] == tarball.stat().st_size and desc["load"] == f"docker load -i {tarball.name}"
    entries = tar_manifest(tarball)
    assert len(entries) == 1 and set(entries[0]["RepoTags"]) == set(image.tags)
    assert not list(out.glob(".*partial"))

    gz = invoke("export", "--manifest", str(manifest), "--out", str(out), "--gzip", "--json", check=True)
    gz_path = Path(json.loads(gz.stdout)["tarball"])
    assert gz_path.name.endswith(".tar.gz") and gz_path.stat().st_size < tarball.stat().st_size
    assert set(tar_manifest(gz_path)[0]["RepoTags"]) == set(image.tags)

    # the manifest changes after the build: the tag is stale, export refuses (exit 3)
    manifest.write_text(manifest.read_text().replace("small: {args: {max-num-seqs: 2}}",
                                                     "small: {args: {max-num-seqs: 3}}"))
    stale = invoke("export", "--manifest", str(manifest), "--out", str(out))
    assert_clean_failure(stale, 3)
    assert "not the image the manifest describes now" in stale.stderr


def test_push_to_a_local_registry(tmp_path: Path) -> None:
    manifest, target = write_manifest(tmp_path / "m", tiny_base())
    invoke("build", "--manifest", str(manifest), check=True)
    secret = "s3cr3t-" + os.urandom(6).hex()
    with Registry() as registry:
        # Credentials come from Docker's own config (here a private DOCKER_CONFIG); the registry
        # needs none, but they must never show up in any output or file.
        config_dir = tmp_path / "docker-config"
        config_dir.mkdir()
        auth = base64.b64encode(f"forge:{secret}".encode()).decode()
        (config_dir / "config.json").write_text(json.dumps({"auths": {registry.address: {"auth": auth}}}))
        repo = f"{registry.address}/imageforge-test/{target}"
        proc = invoke("export", "--manifest", str(manifest), "--out", str(tmp_path / "dist"), "--push", repo,
                      "--no-save", "--json", env={"DOCKER_CONFIG": str(config_dir)}, check=True)
        result = json.loads(proc.stdout)
        assert result["tarball"] is None
        pushed = {p["ref"]: p["digest"] for p in result["pushed"]}
        assert set(pushed) == {f"{repo}:small", f"{repo}:small-{result['tags'][1].rsplit('-', 1)[1]}"}
        tags = httpx.get(f"http://{registry.address}/v2/imageforge-test/{target}/tags/list").json()["tags"]
        assert sorted(tags) == sorted(ref.rsplit(":", 1)[1] for ref in pushed)
        for ref, digest in pushed.items():
            head = httpx.head(f"http://{registry.address}/v2/imageforge-test/{target}/manifests/"
                              f"{ref.rsplit(':', 1)[1]}",
                              headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
            assert head.headers["Docker-Content-Digest"] == digest
        description = (tmp_path / "dist" / f"imageforge-test-{target}-small.json").read_text()
        everything = proc.stdout + proc.stderr + description
        assert secret not in everything and auth not in everything
        local = client().images.get(f"imageforge-test/{target}:small").tags
        assert not any(t.startswith(registry.address) for t in local), "push tags are removed again"
        # a registry that is not there: a clean infrastructure error
        dead = f"127.0.0.1:{free_port()}/imageforge-test/{target}"
        bad = invoke("export", "--manifest", str(manifest), "--push", dead, "--no-save")
        assert_clean_failure(bad, 5)
        assert "push of" in bad.stderr and "failed" in bad.stderr


@pytest.mark.slow
def test_cpu_export_loads_on_a_clean_daemon_and_serves(cpu_variant: Callable[..., Path],
                                                       remove_images: list[str]) -> None:
    """The deliverable: the cpu image's tarball, loaded by a daemon that never saw it, serves.

    The cpu target under its own image name (``EXPORT_REPO``; the layers are the real target's, cached): other
    tests build cpu variants under ``imageforge/cpu:*`` and export refuses a tag the manifest does not describe,
    so this test owns its tag instead of retrying."""
    from imageforge.base import base_image_status

    if not base_image_status(REPO / "images" / "cpu").vllm_present:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    manifest = cpu_variant(EXPORT_REPO)
    remove_images.append(EXPORT_REPO)
    scratch = scratch_dir("ifexport-", needs=3 * GIB)  # in memory when there is room: see there
    try:
        _export_load_and_serve(manifest, scratch / "dist")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _export_load_and_serve(manifest: Path, out: Path) -> None:
    invoke("build", "--manifest", str(manifest), "--target", "cpu", "--profile", "conservative", check=True,
           timeout=900)
    proc = invoke("export", "--manifest", str(manifest), "--target", "cpu", "--profile", "conservative",
                  "--out", str(out), "--json", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = json.loads(proc.stdout)
    tarball = Path(exported["tarball"])
    # the checksum file as `sha256sum -c` reads it; the digest's value over the written bytes is
    # test_export_tiny_image's (a re-hash of these 2.5 GB costs ~13 s of CPU): here `docker load` checks every
    # layer against the image's config, and the loaded ID must be the built one
    assert (out / f"{tarball.name}.sha256").read_text() == f"{exported['sha256']}  {tarball.name}\n"

    d2 = second_daemon()
    c2 = docker.DockerClient(base_url=d2.host, timeout=900)
    assert c2.images.list(filters={"reference": EXPORT_REPO}) == [], "the second daemon never saw it"
    t0 = time.monotonic()
    with open(tarball, "rb") as fh:
        c2.images.load(fh)
    load_s = time.monotonic() - t0
    image = c2.images.get(f"{EXPORT_REPO}:conservative")
    assert image.id == exported["image_id"]
    assert set(image.tags) == set(exported["tags"])
    tarball.unlink()  # 2.5 GB: not needed any more

    model = REPO / ".imageforge" / "models" / "tiny-qwen3-moe"
    assert model.is_dir(), "the tiny model is written by `invoke build --target cpu`"
    port = free_port()
    container = c2.containers.create(
        f"{EXPORT_REPO}:conservative", shm_size="1g",
        ports={"8000/tcp": ("127.0.0.1", port)},
        volumes={str(model): {"bind": "/models/tiny-qwen3-moe", "mode": "ro"}},
        labels={"org.imageforge.test": "export-serve"})
    try:
        cache = vllm_cache_tar(client())  # what the target's cache volume holds on this daemon (see box_fixture)
        if cache is not None:
            assert container.put_archive("/root", cache)
        container.start()
        deadline = time.monotonic() + 420
        health = None
        while time.monotonic() < deadline:
            container.reload()
            assert container.status == "running", container.logs(tail=60).decode(errors="replace")
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                if health.status_code == 200:
                    break
            time.sleep(2)
        assert health is not None and health.status_code == 200, container.logs(tail=60).decode(errors="replace")
        serve_s = time.monotonic() - t0 - load_s
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny-qwen3-moe"]
        print(f"docker load {load_s:.1f}s, /health OK after {serve_s:.1f}s", flush=True)
    finally:
        container.remove(force=True)
        with contextlib.suppress(docker.errors.APIError):
            c2.images.remove(f"{EXPORT_REPO}:conservative", force=True)
    assert labelled(c=c2) == []


def test_export_reads_nothing_but_the_sdk_docker_host(tmp_path: Path) -> None:
    """export honours DOCKER_HOST: against the second daemon it exports what that daemon has."""
    from tests.integration.forge_fixtures import copy_image

    d2 = second_daemon()
    base = tiny_base()
    copy_image(base, d2.host)
    manifest, target = write_manifest(tmp_path / "m", base)
    env = {"DOCKER_HOST": d2.host}
    invoke("build", "--manifest", str(manifest), env=env, check=True)
    proc = invoke("export", "--manifest", str(manifest), "--out", str(tmp_path / "dist"), "--json", env=env,
                  check=True)
    result = json.loads(proc.stdout)
    assert result["image_id"] == client(d2.host).images.get(f"imageforge-test/{target}:small").id
    with pytest.raises(docker.errors.ImageNotFound):
        client().images.get(f"imageforge-test/{target}:small")
    assert io.BytesIO(Path(result["tarball"]).read_bytes()).getbuffer().nbytes == result["bytes"]
