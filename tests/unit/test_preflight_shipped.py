"""preflight over what a team's script step ships and the serving env, each defect planted in a fixture
written from the facts note (bi100-vendor-facts.md, "How the teams really build"): diagnostic-only env in the run
file, prebuilt ``.so`` files with undefined ``ixformer::infer`` and ``c10`` symbols, and shellcheck's unset
variables against the names the sandbox run shows set (``${SCRIPT_DIR}``, never set, stays a finding)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.preflight.binaries import shared_objects, shipped_so_findings
from imageforge.preflight.findings import CHECKS
from imageforge.preflight.runfile import DIAGNOSTIC_ENV, diagnostic, manifest_env_findings, run_file_findings
from imageforge.preflight.shell import Script, names_from, names_program, shell_scripts, shellcheck
from imageforge.preflight.tree import ShippedFolder
from imageforge.steps import DictFS
from imageforge.vendor_api.elf import read_elf
from imageforge.vendor_api.elfcheck import summarise
from imageforge.vendor_api.record import Library, VendorApi
from tests.unit.conftest import manifest_text

SITE = "/usr/local/corex/lib64/python3/dist-packages"
COREX = "/usr/local/corex/lib64"
DEST = "/workspace/qwen3_6_scripts"
CC = shutil.which("cc") or shutil.which("gcc")

# --------------------------------------------------------------------------- (a) diagnostic-only serving env

#: the baseline run file (facts: "computility-run.yaml (baseline form)") with two diagnostic variables added
RUN_YAML = """\
concurrency: 1
command:
- python3
- -m
- vllm.entrypoints.openai.api_server
- --model
- /model
- --served-model-name
- llm
env:
- name: VLLM_ENGINE_ITERATION_TIMEOUT_S
  value: '3600'
- name: NCCL_DEBUG
  value: INFO
- {name: CUDA_LAUNCH_BLOCKING, value: '0'}
- name: PYTHONFAULTHANDLER
  value: '1'
"""


@pytest.mark.parametrize(("name", "value", "on"), [
    ("CUDA_LAUNCH_BLOCKING", "1", True), ("CUDA_LAUNCH_BLOCKING", "0", False),
    ("NCCL_DEBUG", "INFO", True), ("NCCL_DEBUG", "WARN", False),
    ("VLLM_LOGGING_LEVEL", "DEBUG", True), ("VLLM_LOGGING_LEVEL", "debug", True), ("VLLM_LOGGING_LEVEL", "INFO", False),
    ("TORCH_SHOW_CPP_STACKTRACES", "1", True), ("PYTHONFAULTHANDLER", "1", True),
    ("VLLM_ENGINE_ITERATION_TIMEOUT_S", "3600", False), ("ENABLE_CUSTOM_IPC", "1", False),
])
def test_which_variables_and_values_are_diagnostic_only(name: str, value: str, on: bool) -> None:
    assert (diagnostic(name, value) is not None) is on
    assert CHECKS["run-env-diagnostic"].severity == "warning"
    assert {"CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "TORCH_SHOW_CPP_STACKTRACES", "PYTHONFAULTHANDLER"} <= set(
        DIAGNOSTIC_ENV)


def test_a_run_file_with_diagnostic_env_is_a_warning_at_its_line(tmp_path: Path) -> None:
    run = tmp_path / "computility-run.yaml"
    run.write_text(RUN_YAML)
    found = run_file_findings([run, tmp_path / "absent" / "computility-run.yaml"])
    assert [(f.check, f.level, f.line, f.found) for f in found] == [
        ("run-env-diagnostic", "warning", 13, "NCCL_DEBUG=INFO"),
        ("run-env-diagnostic", "warning", 16, "PYTHONFAULTHANDLER=1")]
    assert all(f.path == str(run) for f in found)
    run.write_text("env: [unclosed\n")
    assert run_file_findings([run]) == [], "a run file that does not parse is not this check's finding"


def test_the_targets_serving_env_and_a_profiles_env_are_findings_at_their_keys(
        write_manifest: Callable[..., Path]) -> None:
    path = write_manifest(manifest_text("""\
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m}
      env: {VLLM_ENGINE_ITERATION_TIMEOUT_S: "3600", CUDA_LAUNCH_BLOCKING: "1"}
    default_profile: fast
    profiles:
      fast: {args: {max-num-seqs: 1}}
      debug: {extends: fast, env: {VLLM_LOGGING_LEVEL: DEBUG}}
