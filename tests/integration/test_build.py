"""The build engine on a real daemon.

Most tests build on a small probe base (the project's own OS image plus a fake installed
distribution `probepkg`), so layers are cheap to save and grep; one test builds the real
`cpu` target from build.yaml on real vLLM files.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge.build import build_target
from imageforge.errors import BuildError, InfraError
from imageforge.labels import L_KEY, L_TARGET, L_TOOL, L_VERIFIED
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.plan import make_plan
from tests.integration.helpers import this_session

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROBE_TAG = "imageforge-test/probe-base:1"
SECRET = "s3cr3t-planted-by-test-9f1c7a"


def docker_client() -> Any:
    from imageforge.docker_engine import client, ensure_daemon

    ensure_daemon()
    return client()


@pytest.fixture(scope="session")
def probe_base() -> str:
    """OS image + /usr/lib/python3/dist-packages/probepkg (a distribution importlib.metadata finds)."""
    from imageforge import base

    c = docker_client()
    os_ref = base.base_image_status(REPO / "images" / "cpu").os_ref
    c.images.get(os_ref)  # made by `invoke test` before pytest (prepare_base)
    files = {
        "usr/lib/python3/dist-packages/probepkg/__init__.py": b"VALUE = 1\n",
        "usr/lib/python3/dist-packages/probepkg/mod.py": b"NAME = 'a'\n",
        "usr/lib/python3/dist-packages/probepkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: probepkg\n"
        b"Version: 1.0\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    container = c.containers.create(os_ref, command=["/bin/bash"], labels={L_TOOL: "imageforge"})
    try:
        container.put_archive("/", buf.getvalue())
        container.commit(repository=PROBE_TAG.split(":")[0], tag="1",
                         conf={"Entrypoint": None, "Cmd": ["/bin/bash"], "WorkingDir": "/srv",
                               "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                       "BASE_MARKER=kept"], "Labels": {L_TOOL: "imageforge"}})
    finally:
        container.remove(force=True)
    return PROBE_TAG


MANIFEST = """\
version: 1
default_target: probe
targets:
  probe:
    base: {{image: "{base}"}}
    package: {{import: probepkg, distribution: probepkg, version: "1.0"}}
    image: imageforge-test/{name}
    steps:
      - id: add-module
        kind: overlay
        source: overlays/extra.py
        dest: probepkg/extra.py
      - id: value
        kind: patch
        file: probepkg/__init__.py
        old: "VALUE = 1"
        new: "VALUE = 2"
      - id: secret-script
        kind: script
        source: overlays/step.sh
        env: {{API_TOKEN: "{secret}"}}
    verify:
      imports: [probepkg, probepkg.extra]
    serving:
      config_path: /etc/probe/serve.yaml
      args: {{model: /m, max-num-seqs: 1}}
      env: {{SERVE_MARKER: "yes"}}
    default_profile: one
    profiles:
      one: {{args: {{max-num-seqs: 1}}}}
      two: {{args: {{max-num-seqs: 2}}}}
"""


@pytest.fixture(autouse=True)
def own_verify_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts with no import verified on any content (the host file would make the order matter)."""
    from imageforge import verify

    facts = tmp_path / "verify-facts" / "imports-passed.txt"
    monkeypatch.setattr(verify, "_facts_file", lambda: facts)
    return facts


@pytest.fixture
def project(tmp_path: Path, probe_base: str) -> Iterator[Path]:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "extra.py").write_text("EXTRA = 'overlay'\n")
    script = tmp_path / "overlays" / "step.sh"
    script.write_text('#!/bin/sh\nset -eu\n[ -n "$API_TOKEN" ]\necho "script ran with a token of ${#API_TOKEN} chars"\n'
                      "mkdir -p /opt/probe && echo done > /opt/probe/marker\n")
    script.chmod(0o755)
    name = tmp_path.name.lower().replace("_", "-")[:40]
    (tmp_path / "build.yaml").write_text(MANIFEST.format(base=probe_base, name=name, secret=SECRET))
    yield tmp_path
    c = docker_client()
    for image in c.images.list(name=f"imageforge-test/{name}"):
        for tag in image.tags:
            c.images.remove(tag, force=True)


def do_build(path: Path, profile: str | None = None, sets: list[str] | None = None, *,
             verify_imports: bool = False) -> Any:
    r = resolve(load_manifest(path / "build.yaml"), None, profile, environ={}, sets=sets or [])
    return build_target(r, environ={}, echo=lambda _line: None, verify_imports=verify_imports)


