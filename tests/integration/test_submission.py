"""The submission tree on a real daemon: what the platform builds equals what imageforge built and tested.

* cpu: the emitted tree built with plain ``docker build`` (docker SDK, legacy builder, no imageforge code
  on that side) vs imageforge's build of the same manifest and profile (conftest ``cpu_submission``: the
  ``aggressive`` profile): every path of the two filesystems has the same (path, type, mode, uid:gid, sha256 of
  content or link target; each filesystem listed and hashed inside a container of its image by fs_listing.py),
  and the steps' own paths differ from the base image's (read path by path there: two whole listings, not
  three); the ENV is the same dict. That this image, started with
  computility-run.yaml's command and env, passes the dummy smoke suite is test_image_contract.py's claim now
  (one vLLM start for both: the tree's image started there by a generic tool, as the platform starts it).
  Left out of the filesystem comparison, and why that is safe:
  - ``/tmp``: build scratch only (both sides remove theirs: the engine's /tmp/imageforge-step, the tree's
    /tmp/imageforge-submission); nothing is served from it and the directory's own entry differs only in
    mtime. verify's /tmp/torchinductor_root is *cleaned* by verify (asserted below), not excluded.
  - the *content* of ``__pycache__/`` files: both sides compile the same sources with the same script
    (imageforge.verify.IN_IMAGE) into hash-checked .pyc, which Python validates against the source's hash at
    import, so a .pyc can never shadow the source; marshal's output may still differ in bytes between two
    compilations (reference flags depend on refcounts). Their names, types, modes and owners are compared.
* bi100 (vendor-layout fixture): the emitted tree builds (the baseline script runs, every patch applies),
  and a patch whose anchor is missing fails the emitted ``docker build`` with the step's id.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from tests.integration.bi100_fixture import BASELINE, SITE, site_file, vendor_files, vendor_image
from tests.integration.helpers import plain_docker_build, sdk

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
Entry = tuple[str, str, str, str]  # type, mode, uid:gid, sha256 of content / link target


def build_layers(lines: list[str]) -> list[str]:
    """The legacy builder's ` ---> 0123456789ab` lines: every layer it committed, in order (a failed build leaves
    them dangling, with the OS base's labels: they must go, or a fixture picking its base by label finds one)."""
    return [m.group(1) for ln in lines if (m := re.match(r"^---> ([0-9a-f]{12})$", ln.strip()))]


def remove_layers(layers: list[str]) -> None:
    """The untagged ones (the FROM line's ` ---> ` is the tagged base: it stays)."""
    for layer in reversed(layers):  # children first
        with contextlib.suppress(docker.errors.APIError):
            if not sdk().api.inspect_image(layer).get("RepoTags"):
                sdk().api.remove_image(layer, force=True)


class _Stream(io.RawIOBase):
    def __init__(self, chunks: Any) -> None:
        self._it, self._buf = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def _entries(stream: Any, prefix: str = "") -> dict[str, Entry]:
    """Path -> entry of a ``get_archive`` tar stream; ``prefix``: the absolute directory its names are under."""
    out: dict[str, Entry] = {}
    with tarfile.open(fileobj=io.BufferedReader(_Stream(stream), 1 << 20), mode="r|") as tar:
        for m in tar:
            rel = m.name.lstrip("./").lstrip("/") if m.name not in (".", "./", "/") else ""
            name = (prefix.rstrip("/") + "/" + rel) if rel else (prefix or "/")
            owner = f"{m.uid}:{m.gid}"
            # the permission bits, as fs_listing.py gives them (the daemon's tar adds the file type's bits)
            mode = f"{m.mode & 0o7777:o}"
            if m.isfile():
                h = hashlib.sha256()
                fh = tar.extractfile(m)
                assert fh is not None
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                out[name] = ("file", mode, owner, h.hexdigest())
            elif m.islnk():
                target = (prefix.rstrip("/") + "/" + m.linkname.lstrip("./").lstrip("/"))
                out[name] = ("file", mode, owner, out.get(target, ("", "", "", "?"))[3])
            elif m.issym():
                out[name] = ("symlink", mode, owner, hashlib.sha256(m.linkname.encode()).hexdigest())
            elif m.isdir():
                out[name] = ("dir", mode, owner, "")
            else:
                out[name] = (f"type-{m.type!r}", mode, owner, f"{m.devmajor}:{m.devminor}")
    return out


LISTING = "/tmp/imageforge-fs-listing.json.gz"  # under /tmp: excluded from the comparison


def filesystem(image: str) -> dict[str, Entry]:
    """Every path of the image's filesystem, listed and hashed inside a container of it by fs_listing.py (the
    image's own python3, no network; the runtime's mount points left out). Was a tar of ``/`` read here: 2.9 GB
    through the daemon and Python's tarfile per image, ~40 s of CPU each where this takes ~8."""
    program = (Path(__file__).parent / "fs_listing.py").read_text()
    container = sdk().containers.create(image, entrypoint=["/usr/bin/python3", "-I", "-B", "-c", program, LISTING],
                                        command=[], network_disabled=True,
                                        labels={"org.imageforge.test": "submission"})
    try:
        container.start()
        code = container.wait(timeout=600)["StatusCode"]
        assert code == 0, container.logs().decode(errors="replace")[-3000:]
        stream, _ = container.get_archive(LISTING)
        raw = b"".join(stream)
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        member = tar.extractfile(tar.getmembers()[0])
        assert member is not None
        found: dict[str, list[str]] = json.loads(gzip.decompress(member.read()))
    return {path: (e[0], e[1], e[2], e[3]) for path, e in found.items()}


