"""export, lock and clean: the pure parts (no daemon)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.clean import ContainerInfo, ImageInfo, plan_clean
from imageforge.errors import ConfigError
from imageforge.export import _write_tarball, describe, docker_run_example, file_stem, sha256_line
from imageforge.labels import L_FINAL, L_KIND, L_PROFILE, L_RUN, L_TARGET, L_TOOL
from imageforge.lock import lock_drift, lock_entry, read_lock, target_inputs
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.plan import make_plan
from tests.unit.conftest import manifest_text

MANIFEST = manifest_text("""\
    image: example/t
    run:
      shm_size: 1g
      port: 8001
      volumes: [{source: /models/m, target: /m, read_only: true},
                {type: volume, source: a-cache, target: /root/.cache/vllm, read_only: false}]
    steps:
      - id: over
        kind: overlay
        source: overlays/x.py
        dest: vllm/x.py
      - id: sh
        kind: script
        source: overlays/run.sh
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1}
      env: {A: "1"}
    default_profile: small
    profiles:
      small:
        args: {max-num-seqs: 2}
        steps:
          - id: prof
            kind: overlay
            source: overlays/p.py
            dest: vllm/p.py
      big: {extends: small, args: {max-num-seqs: 64}}
""")


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "x.py").write_text("X = 1\n")
    (tmp_path / "overlays" / "p.py").write_text("P = 1\n")
    (tmp_path / "overlays" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    path = tmp_path / "build.yaml"
    path.write_text(MANIFEST)
    return path


# --------------------------------------------------------------------------- export


def test_file_stem_and_sha_line() -> None:
    assert file_stem("imageforge/cpu", "conservative") == "imageforge-cpu-conservative"
    assert file_stem("reg:5000/a/b", "x y") == "reg-5000-a-b-x-y"
    assert sha256_line("ab" * 32, "f.tar") == "ab" * 32 + "  f.tar\n"


def test_describe_and_run_example(manifest: Path) -> None:
    m = load_manifest(manifest)
    resolved = resolve(m, "t", "big", environ={})
    plan = make_plan(resolved, environ={}, probe=None)
    attrs = {"Id": "sha256:abc", "Size": 123, "Created": "now", "Architecture": "amd64", "Os": "linux",
             "Config": {"Entrypoint": None, "Cmd": ["vllm", "serve", "--config", "/etc/serve.yaml"],
                        "Env": ["PATH=/usr/bin", "A=1"], "Labels": {"org.imageforge.tool": "imageforge"}}}
    d = describe(resolved, plan, attrs, tarball="t.tar", sha256="00" * 32, nbytes=9, compressed=False)
    assert d["image"]["tags"] == ["example/t:big", f"example/t:big-{m.short_digest}"]
    assert d["image"]["id"] == "sha256:abc" and d["image"]["size"] == 123
    assert d["image"]["labels"] == {"org.imageforge.tool": "imageforge"}
    assert d["serving"]["args"]["max-num-seqs"] == 64 and d["serving"]["env"] == {"A": "1"}
    assert "max-num-seqs: 64" in d["serving"]["config"]
    assert d["run"]["port"] == 8001 and d["run"]["volumes"][0]["target"] == "/m"
    assert [v["type"] for v in d["run"]["volumes"]] == ["bind", "volume"]
    assert d["load"] == "docker load -i t.tar" and d["sha256"] == "00" * 32
    json.dumps(d)  # serialisable
    line = docker_run_example("example/t:big", d["run"], host_address="10.0.0.5")
    assert line.startswith("docker run -d --shm-size 1g")
    assert "-v /models/m:/m:ro" in line and "-p 10.0.0.5:8001:8001 example/t:big" in line
    assert "-v a-cache:/root/.cache/vllm -p" in line  # a named volume, writable


@pytest.mark.parametrize("compress", [False, True])
def test_write_tarball_hashes_what_it_writes(tmp_path: Path, compress: bool) -> None:
    import gzip

    data = [b"a" * 1000, b"b" * 3000, b"c"]
    dest = tmp_path / ("x.tar.gz" if compress else "x.tar")
    digest, size = _write_tarball(iter(data), dest, compress=compress)
    raw = dest.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == digest and len(raw) == size
    assert (gzip.decompress(raw) if compress else raw) == b"".join(data)
    assert not list(tmp_path.glob(".*partial"))


def test_write_tarball_leaves_nothing_when_interrupted(tmp_path: Path) -> None:
    def gen() -> Iterator[bytes]:
        yield b"x"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _write_tarball(gen(), tmp_path / "y.tar", compress=False)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- lock


def test_lock_entry_covers_profile_steps_and_drift_names_each_change(manifest: Path) -> None:
    m = load_manifest(manifest)
    t = m.targets["t"]
    assert set(target_inputs(t)) == {"over", "sh", "prof"}
    locked = lock_entry(m, t, "debian:bookworm", "sha256:1", "1.0")
    assert lock_drift(locked, locked) == []
    (manifest.parent / "overlays" / "x.py").write_text("X = 2\n")
    current = lock_entry(m, t, "debian:bookworm", "sha256:2", "1.1")
    current["manifest_digest"] = "other"
    drift = lock_drift(locked, current)
    text = "\n".join(p.render() for p in drift)
    assert "manifest build.yaml changed" in text
    assert "base image debian:bookworm is a different image" in text and "sha256:2" in text
    assert "package version changed" in text
    assert "step over: overlays/x.py changed" in text
    assert "step sh" not in text
    del current["inputs"]["prof"]
    current["inputs"]["new"] = {"source": "overlays/n.py", "sha256": "0"}
    text = "\n".join(p.render() for p in lock_drift(locked, current))
    assert "step prof: locked input overlays/p.py no longer in the manifest" in text
    assert "step new: overlays/n.py is not in the lock" in text


def test_read_lock_missing_and_broken(tmp_path: Path) -> None:
    assert read_lock(tmp_path / "none.lock") == {"version": 1, "targets": {}}
    (tmp_path / "bad.lock").write_text("{not json")
    with pytest.raises(ConfigError):
        read_lock(tmp_path / "bad.lock")


# --------------------------------------------------------------------------- clean


def img(ident: str, parent: str = "", *, tags: tuple[str, ...] = (), created: float = 0, size: int = 100,
        **labels: str) -> ImageInfo:
    lab = {L_TOOL: "imageforge", **{k.replace("_", "."): v for k, v in labels.items()}}
    return ImageInfo(ident, parent, tags, lab, created, size)


def chain(prefix: str, base: str, n: int, created: float, target: str = "t", profile: str = "p",
          tags: tuple[str, ...] = ()) -> list[ImageInfo]:
    out: list[ImageInfo] = []
    parent = base
    for i in range(n):
        final = i == n - 1
        labels = {L_TARGET: target, L_KIND: "config" if final else "step"}
        if final:
            labels.update({L_FINAL: "true", L_PROFILE: profile})
        ident = f"{prefix}{i}"
        out.append(ImageInfo(ident, parent, tags if final else (), {L_TOOL: "imageforge", **labels}, created,
                             1000 + 100 * (i + 1)))
        parent = ident
    return out


def test_plan_clean_retention() -> None:
    base = ImageInfo("base", "", ("imageforge/vllm-cpu-base:x",), {L_TOOL: "imageforge", L_KIND: "vllm"}, 0, 1000)
    shared = chain("s", "base", 2, 10)  # two shared layers every build uses
    shared[-1] = ImageInfo("s1", "s0", (), {L_TOOL: "imageforge", L_TARGET: "t", L_KIND: "step"}, 10, 1200)
    builds = [chain(f"b{n}-", "s1", 2, 100 + n, tags=("example/t:p",) if n == 4 else ()) for n in range(5)]
    other = chain("o", "base", 2, 50, target="other")
    foreign = ImageInfo("mine", "b0-1", ("me/x:1",), {}, 60, 5000)  # someone tagged an image on top of build 0
    young = chain("y", "s1", 2, 9990, profile="q")
    images = [base, *shared, *[i for b in builds for i in b], *other, foreign, *young]
    plan = plan_clean(images, [], keep=2, now=10000, min_age=600, targets=["t"], removable_runs=lambda c: False)
    gone = [r.id for r in plan.images]
    # newest 2 finals (b4, b3) kept; b0 kept by the foreign tag; b1, b2 go, children first
    assert set(gone) == {"b1-0", "b1-1", "b2-0", "b2-1"}
    assert gone.index("b1-1") < gone.index("b1-0") and gone.index("b2-1") < gone.index("b2-0")
    assert plan.images[0].bytes == 100, "own size: image size minus its parent's"
    assert "base" not in gone and "o0" not in gone and "y1" not in gone
    assert plan.kept["b0-1"].startswith("tagged me/x:1")
    assert "younger" in plan.kept["y0"] or "newest" in plan.kept["y0"]
    assert plan.kept["s0"]  # shared layers are ancestors of kept builds
    lone = ImageInfo("lone", "s1", (), {L_TOOL: "imageforge", L_TARGET: "t", L_KIND: "step"}, 9999, 1300)
    assert "younger" in plan_clean([*images, lone], [], keep=2, now=10000, min_age=600, targets=["t"],
                                   removable_runs=lambda c: False).kept["lone"]
    plan0 = plan_clean(images, [], keep=0, now=10000, min_age=600, targets=["t"], removable_runs=lambda c: False)
    assert {"b3-0", "b3-1"} <= {r.id for r in plan0.images}
    assert "b4-1" not in {r.id for r in plan0.images}, "the tagged build stays even with --keep 0"


def test_plan_clean_containers() -> None:
    images = chain("b", "", 2, 0, tags=("example/t:p",))
    lab = {L_TOOL: "imageforge", L_TARGET: "t"}
    conts = [
        ContainerInfo("running-build", "b1", {**lab, L_RUN: "r1", L_KIND: "step-script"}, "running", 9000, "a"),
        ContainerInfo("dead-run", "b1", {**lab, L_RUN: "r0", L_KIND: "step-script"}, "running", 100, "b"),
        ContainerInfo("old-stopped", "b1", {**lab, L_KIND: "smoke"}, "exited", 100, "c"),
        ContainerInfo("new-stopped", "b1", {**lab, L_KIND: "smoke"}, "exited", 9900, "d"),
        ContainerInfo("serving", "b1", {**lab, L_KIND: "run"}, "running", 100, "e"),
        ContainerInfo("server-of-dead-run", "b1", {**lab, L_RUN: "r0", L_KIND: "server"}, "running", 100, "h"),
        ContainerInfo("not-ours", "b1", {}, "exited", 100, "f"),
        ContainerInfo("other-target", "b1", {L_TOOL: "imageforge", L_TARGET: "x"}, "exited", 100, "g"),
    ]
    plan = plan_clean(images, conts, keep=1, now=10000, min_age=600, targets=["t"],
                      removable_runs=lambda c: c.labels.get(L_RUN) == "r0")
    assert {r.id for r in plan.containers} == {"dead-run", "old-stopped"}
    assert plan.images == []


@pytest.mark.parametrize("compress", [False, True])
def test_saved_image_ids_reads_the_manifest_written_last(tmp_path: Path, compress: bool) -> None:
    """A `docker save` layout (layer folders first, manifest.json last), plain or gzipped, as export writes it."""
    import io
    import os
    import tarfile

    from imageforge.export import saved_image_ids

    layer = os.urandom(3 << 20)
    manifest = json.dumps([{"Config": "4f2c9e.json", "RepoTags": ["x:y"], "Layers": ["abc/layer.tar"]},
                           {"Config": "blobs/sha256/77aa", "RepoTags": [], "Layers": []}]).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("abc/layer.tar", layer), ("4f2c9e.json", b"{}"), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    chunks = iter([buf.getvalue()[i:i + 65536] for i in range(0, len(buf.getvalue()), 65536)])
    digest, size = _write_tarball(chunks, tmp_path / ("img.tar.gz" if compress else "img.tar"), compress=compress)
    tarball = tmp_path / ("img.tar.gz" if compress else "img.tar")
    assert size == tarball.stat().st_size and len(digest) == 64
    assert saved_image_ids(tarball) == ["sha256:4f2c9e", "sha256:77aa"]
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, mode="w"):
        pass
    assert saved_image_ids(empty) == []