"""))
    manifest = load_manifest(path)
    target = manifest.target("t")
    fast = manifest_env_findings(manifest, target, resolve(manifest, "t", "fast", environ={}))
    assert [(f.found, f.line) for f in fast] == [("CUDA_LAUNCH_BLOCKING=1", 10)]
    assert "targets.t.serving.env.CUDA_LAUNCH_BLOCKING" in fast[0].message and fast[0].path == str(path)
    debug = manifest_env_findings(manifest, target, resolve(manifest, "t", "debug", environ={}))
    assert sorted((f.found, f.line) for f in debug) == [("CUDA_LAUNCH_BLOCKING=1", 10),
                                                        ("VLLM_LOGGING_LEVEL=DEBUG", 14)]
    clean = manifest_env_findings(manifest, target, resolve(manifest, "t", "fast", environ={},
                                                           sets=["env.CUDA_LAUNCH_BLOCKING=0"]))
    assert clean == []


# --------------------------------------------------------------------------- (b) every shipped .so, ELF-checked


def _cc(tmp: Path, name: str, source: str, *args: str) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run([str(CC), "-shared", "-fPIC", "-nostdlib", "-o", str(out), str(src), *args], check=True,
                   capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The team's prebuilt bridge (it calls ixformer::infer and c10::detail::torchCheckFail, needs libixformer.so
    and libc10.so), torch's libc10 as the base has it, a libixformer.so with and without ixformer::infer."""
    if CC is None:
        pytest.skip("no C compiler on this host")
    tmp = tmp_path_factory.mktemp("so")
    out = {"c10": _cc(tmp, "libc10.so", "int _ZN3c106detail14torchCheckFailEv(void) { return 1; }\n",
                      "-Wl,-soname,libc10.so")}
    out["ixformer-without"] = _cc(tmp, "libixformer.so", "int _ZN8ixformer7prefillEv(void) { return 2; }\n",
                                  "-Wl,-soname,libixformer.so")
    libs = tmp / "libs"
    libs.mkdir()
    (libs / "libc10.so").write_bytes(out["c10"])
    (libs / "libixformer.so").write_bytes(_cc(tmp, "libixformer-full.so", "int _ZN8ixformer5inferEv(void) { return 3; }"
                                              "\nint _ZN8ixformer7prefillEv(void) { return 2; }\n",
                                              "-Wl,-soname,libixformer.so"))
    bridge = ("extern int _ZN8ixformer5inferEv(void);\nextern int _ZN3c106detail14torchCheckFailEv(void);\n"
              "int ix_bridge(void) { return _ZN8ixformer5inferEv() + _ZN3c106detail14torchCheckFailEv(); }\n")
    out["bridge"] = _cc(tmp, "ix_full_bridge_fused_ar.so", bridge, f"-L{libs}", "-lixformer", "-lc10")
    out["stale-c10"] = _cc(tmp, "ix_paged.so", bridge.replace("14torchCheckFail", "16torchCheckFailV2").replace(
        "_ZN8ixformer5inferEv() + ", ""), f"-L{libs}", "-lc10")
    return out


def _shipped(tmp: Path, **files: bytes) -> ShippedFolder:
    host = tmp / "qwen3_6_scripts"
    host.mkdir()
    (host / "patch_ops.sh").write_text("#!/bin/bash\nset -euo pipefail\n")
    for name, data in files.items():
        (host / name).write_bytes(data)
    return ShippedFolder("organisers-baseline", host, DEST, ("bash", "patch_ops.sh"))


def _base(objects: dict[str, bytes], *, ixformer: bool) -> DictFS:
    files = {f"{SITE}/torch/lib/libc10.so": objects["c10"]}
    if ixformer:
        files[f"{COREX}/libixformer.so"] = objects["ixformer-without"]
    return DictFS(files=files)


def _record(*exports: str) -> VendorApi:
    return VendorApi("3.10.12", {}, {}, {}, libraries={
        f"{COREX}/libixformer.so": Library("libixformer.so", (), frozenset(exports))})


def test_a_prebuilt_so_with_an_undefined_vendor_symbol_is_found_without_the_device(
        tmp_path: Path, objects: dict[str, bytes]) -> None:
    folder = _shipped(tmp_path, **{"ix_full_bridge_fused_ar.so": objects["bridge"],
                                            "ix_paged.so": objects["stale-c10"], "README.md": b"not an object\n"})
    assert sorted(shared_objects(folder)) == ["ix_full_bridge_fused_ar.so", "ix_paged.so"]
    base = _base(objects, ixformer=True)
    found = shipped_so_findings([folder], base, site=SITE, library_path=[COREX])
    by_file = sorted((f.path.rsplit("/", 1)[-1], f.message.split(":", 1)[0]) for f in found)
    assert by_file == [("ix_full_bridge_fused_ar.so", "undefined-symbol"), ("ix_paged.so", "undefined-symbol")]
    bridge = next(f for f in found if "bridge" in f.path)
    assert "ixformer::infer()" in bridge.message and bridge.check == "so-elf" and bridge.level == "error"
    assert bridge.step == "organisers-baseline" and bridge.path == f"{DEST}/ix_full_bridge_fused_ar.so"
    paged = next(f for f in found if "paged" in f.path)
    assert "c10::detail::torchCheckFailV2()" in paged.message, "a c10 symbol the base's libc10 does not define"