def run_in(image: str, *argv: str) -> str:
    c = docker_client()
    out = c.containers.run(image, entrypoint=list(argv[:1]), command=list(argv[1:]), remove=True,
                           labels={L_TOOL: "imageforge"})
    return bytes(out).decode().strip()


def states(result: Any) -> list[str]:
    return [s.status for s in result.steps]


def verify_row(result: Any) -> Any:
    return next(s for s in result.steps if s.stage == "verify")


def edit_manifest(project: Path, old: str, new: str) -> None:
    (project / "build.yaml").write_text((project / "build.yaml").read_text().replace(old, new))


def test_first_build_then_all_hit_and_plan_agrees(project: Path) -> None:
    first = do_build(project)
    assert states(first) == ["BUILT"] * 5
    again = do_build(project)
    assert states(again) == ["HIT"] * 5
    assert again.image_id == first.image_id
    r = resolve(load_manifest(project / "build.yaml"), None, None, environ={})
    from imageforge.base import DaemonProbe

    plan = make_plan(r, environ={}, probe=DaemonProbe())
    assert [s["cache"] for s in plan.to_json()["steps"]] == ["HIT"] * 5
    assert (first.run_dir / "summary.json").exists() and (first.run_dir / "plan.json").exists()


NO_OP_PROBE = """
import json, sys
import requests.sessions
calls = []
send = requests.sessions.Session.send
def counting(self, request, **kwargs):
    calls.append(f"{request.method} {request.path_url}")
    return send(self, request, **kwargs)
requests.sessions.Session.send = counting
from imageforge.build import build_target
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
import imageforge.docker_engine as de
r = resolve(load_manifest(sys.argv[1]), None, None, environ={})
result = build_target(r, environ={}, echo=lambda _line: None)
print(json.dumps({"calls": calls, "clients": len(de.CLIENTS_MADE), "states": [s.status for s in result.steps],
                  "paramiko": "paramiko" in sys.modules}))
"""


def test_a_no_op_build_makes_one_client_one_ping_and_no_container(project: Path) -> None:
    """The no-op path is one SDK client whose API version comes from the one /_ping (no GET /version,
    no second client for the ping), no container and no write to the daemon; paramiko (the ssh transport) is not
    imported for a local socket. A fresh process, as `invoke build` is."""
    do_build(project)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", NO_OP_PROBE, str(project / "build.yaml")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["states"] == ["HIT"] * 5
    assert got["clients"] == 1
    calls: list[str] = got["calls"]
    assert [c for c in calls if c.endswith("/_ping")] == ["GET /_ping"], calls
    assert not [c for c in calls if "/version" in c or "/containers" in c or not c.startswith("GET ")], calls
    assert len(calls) <= 4, calls  # the ping, the base image, one listing of every cache key, the final image:
    # no inspect per layer (the build noted the layers it committed)
    assert got["paramiko"] is False


def test_an_image_built_from_ours_is_never_taken_for_a_cached_layer(project: Path) -> None:
    """A Dockerfile FROM the built image (and a plain `docker commit` of a container of it) inherits every label,
    the cache keys too; the next build must still find imageforge's own layers and leave the tag on them."""
    first = do_build(project)
    c = docker_client()
    dockerfile = f"FROM {first.image_id}\nRUN echo derived > /derived\n"
    derived, _ = c.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True,
                                labels={L_TOOL: "imageforge"})  # so that `clean` and the fixture find it
    container = c.containers.create(first.steps[2].image_id, command=["/bin/true"], labels={L_TOOL: "imageforge"})
    try:
        committed = container.commit(message="someone's own commit")
    finally:
        container.remove(force=True)
    try:
        assert derived.labels[L_KEY] == c.images.get(first.image_id).labels[L_KEY]  # the trap is real
        again = do_build(project)
        assert states(again) == ["HIT"] * 5
        assert [s.image_id for s in again.steps] == [s.image_id for s in first.steps]
        assert c.images.get(again.tags[0]).id == first.image_id
        from imageforge.base import DaemonProbe

        r = resolve(load_manifest(project / "build.yaml"), None, None, environ={})
        plan = make_plan(r, environ={}, probe=DaemonProbe())
        assert [s["image_id"] for s in plan.to_json()["steps"]] == [s.image_id for s in first.steps]
    finally:
        for image in (derived.id, committed.id):
            c.images.remove(image, force=True)