def entries_of(image: str, paths: set[str]) -> dict[str, Entry]:
    """The entries under each of ``paths`` (a file, or a directory and what is in it) in the image; a path the
    image does not have is simply absent."""
    container = sdk().containers.create(image, command=["true"], labels={"org.imageforge.test": "submission"})
    out: dict[str, Entry] = {}
    try:
        for path in sorted(paths):
            parent = path.rsplit("/", 1)[0] or "/"
            with contextlib.suppress(docker.errors.NotFound):
                stream, _ = container.get_archive(path, chunk_size=1 << 20)
                out.update(_entries(stream, parent))
    finally:
        container.remove(force=True)
    return out


def excluded(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def comparable(entry: Entry, path: str) -> Entry:
    return (*entry[:3], "") if "/__pycache__/" in path else entry


def env_dict(image: str) -> dict[str, str]:
    env = sdk().images.get(image).attrs["Config"].get("Env") or []
    return dict(item.split("=", 1) for item in env)


# --------------------------------------------------------------------------- cpu: the proof of equality


def test_cpu_tree_builds_the_same_filesystem_and_env(cpu_submission: dict[str, Any]) -> None:
    ours = filesystem(cpu_submission["imageforge"])
    theirs = filesystem(cpu_submission["plain"])
    assert "/tmp/torchinductor_root" not in ours, "verify cleans torch's inductor cache, it is not just excluded"
    a = {p: comparable(e, p) for p, e in ours.items() if not excluded(p)}
    b = {p: comparable(e, p) for p, e in theirs.items() if not excluded(p)}
    only_ours = {p: a[p] for p in set(a) - set(b)}
    only_theirs = {p: b[p] for p in set(b) - set(a)}
    different = {p: (a[p], b[p]) for p in set(a) & set(b) if a[p] != b[p]}
    assert not only_ours and not only_theirs and not different, (only_ours, only_theirs, different)
    assert env_dict(cpu_submission["plain"]) == env_dict(cpu_submission["imageforge"])
    # the steps did change things (the same in both, above): patched files, overlays, links, .pyc, the config
    site = "/opt/venv/lib/python3.11/site-packages"
    prefill = f"{site}/vllm/v1/attention/ops/prefix_prefill.py"
    steps_paths = {prefill, f"{site}/vllm/model_executor/layers/fused_moe/sorted_moe.py",
                   "/etc/imageforge/serving.yaml", "/etc/ld.so.cache"}
    pycache = prefill.rsplit("/", 1)[0] + "/__pycache__"
    untouched = f"{site}/vllm/v1/attention/ops/__init__.py"
    base = entries_of(cpu_submission["base"], steps_paths | {"/usr/local/lib", pycache, untouched})
    # the base's entries (read from its tar) and the listing describe a path alike: an untouched file is equal
    assert base[untouched] == ours[untouched] == theirs[untouched]
    for path in steps_paths:
        assert path in ours and base.get(path) != ours[path], path
    libtorch = [p for p in ours if p.startswith("/usr/local/lib/libtorch")]
    assert libtorch and any(base.get(p) != ours[p] for p in libtorch)
    assert any("/__pycache__/prefix_prefill." in p and base.get(p) != ours[p] for p in ours)


# --------------------------------------------------------------------------- bi100 on the vendor-layout fixture


def bi100_tree(tmp: Path, base: str, *, scripts: Path = BASELINE) -> Path:
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve
    from imageforge.submission import write_submission

    env = {**os.environ, "IMAGEFORGE_BI100_BASE": base, "IMAGEFORGE_BI100_SCRIPTS": str(scripts)}
    resolved = resolve(load_manifest(REPO / "build.yaml"), "bi100", "baseline", environ=env)
    result = write_submission(resolved, tmp, environ=env)
    assert result.base.site == SITE
    return tmp


def test_bi100_tree_builds_on_the_fixture_and_a_missing_anchor_fails_with_its_step(tmp_path: Path) -> None:
    good = vendor_image()
    image, lines = plain_docker_build(bi100_tree(tmp_path / "good", good))
    assert image is not None, "\n".join(lines[-40:])
    try:
        log = "\n".join(lines)
        assert "baseline files deployed" in log, "patch_ops.sh ran"
        for step in ("prefill-triton-tuning", "prefix-attention-call", "sorted-moe-call", "protocol-openai-fields"):
            assert f"imageforge: step {step}: patched" in log, step
        cmd = sdk().images.get(image).attrs["Config"]["Cmd"]
        assert cmd == yaml.safe_load((tmp_path / "good" / "computility-run.yaml").read_text())["command"]
    finally:
        sdk().images.remove(image, force=True)

    rel = site_file("vllm/attention/ops/prefix_prefill.py")
    drifted = vendor_files()[rel].decode().replace("        NUM_WARPS = 8\n", "    NUM_WARPS = 8\n")
    bad = vendor_image(overrides={rel: drifted})
    try:
        image, lines = plain_docker_build(bi100_tree(tmp_path / "bad", bad))
        remove_layers(build_layers(lines))
        log = "\n".join(lines)
        assert image is None, "the build must fail"
        assert "imageforge: step prefill-triton-tuning failed: patch 'prefill-triton-tuning' does not apply" in log
        assert "anchor not found; closest: line " in log and "BLOCK = 128 if current_platform" in log
        assert "returned a non-zero code: 3" in log
    finally:
        sdk().images.remove(bad, force=True)