def test_the_vendor_api_records_libraries_stand_in_for_ones_the_base_lacks(
        tmp_path: Path, objects: dict[str, bytes]) -> None:
    folder = _shipped(tmp_path, **{"ix_full_bridge_fused_ar.so": objects["bridge"]})
    base = _base(objects, ixformer=False)
    missing = shipped_so_findings([folder], base, site=SITE, library_path=[COREX])
    assert [f.message.split(":", 1)[0] for f in missing] == ["needed-missing", "undefined-symbol"]
    assert "libixformer.so" in missing[0].message
    card = shipped_so_findings([folder], base, site=SITE, library_path=[COREX],
                               api=_record("_ZN8ixformer5inferEv", "_ZN8ixformer7prefillEv"))
    assert card == [], "the card's libixformer (recorded by the probe) exports ixformer::infer"
    old = shipped_so_findings([folder], base, site=SITE, library_path=[COREX], api=_record("_ZN8ixformer7prefillEv"))
    assert len(old) == 1 and "ixformer::infer()" in old[0].message


def test_an_so_is_checked_where_the_script_installed_it_and_a_non_elf_so_is_a_finding(
        tmp_path: Path, objects: dict[str, bytes]) -> None:
    import hashlib

    folder = _shipped(tmp_path, **{"ix_paged.so": objects["stale-c10"], "broken.so": b"#!/bin/sh\n"})
    installed = f"{SITE}/vllm/ix_paged.so"
    found = shipped_so_findings([folder], _base(objects, ixformer=True), site=SITE,
                                deployed={hashlib.sha256(objects["stale-c10"]).hexdigest(): installed})
    paged = next(f for f in found if f.path.endswith("/ix_paged.so"))
    assert paged.found is not None and installed in paged.found
    broken = next(f for f in found if f.path.endswith("/broken.so"))
    assert broken.message.startswith("not-elf:")


def test_elf_facts_and_elfcheck_read_symbols_with_one_reader(objects: dict[str, bytes], tmp_path: Path) -> None:
    path = tmp_path / "ix_full_bridge_fused_ar.so"
    path.write_bytes(objects["bridge"])
    facts, summary = read_elf(path), summarise(objects["bridge"])
    assert facts.needed == summary.needed == ("libixformer.so", "libc10.so")
    assert facts.exports == tuple(sorted(summary.exports)) and "ix_bridge" in facts.exports
    assert set(facts.undefined) == {u.name for u in summary.undefined} >= {"_ZN8ixformer5inferEv"}


# --------------------------------------------------------------------------- (c) unset variables vs the sandbox run

#: a deploy script as the team's patch_ops.sh writes it: the vendor image's env script sourced through a path from the
#: image's ENV (shellcheck cannot follow it), VLLM_ROOT from the step's env, the deploy loop's ${SCRIPT_DIR} never set
PATCH_OPS = """\
#!/bin/bash
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "${COREX_ENV}"
echo "corex at ${COREX_HOME}"
cp "${HERE}/cli_args.py" "${VLLM_ROOT}/entrypoints/openai/cli_args.py"
for so in ix_*.so; do
  cp "$so" "${SCRIPT_DIR}/deploy/"
done
"""


def _script(tmp: Path) -> tuple[Script, Path]:
    host = tmp / "qwen3_6_scripts"
    host.mkdir()
    (host / "patch_ops.sh").write_text(PATCH_OPS)
    (host / "cli_args.py").write_text("X = 1\n")
    image_env = tmp / "image" / "usr" / "local" / "corex" / "env.sh"  # a file of the image, not of the folder
    image_env.parent.mkdir(parents=True)
    image_env.write_text("export COREX_HOME=/usr/local/corex\nexit 0\n")  # exit: the names are printed still
    folder = ShippedFolder("organisers-baseline", host, str(host), ("bash", "patch_ops.sh"))
    return next(s for s in shell_scripts([folder]) if s.rel == "patch_ops.sh"), image_env