def test_changed_overlay_rebuilds_from_that_step(project: Path) -> None:
    do_build(project)
    (project / "overlays" / "extra.py").write_text("EXTRA = 'changed'\n")
    result = do_build(project)
    assert states(result) == ["BUILT"] * 5
    # Changing the patch only: the overlay layer is reused.
    text = (project / "build.yaml").read_text().replace('new: "VALUE = 2"', 'new: "VALUE = 3"')
    (project / "build.yaml").write_text(text)
    result = do_build(project)
    assert states(result) == ["HIT", "BUILT", "BUILT", "BUILT", "BUILT"]
    code = "import probepkg.extra as e, probepkg; print(e.EXTRA, probepkg.VALUE)"
    assert run_in(result.tags[0], "python3", "-c", code) == "changed 3"


def test_content_verified_before_is_not_imported_again(project: Path, own_verify_facts: Path) -> None:
    """A new chain (the patch step renamed) with the same bytes: the verify layer is made, its imports reused."""
    (project / "overlays" / "extra.py").write_text(f"EXTRA = 'reuse {project.name}'\n")  # content no test built
    first = do_build(project, verify_imports=True)
    verify_row = next(s for s in first.steps if s.stage == "verify")
    assert verify_row.status == "BUILT" and "2 imports ok" in verify_row.detail
    assert len(own_verify_facts.read_text().split()) == 1
    text = (project / "build.yaml").read_text().replace("- id: value\n", "- id: value-renamed\n")
    (project / "build.yaml").write_text(text)
    again = do_build(project)  # the default build too says REUSED for content whose imports passed
    assert states(again) == ["HIT", "BUILT", "BUILT", "REUSED", "BUILT"]
    row = next(s for s in again.steps if s.stage == "verify")
    assert "imports REUSED (content" in row.detail and "0 imports" not in row.detail
    labels = docker_client().images.get(row.image_id).labels
    assert json.loads(labels[L_VERIFIED])["imports_reused"] is True
    # Different bytes: imported again.
    text = (project / "build.yaml").read_text().replace('new: "VALUE = 2"', 'new: "VALUE = 4"')
    (project / "build.yaml").write_text(text)
    third = do_build(project, verify_imports=True)
    assert next(s for s in third.steps if s.stage == "verify").status == "BUILT"
    assert run_in(third.tags[0], "python3", "-c", "import probepkg; print(probepkg.VALUE)") == "4"


def test_imports_are_left_to_the_first_start_unless_verify_imports(project: Path, own_verify_facts: Path) -> None:
    """A default build does not import verify.imports (the first server start does, and names the step
    when it fails); ``--verify-imports`` imports them before any tag moves, on a cached verify layer too, and
    fails (exit 3) on a module-level import error that compiles and binds every name."""
    from imageforge import verify

    (project / "overlays" / "extra.py").write_text(f"from probepkg import not_there  # {project.name}\n")
    first = do_build(project)
    row = verify_row(first)
    assert states(first) == ["BUILT"] * 5 and "imports: at first start" in row.detail and "imports ok" not in row.detail
    labels = docker_client().images.get(first.image_id).labels
    assert json.loads(labels[L_VERIFIED])["imports"] == "at first start"
    assert not own_verify_facts.exists()
    with pytest.raises(BuildError) as info:  # the same layers, now with the import check: on the cached layer
        do_build(project, verify_imports=True)
    assert info.value.exit_code == 3
    tail = "\n".join(info.value.log_tail)
    assert "import probepkg.extra failed: ImportError: cannot import name 'not_there'" in tail
    assert "(ImportError in probepkg/extra.py line 1, written by step 'add-module' (overlay))" in tail
    assert info.value.key_path == "targets.probe.steps[0]" and info.value.location is not None
    assert not own_verify_facts.exists()
    # Fixed: built with the check, the content recorded.
    (project / "overlays" / "extra.py").write_text(f"EXTRA = 'fixed {project.name}'\n")
    fixed = do_build(project, verify_imports=True)
    row = verify_row(fixed)
    assert row.status == "BUILT" and "2 imports ok" in row.detail
    assert len(own_verify_facts.read_text().split()) == 1
    # New content built by default, then --verify-imports on the cached layer: checked there, then REUSED.
    edit_manifest(project, 'new: "VALUE = 2"', 'new: "VALUE = 5"')
    assert "imports: at first start" in verify_row(do_build(project)).detail
    cached = do_build(project, verify_imports=True)
    row = verify_row(cached)
    assert states(cached) == ["HIT"] * 5 and "2 imports ok" in row.detail and "on the cached layer" in row.detail
    assert len(own_verify_facts.read_text().split()) == 2
    row = verify_row(do_build(project, verify_imports=True))
    assert row.status == "HIT" and "imports REUSED (content" in row.detail
    # A server start that reached /health records the content it served (serve/container.py calls this).
    edit_manifest(project, 'new: "VALUE = 5"', 'new: "VALUE = 6"')
    started = do_build(project)
    content = verify.record_started(docker_client().images.get(started.tags[0]).labels)
    assert content is not None and content in own_verify_facts.read_text().split()
    assert verify.record_started(docker_client().images.get(started.tags[0]).labels) is None  # once
    row = verify_row(do_build(project, verify_imports=True))
    assert row.status == "HIT" and f"imports REUSED (content {content[:12]}" in row.detail


