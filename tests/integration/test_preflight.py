"""``imageforge preflight`` against real images: clean on the cpu target (the real base) and on bi100
(the vendor-layout fixture), and a team folder written from the facts note ("How the teams really build") whose
every defect comes out in one run, the checks going on over the tree as the failed script left it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.bi100_fixture import BASELINE, SITE, vendor_image
from tests.integration.forge_fixtures import REPO, assert_clean_failure, build_containers, invoke, settles
from tests.integration.test_bi100_vendor_layout import sandbox_images

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vendor() -> str:
    return vendor_image()


def env_for(base: str, scripts: Path) -> dict[str, str]:
    return {"IMAGEFORGE_BI100_BASE": base, "IMAGEFORGE_BI100_SCRIPTS": str(scripts)}


def test_cpu_target_is_clean_on_the_real_base() -> None:
    from imageforge.base import base_image_status

    if not base_image_status(REPO / "images" / "cpu").vllm_present:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    before = build_containers()
    proc = invoke("preflight", "--target", "cpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["counts"]["error"] == 0, report["findings"]
    assert report["ran"] == ["validate", "steps", "final-state", "python", "scripts", "flags", "run-env", "submission",
                             "git"]
    assert report["stats"]["changed .py"] >= 1, "the cpu target's patched files were checked"
    (said,) = [n for n in report["notes"] if ".py compiled by the target's Python" in n]
    assert "grammar" not in said, "the base's interpreter is of the target's version: its verdict alone"
    assert settles(lambda: build_containers() <= before), "no container left behind"


def test_bi100_is_clean_on_the_vendor_layout_fixture(vendor: str) -> None:
    proc = invoke("preflight", "--target", "bi100", "--json", env=env_for(vendor, BASELINE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors == []
    # the fixture's Python is Debian's, the record's the card's: said, not failed
    assert [f["check"] for f in report["findings"] if f["severity"] == "warning"] == ["vendor-versions"]
    assert "vendor-api" in report["ran"] and report["stats"]["changed .py"] >= 6
    # every checked .py compiled by the base's own interpreter in one call; the fixture's Python (Debian's) is not
    # the record's (the card's 3.10), so the 3.10 grammar is checked too, and both are said
    (said,) = [n for n in report["notes"] if ".py compiled by the target's Python" in n]
    assert "(/usr/bin/python3); the target's 3.10" in said and "grammar checked by this machine's Python" in said
    strict = invoke("preflight", "--target", "bi100", "--strict", env=env_for(vendor, BASELINE))
    assert_clean_failure(strict, 3)
    assert "warning[vendor-versions]" in strict.stdout


#: The team's patch_ops.sh as the facts note describes its failures: the changed modules are deployed, then a
#: stale SHA256SUMS aborts it under `set -e` before cli_args.py (so --reasoning-parser is refused); a deploy loop
#: uses ${SCRIPT_DIR}, never set; a cp names a file the folder does not ship; a patcher imports, inside
#: try/except, a module the build never ships.
PATCH_OPS = """\
#!/bin/bash
set -euo pipefail
VLLM=/usr/local/corex/lib64/python3/dist-packages/vllm
cp paged_attn.py "$VLLM/attention/ops/paged_attn.py"
cp qwen3_5.py "$VLLM/model_executor/models/qwen3_5.py"
cp cache_ops.py "$VLLM/attention/ops/cache_ops.py"
python3 patch_fused_ar.py
echo "modules deployed"
sha256sum -c SHA256SUMS
for f in protocol.py cli_args.py serving_chat.py; do
    cp "$f" "$VLLM/entrypoints/openai/$f"
done
cp verify_dlopen_chain.py "$VLLM/verify_dlopen_chain.py"
for so in ix_full_bridge_fused_ar.so; do
    cp "${SCRIPT_DIR}/$so" "$VLLM/"
done
echo "baseline files deployed"
"""

CACHE_OPS = """\
import ixformer.functions as ixf_F


def copy_blocks(key_caches, value_caches, block_mapping):
    ixf_F.copy_blocks(key_caches, value_caches, block_mapping)


def copy_cache(src, dst):
    ixf_F.vllm_copy_cache(src, dst)
"""

PATCH_FUSED_AR = """\
try:
    from ex_engine.python.patch_fused_linear_allreduce import apply_patch
    apply_patch()