def _unset(findings: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(f.message.split(" ", 2)[1] for f in findings if f.message.startswith("SC2154"))


def test_unset_variables_the_sandbox_run_shows_set_are_dismissed_script_dir_stays(tmp_path: Path) -> None:
    script, image_env = _script(tmp_path)
    assert _unset(shellcheck(script)) == ["COREX_ENV", "COREX_HOME", "SCRIPT_DIR", "VLLM_ROOT"]
    program = names_program(script)
    assert program is not None
    asked: list[str] = []

    def sandbox(s: Script) -> frozenset[str]:  # the container's part, run with this host's bash
        asked.append(s.rel)
        out = subprocess.run(["bash", "-c", program, s.image_path], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", "COREX_ENV": str(image_env),  # the image's ENV
                                  "VLLM_ROOT": f"{SITE}/vllm"})  # the step's env
        return names_from(out.stdout)

    lint = shellcheck(script, sandbox)
    assert _unset(lint) == ["SCRIPT_DIR"], "COREX_HOME (sourced), COREX_ENV and VLLM_ROOT (env) are set"
    (left,) = [f for f in lint if f.message.startswith("SC2154")]
    assert left.line == 8 and left.level == "error" and asked == ["patch_ops.sh"]


def test_a_script_that_sources_nothing_needs_no_sandbox_run(tmp_path: Path) -> None:
    host = tmp_path / "s"
    host.mkdir()
    (host / "deploy.sh").write_text("#!/bin/bash\nset -e\nX=1\necho \"$X\"\n")
    (script,) = shell_scripts([ShippedFolder("s", host, "/workspace/s", ("bash", "deploy.sh"))])
    assert names_program(script) is None
    assert names_from("HOME\nPATH\nnot-a-name\nX\n") == frozenset({"HOME", "PATH", "X"})


# --------------------------------------------------------------------------- run_preflight's parts, daemon faked


class _Container:
    """A container of the final tree whose command runs with this host's bash, in the image's ENV."""

    def __init__(self, command: list[str], environment: dict[str, str], image_env: dict[str, str]) -> None:
        self.command, self.env = command, {"PATH": "/usr/bin:/bin", **image_env, **environment}
        self.output = b""

    def start(self) -> None:
        self.output = subprocess.run(self.command, capture_output=True, env=self.env, check=False).stdout

    def wait(self, timeout: int) -> None:
        assert timeout > 0

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return self.output


class _Scope:
    def __init__(self, image_env: dict[str, str]) -> None:
        self.image_env = image_env
        self.created: list[dict[str, object]] = []
        self.removed: list[_Container] = []

    def create(self, image: str, **kwargs: object) -> _Container:
        self.created.append({"image": image, **kwargs})
        return _Container(list(kwargs["command"]), dict(kwargs["environment"]), self.image_env)  # type: ignore[call-overload]

    def remove(self, container: _Container) -> None:
        self.removed.append(container)


def test_the_sandbox_names_run_in_a_throwaway_container_with_the_network_off(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from imageforge.preflight.run import _NamesSet

    script, image_env = _script(tmp_path)
    env = {"COREX_ENV": str(image_env), "VLLM_ROOT": f"{SITE}/vllm"}  # the image's ENV
    scope = _Scope(env)
    names = _NamesSet(SimpleNamespace(image="sha256:final", scope=scope), env, {})  # type: ignore[arg-type]
    assert _unset(shellcheck(script, names)) == ["SCRIPT_DIR"]
    (made,) = scope.created
    assert made["image"] == "sha256:final" and made["network_disabled"] is True and len(scope.removed) == 1
    assert made["command"][:2] == ["bash", "-c"] and made["command"][3] == script.image_path  # type: ignore[index]


def test_an_so_the_script_installed_is_found_by_its_bytes(tmp_path: Path) -> None:
    import hashlib
    from types import SimpleNamespace

    from imageforge.preflight.run import _deployed

    folder = _shipped(tmp_path, **{"ix_paged.so": b"\x7fELF paged", "ix_other.so": b"\x7fELF other"})
    installed = f"{SITE}/vllm/ix_paged.so"
    files = {installed: b"\x7fELF paged", f"{DEST}/ix_paged.so": b"\x7fELF paged", f"{SITE}/vllm/x.py": b""}
    sandbox = SimpleNamespace(changed=dict.fromkeys(files))
    found = _deployed([folder], sandbox, SimpleNamespace(read=files.get))  # type: ignore[arg-type]
    assert found == {hashlib.sha256(b"\x7fELF paged").hexdigest(): installed}, "not the folder's own copy"