def test_profile_switch_reuses_shared_layers(project: Path) -> None:
    one = do_build(project, "one")
    two = do_build(project, "two")
    assert states(two) == ["HIT", "HIT", "HIT", "HIT", "BUILT"]
    assert [s.image_id for s in one.steps[:4]] == [s.image_id for s in two.steps[:4]]
    c = docker_client()
    size_delta = c.images.get(two.image_id).attrs["Size"] - c.images.get(one.steps[3].image_id).attrs["Size"]
    assert size_delta < 64 * 1024
    assert "max-num-seqs: 2" in run_in(two.tags[0], "cat", "/etc/probe/serve.yaml")


def test_base_config_kept_cmd_from_serving(project: Path) -> None:
    result = do_build(project)
    cfg = docker_client().images.get(result.image_id).attrs["Config"]
    assert cfg["Entrypoint"] is None
    assert cfg["Cmd"] == ["vllm", "serve", "--config", "/etc/probe/serve.yaml"]
    assert cfg["WorkingDir"] == "/srv"
    assert "BASE_MARKER=kept" in cfg["Env"] and "SERVE_MARKER=yes" in cfg["Env"]
    labels = cfg["Labels"]
    assert labels[L_TOOL] == "imageforge" and labels[L_KEY] == result.steps[-1].key
    assert labels["org.imageforge.step.add-module.sha256.overlays/extra.py"]
    assert json.loads(labels[L_VERIFIED])["ok"] is True
    assert {"org.imageforge.manifest-digest", "org.imageforge.run-id", "org.imageforge.revision",
            "org.imageforge.created", "org.imageforge.base-id"} <= set(labels)
    for step in result.steps[:3]:
        mid = docker_client().images.get(step.image_id).attrs["Config"]
        assert mid["Entrypoint"] is None and mid["Cmd"] == ["/bin/bash"]


def test_planted_secret_is_nowhere(project: Path) -> None:
    result = do_build(project)
    c = docker_client()
    image = c.images.get(result.image_id)
    assert SECRET not in json.dumps(image.attrs)
    history = subprocess.run(["docker", "history", "--no-trunc", result.image_id], capture_output=True,
                             text=True, check=True).stdout
    assert SECRET not in history and "API_TOKEN" not in history
    raw = b"".join(image.save(named=False))
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        layers = [m for m in outer.getmembers() if m.name.endswith("layer.tar")]
        assert layers
        for member in layers:
            data = outer.extractfile(member)
            assert data is not None
            blob = data.read()
            assert SECRET.encode() not in blob, member.name
            with tarfile.open(fileobj=io.BytesIO(blob)) as layer:
                assert not any("imageforge-step" in n for n in layer.getnames())
    assert run_in(result.tags[0], "cat", "/opt/probe/marker") == "done"


def test_same_size_patch_defeats_stale_bytecode(project: Path) -> None:
    """A .pyc compiled before a same-size patch that kept the mtime would shadow the patch."""
    script = project / "overlays" / "compile.sh"
    script.write_text("#!/bin/sh\nset -eu\npython3 -m py_compile /usr/lib/python3/dist-packages/probepkg/mod.py\n")
    script.chmod(0o755)
    text = (project / "build.yaml").read_text().replace(
        "      - id: secret-script",
        textwrap.indent(textwrap.dedent("""\
            - id: compile-first
              kind: script
              source: overlays/compile.sh
            - id: same-size
              kind: patch
              file: probepkg/mod.py
              old: "NAME = 'a'"
              new: "NAME = 'b'"
            """), "      ") + "      - id: secret-script",
    )
    (project / "build.yaml").write_text(text)
    result = do_build(project)
    by_id = {s.id: s for s in result.steps}
    read = ["python3", "-c", "import probepkg.mod as m; print(m.NAME)"]
    # The hazard is real: right after the patch layer, Python still runs the old bytecode.
    assert run_in(by_id["same-size"].image_id, *read) == "a"
    assert run_in(result.tags[0], *read) == "b"