except Exception as exc:
    print("fused all-reduce skipped:", exc)
"""

DOCKERFILE = """\
FROM vendor-image
COPY qwen3_6_scripts /workspace/qwen3_6_scripts
WORKDIR /workspace/qwen3_6_scripts
RUN chmod +x patch_ops.sh && bash patch_ops.sh 2>&1 | tee /tmp/patch.log; echo "patch_ops finished"
"""


def _team_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "team"
    scripts = repo / "qwen3_6_scripts"
    shutil.copytree(BASELINE, scripts)
    (scripts / "patch_ops.sh").write_text(PATCH_OPS)
    (scripts / "cache_ops.py").write_text(CACHE_OPS)
    (scripts / "patch_fused_ar.py").write_text(PATCH_FUSED_AR)
    (scripts / "ix_paged.so").write_bytes(b"\x7fELF" + b"\2" * 120)
    (scripts / "ix_full_bridge_fused_ar.so").write_bytes(b"\x7fELF" + b"\3" * 120)
    stale = hashlib.sha256(b"ix_paged.so before its rebuild").hexdigest()
    (scripts / "SHA256SUMS").write_text(f"{stale}  ix_paged.so\n")
    (scripts / "chat_template.jinja").write_bytes(b"{% for m in messages %}\r\n{{ m.content }}\r\n{% endfor %}\r\n")
    (repo / "Dockerfile").write_text(DOCKERFILE)
    git = ["git", "-C", str(repo), "-c", "user.name=team", "-c", "user.email=team@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "reset", "-q", "qwen3_6_scripts/cache_ops.py"], check=True)  # never added
    subprocess.run([*git, "commit", "-qm", "team build"], check=True)
    return scripts


def test_the_whole_package_is_searched_in_the_final_tree(tmp_path: Path) -> None:
    """A module of the vendor's own vLLM that no step changes and no check reads (a) uses ixformer names the record
    lacks: ONE warning lists each use (file:line); (b) calls a function the team's deployed file replaces at run time
    with one that takes fewer arguments: an error. Both found by the greps over the whole package in the final tree
    (one container with the compile by the base's interpreter)."""
    rel = "usr/local/corex/lib64/python3/dist-packages/vllm/engine/protocol.py"
    original = (REPO / "tests" / "fixtures" / "bi100-vendor" / rel).read_text()
    latent = vendor_image(overrides={rel: original + (
        "\n\ndef _swap(src, dst, mapping):\n    import ixformer.functions as ixf_F\n\n"
        "    ixf_F.vllm_swap_blocks(src, dst, mapping)\n    ixf_F.copy_blocks(src, dst)\n\n\n"
        "def _decode(out, query, cache):\n    from vllm import _custom_ops as ops\n\n"
        "    ops.paged_attention_v2(out, query, cache)\n")})
    lines = len(original.splitlines())
    scripts = tmp_path / "qwen3_6_scripts"
    shutil.copytree(BASELINE, scripts)
    (scripts / "fast_ops.py").write_text("from vllm import _custom_ops as ops\n\n\ndef fast_v2(out, query):\n"
                                         "    return out\n\n\nops.paged_attention_v2 = fast_v2\n")
    patch_ops = scripts / "patch_ops.sh"
    deployed = 'echo "baseline files deployed'
    patch_ops.write_text(patch_ops.read_text().replace(deployed, f'cp fast_ops.py "$VLLM/fast_ops.py"\n{deployed}', 1))
    proc = invoke("preflight", "--target", "bi100", "--json", "--allow-dirty", env=env_for(latent, scripts))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    (error,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert (error["check"], error["path"], error["line"]) == ("call-replaced", f"{SITE}/vllm/fast_ops.py", 4)
    assert f"does not accept the call at {SITE}/vllm/engine/protocol.py:{lines + 13}: too many positional" \
        in error["message"], "the vendor's caller, found by the grep over the package"
    (found,) = [f for f in report["findings"] if f["check"] == "vendor-latent"]
    assert found["severity"] == "warning" and found["path"] == f"{SITE}/vllm"
    assert found["found"].splitlines() == [
        f"{SITE}/vllm/engine/protocol.py:{lines + 6} ixformer.functions.vllm_swap_blocks (the record has: "
        "vllm_copy_cache)",
        f"{SITE}/vllm/engine/protocol.py:{lines + 7} ixformer.functions.copy_blocks (the record has: "
        "vllm_copy_cache)"]
    assert not [f for f in report["findings"] if f["check"] == "vendor-name"], "no error: nothing changed calls it"
    assert report["stats"]["vendor-scanned .py"] >= 2 and report["stats"]["replacement callers"] >= 1
    assert report["stats"]["listed .py read at once"] >= 2, "the grep's files came back in one archive"


def test_every_defect_of_a_team_folder_in_one_run(vendor: str, tmp_path: Path) -> None:
    scripts = _team_repo(tmp_path)
    before = set(sandbox_images())
    proc = invoke("preflight", "--target", "bi100", "--json", env=env_for(vendor, scripts))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    findings = json.loads(proc.stdout)["findings"]

    def one(check: str, needle: str) -> dict[str, object]:
        hits = [f for f in findings if f["check"] == check and needle in json.dumps(f)]
        assert len(hits) == 1, (check, needle, json.dumps(findings, indent=1))
        hit: dict[str, object] = hits[0]
        return hit

    dest = "/workspace/qwen3_6_scripts"
    failed = one("script-failed", "organisers-baseline")
    assert "script failed: exit code 1" in str(failed["message"]), failed
    assert "FAILED" in str(failed["found"]), "sha256sum -c's line in the log tail"
    pin = one("pin-stale", "ix_paged.so")
    assert pin["path"] == f"{dest}/SHA256SUMS" and pin["line"] == 1
    assert pin["found"] == hashlib.sha256((scripts / "ix_paged.so").read_bytes()).hexdigest()
    assert one("pin-missing", "ix_full_bridge_fused_ar.so")["path"] == f"{dest}/ix_full_bridge_fused_ar.so"
    assert one("cp-source", "verify_dlopen_chain.py")["line"] == 13
    unset = one("shellcheck", "SCRIPT_DIR")
    assert unset["severity"] == "error" and unset["line"] == 15
    guarded = one("py-import", "ex_engine")
    assert "silently off" in str(guarded["message"]) and guarded["path"] == f"{dest}/patch_fused_ar.py"
    assert one("crlf", "chat_template.jinja")["line"] == 1
    # the modules the script deployed before it aborted are checked in the tree as it left them
    name = one("vendor-name", "copy_blocks")
    assert name["path"] == f"{SITE}/vllm/attention/ops/cache_ops.py" and name["line"] == 5
    assert "vllm_copy_cache" in str(name["hint"])
    arity = one("vendor-arity", "vllm_copy_cache")
    assert "missing a required argument: 'block_mapping'" in str(arity["message"])
    # cli_args.py was never installed: the parser as the platform would have built it refuses the flag
    flag = one("flags", "reasoning-parser")
    assert "failed script" in str(flag["message"])
    assert one("git-state", "cache_ops.py")["severity"] == "error"
    assert one("run-exit-code", "tee")["path"] == str(scripts.parent / "Dockerfile")
    assert settles(lambda: set(sandbox_images()) <= before), "the throwaway images are removed"

    text = invoke("preflight", "--target", "bi100", "--allow-dirty", env=env_for(vendor, scripts))
    assert_clean_failure(text, 3)
    assert "warning[git-state]" in text.stdout and "error[vendor-name]" in text.stdout
    assert f"{dest}/SHA256SUMS:1: error[pin-stale]" in text.stdout


def test_probe_rehearsed_on_the_cpu_base(tmp_path: Path) -> None:
    """The probe program with the cpu base's own interpreter (network off): vLLM's ops module (it loads the _C
    extension this CPU runs: importing ``vllm._C`` itself is an AVX-512 build, SIGILL here), the ``torch.ops._C``
    operators with their schemas; the loaded ``.so`` files read back out and their ELF facts taken here."""
    from imageforge.docker_engine.containers import read_file
    from imageforge.inimage import program
    from imageforge.vendor_api import load_record
    from imageforge.vendor_api.probe import write_record
    from tests.integration.forge_fixtures import client
    from tests.integration.helpers import cpu_base_refs

    _, base = cpu_base_refs()
    c = client()
    try:
        c.images.get(base)
    except Exception:
        pytest.skip("the cpu base image is not built (invoke base --target cpu)")
    container = c.containers.create(base, entrypoint=["sleep", "600"], command=[], network_disabled=True,
                                    environment={"VLLM_TARGET_DEVICE": "cpu", "HOME": "/tmp"},
                                    labels={"org.imageforge.tool": "imageforge-test"})
    try:
        container.start()
        from imageforge.docker_engine.containers import file_entry, tar_of

        source = program("probe_api").encode()
        entry = file_entry("/tmp/probe_api.py", source, mode=0o644)
        assert container.put_archive("/", tar_of([entry], {entry.name: source}))
        argv = ["python3", "/tmp/probe_api.py", "vllm._custom_ops", "--ops", "_C"]
        code, output = container.exec_run(argv, demux=True)
        assert code == 0, (output[1] or b"").decode()[-2000:]
        data = json.loads(output[0])

        def local(path: str) -> Path:
            found = read_file(container, path)
            assert found is not None, path
            copy = tmp_path / path.lstrip("/").replace("/", "_")
            copy.write_bytes(found[0])
            return copy

        result = write_record(data, tmp_path / "vendor-api.json", local=local)
    finally:
        container.remove(force=True)
    api = load_record(tmp_path / "vendor-api.json")
    assert api.versions["vllm"] and api.versions["torch"] and api.python.startswith("3.")
    ops = api.modules["torch.ops._C"]
    assert len(ops) > 10, "vLLM's cpu operators registered under torch.ops._C"
    with_schema = [m for m in ops.values() if m.signature and m.signature.startswith("(")]
    assert len(with_schema) == len(ops)
    assert api.member("vllm._custom_ops", "rms_norm") is not None
    lib = next(p for p in api.libraries if "/vllm/_C" in p)
    assert any(e.startswith("PyInit__C") for e in api.libraries[lib].exports)
    assert any("torch" in n for n in api.libraries[lib].needed)
    assert result.libraries == len(api.libraries) and "vllm" in api.distributions


def test_an_adopted_team_repository_runs_preflight_from_its_own_folder(vendor: str, tmp_path: Path) -> None:
    """init --from on a team repository (root Dockerfile + computility-run.yaml, facts note), then preflight from
    there with the `imageforge` command alone: the RUN that discards its exit code and the untracked build.yaml
    are the findings; the baseline script runs, the flags check against the parser it leaves."""
    from tests.unit.test_preflight import _team_checkout

    repo = _team_checkout(tmp_path)
    # the team's record of the card (here the one written from the facts note): torch, pydantic, ... are the card's
    shutil.copy(REPO / "overlays" / "bi100" / "vendor-api.json", repo / "vendor-api.json")
    git = ["git", "-C", str(repo), "-c", "user.name=team", "-c", "user.email=team@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "team build"], check=True)
    absent = invoke("init", "--from", str(repo), "--base", "imageforge-test/absent:none")
    assert absent.returncode == 0, absent.stdout + absent.stderr
    assert "touches: could not be scanned (base image 'imageforge-test/absent:none' is not on the Docker daemon" \
        in absent.stdout, "a base not on the daemon is said, not failed"
    made = invoke("init", "--from", str(repo), "--base", vendor, "--force")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "not translated: Dockerfile:6: EXPOSE" in made.stdout
    # the script ran in a throwaway container of the base: its touches are the files patch_ops.sh writes there,
    # learnt at run time (its $VLLM), not its own folder nor its log
    adopted = yaml.safe_load((repo / "build.yaml").read_text())
    (step,) = adopted["targets"]["adopted"]["steps"]
    assert step["command"] == ["bash", "patch_ops.sh"]
    assert step["touches"] == ["vllm/attention/ops/paged_attn.py", "vllm/entrypoints/openai/cli_args.py",
                               "vllm/entrypoints/openai/protocol.py", "vllm/entrypoints/openai/serving_chat.py",
                               "vllm/model_executor/models/qwen3_5.py"]
    from tests.cli import imageforge

    proc = imageforge("preflight", "--json", cwd=repo, expect=None, env={"IMAGEFORGE_TRACEBACK": None})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    errors = sorted((f["check"], Path(f["path"]).name) for f in report["findings"] if f["severity"] == "error")
    assert errors == [("git-state", "build.yaml"), ("run-exit-code", "Dockerfile")], report["findings"]
    assert "flags" in report["ran"] and report["stats"]["scripts"] == 1
