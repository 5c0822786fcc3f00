"""lock / build --locked, clean, and DOCKER_HOST (a second daemon) against real daemons."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from pathlib import Path

import docker
import pytest

from imageforge.labels import L_TARGET
from tests.integration.forge_fixtures import (
    assert_clean_failure,
    client,
    copy_image,
    invoke,
    second_daemon,
    tiny_base,
    write_manifest,
)
from tests.integration.helpers import labelled

pytestmark = pytest.mark.integration


def image_ids(target: str, c: docker.DockerClient | None = None) -> set[str]:
    c = c or client()
    return {i.id for i in c.images.list(all=True, filters={"label": f"org.imageforge.target={target}"})}


def built_steps(output: str) -> list[tuple[str, str]]:
    return re.findall(r"\[\d+/\d+\] (\w+)\s+\w+\s+(\S+)", output)


def test_lock_then_locked_build_and_every_kind_of_drift(tmp_path: Path) -> None:
    c = client()
    alias = f"imageforge-test/lockbase:{secrets.token_hex(3)}"
    repo, tag = alias.split(":")
    c.images.get(tiny_base()).tag(repo, tag)
    other = tiny_base(unique=True)
    try:
        manifest, target = write_manifest(tmp_path / "m", alias)
        proc = invoke("build", "--manifest", str(manifest), "--locked")
        assert_clean_failure(proc, 2)
        assert "has no entry for target" in proc.stderr and "invoke lock" in proc.stderr

        locked = invoke("lock", "--manifest", str(manifest), check=True)
        assert "locked" in locked.stdout
        lock = json.loads((tmp_path / "m" / "build.lock").read_text())
        entry = lock["targets"][target]
        assert entry["base"]["reference"] == alias and entry["package"]["version"] == "1.0"
        assert set(entry["inputs"]) == {"extra", "script"}

        ok = invoke("build", "--manifest", str(manifest), "--locked", check=True)
        assert "lock ok" in ok.stderr  # build logs: stderr

        # an overlay changes: named, exit 2, nothing built
        before = image_ids(target)
        extra = tmp_path / "m" / "overlays" / "extra.py"
        extra.write_text(extra.read_text() + "# drift\n")
        proc = invoke("build", "--manifest", str(manifest), "--locked")
        assert_clean_failure(proc, 2)
        assert "step extra: overlays/extra.py changed" in proc.stderr
        assert image_ids(target) == before, "nothing built"

        # the base tag now names another image, and the manifest changed too: both named
        c.images.get(other).tag(repo, tag)
        manifest.write_text(manifest.read_text() + "\n# edited\n")
        proc = invoke("build", "--manifest", str(manifest), "--locked")
        assert_clean_failure(proc, 2)
        assert f"base image {alias} is a different image" in proc.stderr
        assert "manifest build.yaml changed since the lock" in proc.stderr
        assert "3 difference(s)" in proc.stderr

        # accepting the change: lock again, build --locked passes
        invoke("lock", "--manifest", str(manifest), check=True)
        invoke("build", "--manifest", str(manifest), "--locked", check=True)
    finally:
        for ref in (alias, other):
            with contextlib.suppress(docker.errors.APIError):
                c.images.remove(ref, force=True)


def test_clean_keeps_what_tags_need_and_removes_the_rest(tmp_path: Path) -> None:
    manifest, target = write_manifest(tmp_path / "m", tiny_base())
    extra = tmp_path / "m" / "overlays" / "extra.py"
    finals: list[str] = []
    for n in range(3):  # three builds of target:small, each with a different overlay
        extra.write_text(f"EXTRA = {n}  # {secrets.token_hex(4)}\n")
        out = invoke("build", "--manifest", str(manifest), "--json", check=True).stdout
        finals.append(json.loads(out)["image_id"])
    invoke("build", "--manifest", str(manifest), "--profile", "big", check=True)
    # a stopped container of a (finished) build of this checkout, as a crash would leave it
    run_dirs = sorted((tmp_path / "m" / ".imageforge" / "runs").iterdir())
    leftover = client().containers.create(finals[0], command=["true"], labels={
        "org.imageforge.tool": "imageforge", "org.imageforge.target": target,
        "org.imageforge.run-id": run_dirs[0].name, "org.imageforge.kind": "step-file"})
    all_before = image_ids(target)

    dry = invoke("clean", "--manifest", str(manifest), "--keep", "1", "--min-age", "0", "--dry-run", "--json",
                 check=True)
    plan = json.loads(dry.stdout)
    assert image_ids(target) == all_before, "--dry-run removes nothing"
    doomed = {i["id"] for i in plan["images"]}
    assert finals[0] in doomed and finals[1] in doomed and finals[2] not in doomed
    assert leftover.id in {x["id"] for x in plan["containers"]}

    text = invoke("clean", "--manifest", str(manifest), "--keep", "1", "--min-age", "0", check=True).stdout
    assert re.search(r"clean: removed 1 container\(s\) and \d+ image\(s\), freed", text), text
    after = image_ids(target)
    assert finals[2] in after and finals[0] not in after and finals[1] not in after
    assert after == all_before - doomed
    assert labelled({L_TARGET: target}) == []
    # every tag still works: a rebuild of both profiles is all HIT
    for profile in ("small", "big"):
        again = invoke("build", "--manifest", str(manifest), "--profile", profile, check=True).stderr
        assert all(state == "HIT" for state, _ in built_steps(again)), again
    # and a second clean has nothing to do
    quiet = invoke("clean", "--manifest", str(manifest), "--keep", "1", "--min-age", "0", check=True).stdout
    assert "removed 0 container(s) and 0 image(s)" in quiet


def test_docker_host_second_daemon(tmp_path: Path) -> None:
    """plan, build and check-patches go to the daemon DOCKER_HOST names; the shared daemon sees nothing."""
    d2 = second_daemon()
    base = tiny_base()
    copy_image(base, d2.host)
    manifest, target = write_manifest(tmp_path / "m", base)
    env = {"DOCKER_HOST": d2.host}
    plan = invoke("plan", "--manifest", str(manifest), env=env, check=True)
    assert "MISS" in plan.stdout and "HIT" not in plan.stdout.split("steps (")[1].split("cache:")[0]
    invoke("build", "--manifest", str(manifest), env=env, check=True)
    c2 = client(d2.host)
    assert c2.images.get(f"imageforge-test/{target}:small")
    assert image_ids(target) == set(), "nothing on the shared daemon"
    plan = invoke("plan", "--manifest", str(manifest), env=env, check=True)
    assert "cache: 5/5 HIT" in plan.stdout
    check = invoke("check-patches", "--manifest", str(manifest), env=env, check=True)
    assert "already applied" not in check.stdout and "applies" in check.stdout
    # a DOCKER_HOST where nothing answers: a clean infrastructure error, no dockerd started
    gone = invoke("build", "--manifest", str(manifest), env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert_clean_failure(gone, 5)
    assert "no Docker daemon answers at DOCKER_HOST" in gone.stderr


def test_symlink_glob_listing_cache_never_hides_an_earlier_step(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A glob directory no earlier step can change is listed once per base image (kept by the base's ID, shared by
    every chain on it); a file step writing into it or a script before it is seen even when that listing is kept."""
    from imageforge.steps.fs import listing_path

    cache = tmp_path / "cache"
    env = {"IMAGEFORGE_CACHE": str(cache)}
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(cache))  # listing_path's cache: the builds'
    base = tiny_base()
    ops = "/usr/local/lib/python3.11/dist-packages/vllm/ops"
    kept = listing_path(docker.from_env().images.get(base).id, ops)
    glob_ops = f"""\
          - id: link-ops
            kind: symlink
            glob: {ops}/*.py
            into: /opt/links
"""
    overlay = """\
          - id: extra
            kind: overlay
            source: overlays/extra.py
            dest: {dest}
"""
    # untouched (the overlay writes elsewhere): listed once, kept under the base's ID
    manifest, _ = write_manifest(tmp_path / "a", base, steps=overlay.format(dest="vllm/extra.py") + glob_ops)
    out = invoke("build", "--manifest", str(manifest), env=env, check=True).stderr
    assert "2 link(s) made" in out, "__init__.py and attn.py"
    names = {name for name, _kind, _target in json.loads(kept.read_text())}
    assert names == {"__init__.py", "attn.py"}, names
    # the overlay writes into the globbed directory: its file is seen, the kept listing stays the base's
    manifest, _ = write_manifest(tmp_path / "b", base, steps=overlay.format(dest="vllm/ops/extra.py") + glob_ops)
    out = invoke("build", "--manifest", str(manifest), env=env, check=True).stderr
    assert "3 link(s) made" in out, "__init__.py, attn.py and the overlay's extra.py"
    # a script before the glob adds a file there: seen too
    script = """\
          - id: make-op
            kind: script
            source: scripts/op.sh
"""
    manifest, _ = write_manifest(tmp_path / "c", base, steps=overlay.format(dest="vllm/extra.py") + script + glob_ops,
                                 files={"scripts/op.sh": f"#!/bin/sh\ntouch {ops}/made.py\n"})
    out = invoke("build", "--manifest", str(manifest), env=env, check=True).stderr
    assert "3 link(s) made" in out, "__init__.py, attn.py and the script's made.py"
    assert {name for name, _kind, _target in json.loads(kept.read_text())} == {"__init__.py", "attn.py"}
    # another chain on the same base (write_manifest's overlay content is new each time): the kept listing is read,
    # not written again
    written = kept.stat().st_mtime_ns
    manifest, _ = write_manifest(tmp_path / "d", base, steps=overlay.format(dest="vllm/extra.py") + glob_ops)
    out = invoke("build", "--manifest", str(manifest), env=env, check=True).stderr
    assert "2 link(s) made" in out and "link-ops" in out
    assert kept.stat().st_mtime_ns == written