def test_a_syntax_error_fails_its_step_and_no_tag_moves(project: Path) -> None:
    """The overlay's step itself fails (compile after every .py step), before any verify layer."""
    good = do_build(project)
    (project / "overlays" / "extra.py").write_text("def broken(:\n")
    with pytest.raises(BuildError) as info:
        do_build(project)
    err = info.value
    assert err.exit_code == 3
    assert "step 'add-module' breaks /usr/lib/python3/dist-packages/probepkg/extra.py" in err.message
    assert "SyntaxError" in err.message
    c = docker_client()
    assert c.images.get(good.tags[0]).id == good.image_id
    # this target's (the other worker of `invoke test` may be building another one)
    leaked = this_session(c.containers.list(all=True, ignore_removed=True,
                                            filters={"label": [f"{L_TOOL}=imageforge", f"{L_TARGET}=probe"],
                                                     "status": "exited"}))
    assert not [x for x in leaked if x.labels.get("org.imageforge.kind") == "verify"]


def test_a_script_copying_a_broken_module_fails_verify_and_a_dead_file_is_listed(project: Path) -> None:
    """Issue 36: verify compiles every .py a script added or changed under the import roots (the layer's diff,
    kept in its label); one outside them that nothing runs is listed as dead, not compiled."""
    script = project / "overlays" / "step.sh"
    head = '#!/bin/sh\nset -eu\n[ -n "$API_TOKEN" ]\nmkdir -p /opt/probe\n'
    script.write_text(head + "printf 'def forward(:\\n' > /opt/probe/patch_dead.py\n")
    result = do_build(project)
    row = verify_row(result)
    assert "1 dead (listed, not compiled: /opt/probe/patch_dead.py)" in row.detail
    labels = docker_client().images.get(result.image_id).labels
    assert json.loads(labels[L_VERIFIED])["dead"] == ["/opt/probe/patch_dead.py"]
    script.write_text(head + "printf 'def forward(:\\n' > /usr/lib/python3/dist-packages/probepkg/copied.py\n")
    with pytest.raises(BuildError) as info:
        do_build(project)
    assert info.value.exit_code == 3
    assert "/usr/lib/python3/dist-packages/probepkg/copied.py does not compile" in "\n".join(info.value.log_tail)
    assert docker_client().images.get(result.tags[0]).id == result.image_id, "no tag moved"


def test_missing_anchor_names_step_and_near_match(project: Path) -> None:
    text = (project / "build.yaml").read_text().replace('old: "VALUE = 1"', 'old: "VALUE  = 1"')
    (project / "build.yaml").write_text(text)
    with pytest.raises(BuildError) as info:
        do_build(project)
    err = info.value
    assert "patch 'value' does not apply to /usr/lib/python3/dist-packages/probepkg/__init__.py" in err.message
    assert "closest: line 1: 'VALUE = 1'" in err.message
    assert err.location is not None and err.location.line == 16  # the `old:` key


def test_version_mismatch_is_clear(project: Path) -> None:
    text = (project / "build.yaml").read_text().replace('version: "1.0"', 'version: "2.0"')
    (project / "build.yaml").write_text(text)
    with pytest.raises(BuildError) as info:
        do_build(project)
    assert info.value.expected == "2.0" and info.value.found == "1.0"


def test_missing_base_image_is_infra_error(project: Path) -> None:
    text = (project / "build.yaml").read_text().replace(PROBE_TAG, "imageforge-test/absent:0")
    (project / "build.yaml").write_text(text)
    with pytest.raises(InfraError) as info:
        do_build(project)
    assert info.value.exit_code == 5 and "not on the Docker daemon" in info.value.message


def test_real_cpu_target_patches_vllm() -> None:
    r = resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ=os.environ)
    result = build_target(r, environ=os.environ, echo=lambda _line: None)
    code = ("import vllm.v1.attention.ops.prefix_prefill as p, inspect; src = inspect.getsource(p); "
            "print(p.__file__); print('BASE_BLOCK = 64' in src, 'NUM_WARPS = 4  #' in src)")
    out = run_in(result.tags[0], "python3", "-c", code).splitlines()
    assert out[-1] == "True True"
    cfg = docker_client().images.get(result.image_id).attrs["Config"]
    assert cfg["Cmd"] == ["vllm", "serve", "--config", "/etc/imageforge/serving.yaml"]
    assert "VLLM_CPU_KVCACHE_SPACE=1" in cfg["Env"] and any(e.startswith("VIRTUAL_ENV=") for e in cfg["Env"])


def test_concurrent_builds_leave_consistent_tags(project: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _i: do_build(project), range(2)))
    assert results[0].image_id == results[1].image_id
    assert sorted(states(results[0]) + states(results[1])).count("HIT") >= 5  # the second reused the first
    c = docker_client()
    assert {c.images.get(tag).id for tag in results[0].tags} == {results[0].image_id}
