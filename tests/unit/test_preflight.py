"""preflight's checks without a daemon: each finding kind planted in a fixture written from the facts
note (bi100-vendor-facts.md, "How the teams really build"), the vendor API record's format and the arity check."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from imageforge.errors import ConfigError
from imageforge.patches.compiled import Compiled
from imageforge.preflight.findings import CHECKS, Finding, PreflightReport
from imageforge.preflight.gitstate import git_findings
from imageforge.preflight.python import PyFile, PythonChecks, dead_files
from imageforge.preflight.shell import (
    bash_n,
    build_device_imports,
    cp_sources,
    crlf,
    pins,
    run_exit_codes,
    shell_scripts,
    shellcheck,
    swallowed,
)
from imageforge.preflight.tree import FinalTree, ShippedFolder, tree_from_mapping
from imageforge.vendor_api import check_call, load_record, record_from_json
from imageforge.vendor_api.elf import read_elf
from imageforge.vendor_api.probe import probe
from imageforge.vendor_api.record import record_to_json

REPO = Path(__file__).resolve().parents[2]
BI100_RECORD = REPO / "overlays" / "bi100" / "vendor-api.json"
SITE = "/usr/local/corex/lib64/python3/dist-packages"
VLLM = f"{SITE}/vllm"

# --------------------------------------------------------------------------- the record and the arity check


def test_bi100_record_has_the_function_the_card_has_not_the_ones_the_team_tried() -> None:
    api = load_record(BI100_RECORD)
    assert api.python.startswith("3.10.") and api.versions["vllm"] == "0.6.3+corex.3.2.3"
    assert api.lookup("ixformer.functions", "vllm_copy_cache") == "present"
    assert api.lookup("ixformer.functions", "copy_blocks") == "absent"
    assert api.lookup("ixformer.functions", "vllm_copy_blocks") == "absent"
    assert api.lookup("ixformer", "functions") == "present", "a recorded submodule is a name of its package"
    assert api.lookup("ixformer.inference.functions", "anything") == "unknown", "complete: false"
    assert "vllm_copy_cache" in api.close_names("ixformer.functions", "vllm_copy_blocks")
    again = record_from_json(json.loads(json.dumps(record_to_json(api))))
    assert again.modules == api.modules and again.complete == api.complete


def test_record_problems_are_all_reported_with_their_keys() -> None:
    with pytest.raises(ConfigError) as info:
        record_from_json({"format": 2, "python": None, "modules": {"m": {"f": {"kind": "lambda", "signature": 3}}}},
                         "x.json")
    text = info.value.render()
    for key in ("format", "python", "modules.m.f.kind", "modules.m.f.signature"):
        assert f"x.json: {key}:" in text, text
    assert "4 problems" in text


@pytest.mark.parametrize(("signature", "positional", "keywords", "why"), [
    ("(src, dst, block_mapping)", 3, (), None),
    ("(src, dst, block_mapping)", 2, (), "missing a required argument: 'block_mapping'"),
    ("(src, dst, block_mapping)", 4, (), "too many positional arguments"),
    ("(src, dst, block_mapping)", 2, ("block_mapping",), None),
    ("(src, dst, block_mapping)", 2, ("mapping",), "missing a required argument: 'block_mapping'"),
    ("(x, /, y=1, *, z)", 1, ("z",), None),
    ("(x, /, y=1, *, z)", 1, (), "missing a required argument: 'z'"),
    ("(arg0: torch.Tensor, arg1: int) -> None", 2, (), None),  # a pybind docstring that is Python
    ("(arg0: List[at::Tensor], arg1: int) -> None", 7, (), "too many positional arguments"),  # still Python
    ("(arg0: std::vector<at::Tensor>, arg1: int) -> None", 7, (), None),  # C++ types: unknown, no finding
    (None, 9, (), None),
])
def test_check_call(signature: str | None, positional: int, keywords: tuple[str, ...], why: str | None) -> None:
    assert check_call(signature, positional, keywords) == why


def test_a_call_with_star_arguments_is_not_counted() -> None:
    assert check_call("(a, b)", 5, star_args=True) is None


# --------------------------------------------------------------------------- findings and the report


def test_report_renders_like_ruff_and_fails_on_errors_or_with_strict_on_warnings() -> None:
    f = Finding("vendor-name", "ixformer.functions has no 'copy_blocks'", f"{VLLM}/_custom_ops.py", 40, 5,
                step="team-patch", expected="a name of ixformer.functions", found="copy_blocks",
                hint="the record has: vllm_copy_cache")
    w = Finding("vendor-versions", "versions differ", "vendor-api.json")
    report = PreflightReport("bi100", None, (f, w), seconds=1.25)
    text = report.text()
    assert text.splitlines()[0] == f"{VLLM}/_custom_ops.py:40:5: error[vendor-name] ixformer.functions has no " \
                                   "'copy_blocks'"
    assert "    step:     team-patch" in text and "    hint:     the record has: vllm_copy_cache" in text
    assert "FAILED: 1 error(s), 1 warning(s)" in text.splitlines()[-1]
    assert not report.ok and report.to_json()["counts"] == {"error": 1, "warning": 1, "info": 0}
    assert PreflightReport("bi100", None, (w,)).ok
    assert not PreflightReport("bi100", None, (w,), strict=True).ok
    with pytest.raises(ValueError):
        Finding("no-such-check", "x")
    assert all(c.severity in ("error", "warning", "info") for c in CHECKS.values())


# --------------------------------------------------------------------------- Python over a final tree

VENDOR_CUSTOM_OPS = """\
import torch
import ixformer.functions as ixf_F


def copy_blocks(key_caches, value_caches, block_mapping):
    ixf_F.copy_blocks(key_caches, value_caches, block_mapping)


def copy_cache(src, dst, block_mapping):
    ixf_F.vllm_copy_cache(src, dst, block_mapping)


def swap_blocks(src, dst, block_mapping):
    ixf_F.vllm_swap_blocks(src, dst, block_mapping)
"""

CHANGED_PAGED_ATTN = """\
import torch

from vllm import _custom_ops as ops
from vllm.triton_utils import HAS_TRITON


class PagedAttention:
    @staticmethod
    def copy_blocks(kv_caches, src_to_dists):
        key_caches = [kv_cache[0] for kv_cache in kv_caches]
        value_caches = [kv_cache[1] for kv_cache in kv_caches]
        ops.copy_blocks(key_caches, value_caches, src_to_dists)
"""


def _tree(files: dict[str, str], changed: dict[str, str], *, added: tuple[str, ...] = (),
          folders: tuple[ShippedFolder, ...] = ()) -> FinalTree:
    data = {p: t.encode() for p, t in files.items()}
    return tree_from_mapping(data, changed=changed, site=SITE, package="vllm", python_version="3.10.12",
                             added=added, folders=folders)


BASE = {
    f"{VLLM}/__init__.py": "",
    f"{VLLM}/_custom_ops.py": VENDOR_CUSTOM_OPS,
    f"{VLLM}/triton_utils/__init__.py": "from vllm.triton_utils.importing import HAS_TRITON\n",
    f"{VLLM}/triton_utils/importing.py": "HAS_TRITON = False\n",
    f"{VLLM}/attention/__init__.py": "",
    f"{VLLM}/attention/ops/__init__.py": "",
    f"{VLLM}/lazy.py": "def __getattr__(name):\n    return name\n",
    f"{SITE}/torch/__init__.py": "",
}


def _check(tree: FinalTree, paths: list[str]) -> PythonChecks:
    checks = PythonChecks(tree, load_record(BI100_RECORD))
    for path in paths:
        checks.check(PyFile(path, (tree.read(path) or b"").decode(), tree.producer(path), tree.roots))
    checks.latent_in([p for p in checks._asts if p not in tree.files])
    return checks


def test_a_vendor_function_absent_from_the_record_is_an_error_naming_the_chain() -> None:
    files = {**BASE, f"{VLLM}/attention/ops/paged_attn.py": CHANGED_PAGED_ATTN}
    tree = _tree(files, {f"{VLLM}/attention/ops/paged_attn.py": "team-paged-attn"})
    found = _check(tree, [f"{VLLM}/attention/ops/paged_attn.py"]).scan.findings
    names = [f for f in found if f.check == "vendor-name"]
    chain = next(f for f in names if f.found == "copy_blocks")
    assert chain.level == "error" and chain.path == f"{VLLM}/_custom_ops.py" and chain.line == 6
    assert "reached from paged_attn.py:12 ops.copy_blocks" in chain.message
    assert "vllm_copy_cache" in (chain.hint or "")
    assert [f.found for f in names] == ["copy_blocks"], "the vendor's own latent reference is no vendor-name"
    (latent,) = [f for f in found if f.check == "vendor-latent"]
    assert latent.level == "warning", "the vendor's own latent reference, nothing changed calls it"
    assert latent.found == f"{VLLM}/_custom_ops.py:14 ixformer.functions.vllm_swap_blocks (the record has: " \
                           "vllm_copy_cache)"


LATENT_WORKER = """\
import ixformer.functions as ixf_F
from vllm import _C


def swap(src, dst, mapping):
    ixf_F.vllm_swap_blocks(src, dst, mapping)
    ixf_F.vllm_copy_cache(src, dst)
"""


def test_the_vendor_latent_references_over_the_whole_package_are_one_warning(tmp_path: Path) -> None:
    files = {**BASE, f"{VLLM}/attention/ops/paged_attn.py": CHANGED_PAGED_ATTN,
             f"{VLLM}/worker/swapper.py": LATENT_WORKER, f"{VLLM}/worker/plain.py": "X = 1\n"}
    tree = _tree(files, {f"{VLLM}/attention/ops/paged_attn.py": "team-paged-attn"})
    checks = PythonChecks(tree, load_record(BI100_RECORD))
    checks.check(PyFile(f"{VLLM}/attention/ops/paged_attn.py", CHANGED_PAGED_ATTN, "team-paged-attn", tree.roots))
    argv = checks.package_words()
    assert argv == ["grep", "-rlwF", "--include=*.py", "-e", "ixformer", "--", VLLM]
    # the grep run over the package (here a copy of it on disk): the files naming a record module
    root = tmp_path / "root"
    for path, text in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    listed = subprocess.run([*argv[:-1], str(root) + argv[-1]], capture_output=True, text=True).stdout.split()
    named = sorted(p[len(str(root)):] for p in listed)
    assert named == [f"{VLLM}/_custom_ops.py", f"{VLLM}/worker/swapper.py"], "paged_attn.py names no record module"
    read = [*checks._asts, *named]  # the modules the checks read (_custom_ops, triton_utils) and the grep's
    assert checks.latent_in([f"{VLLM}/attention/ops/paged_attn.py", *read]) == 3, "the changed file is not read"
    errors = [f for f in checks.scan.findings if f.level == "error"]
    assert [(f.check, f.found) for f in errors] == [("vendor-name", "copy_blocks")], "the chain stays an error"
    (latent,) = [f for f in checks.scan.findings if f.check == "vendor-latent"]
    assert latent.level == "warning" and latent.path == VLLM and "3 use(s)" in latent.message
    assert (latent.found or "").splitlines() == [
        f"{VLLM}/_custom_ops.py:14 ixformer.functions.vllm_swap_blocks (the record has: vllm_copy_cache)",
        f"{VLLM}/worker/swapper.py:6 ixformer.functions.vllm_swap_blocks (the record has: vllm_copy_cache)",
        f"{VLLM}/worker/swapper.py:7 ixformer.functions.vllm_copy_cache() missing a required argument: "
        "'block_mapping'"]
    rendered = latent.render().splitlines()
    assert rendered[0] == f"{VLLM}: warning[vendor-latent] 3 use(s) of the vendor's API that the record does not " \
                          "have or that do not fit it, in the package's own code no changed code reaches (each fails " \
                          "only when it runs)"
    assert rendered[3].startswith(" " * 14 + f"{VLLM}/worker/swapper.py:6"), "one file:line a line"


def test_a_call_with_the_wrong_number_of_arguments_is_an_arity_error() -> None:
    text = "import ixformer.functions as ixf_F\n\n\ndef f(a, b):\n    ixf_F.vllm_copy_cache(a, b)\n"
    tree = _tree({**BASE, f"{VLLM}/worker/cache.py": text}, {f"{VLLM}/worker/cache.py": "team-cache"})
    found = [f for f in _check(tree, [f"{VLLM}/worker/cache.py"]).scan.findings if f.check == "vendor-arity"]
    assert len(found) == 1 and found[0].line == 5 and found[0].step == "team-cache"
    assert "missing a required argument: 'block_mapping'" in found[0].message
    assert found[0].expected == "vllm_copy_cache(src, dst, block_mapping)"
    assert found[0].found == "2 positional arguments"


def test_getattr_and_from_import_count_as_uses_of_vendor_names() -> None:
    text = ("import ixformer.functions as ixf_F\nfrom ixformer.functions import vllm_copy_blocks\n\n"
            "fn = getattr(ixf_F, 'copy_blocks')\n")
    tree = _tree({**BASE, f"{VLLM}/x.py": text}, {f"{VLLM}/x.py": "s"})
    found = {(f.line, f.found) for f in _check(tree, [f"{VLLM}/x.py"]).scan.findings if f.check == "vendor-name"}
    assert found == {(2, "vllm_copy_blocks"), (4, "copy_blocks")}


def test_an_import_of_a_module_not_in_the_tree_guarded_says_what_is_silently_off() -> None:
    text = ("import os\n\ntry:\n    from ex_engine.python.patch_fused_linear_allreduce import apply\n"
            "    apply()\n    print('fused all-reduce on')\nexcept Exception:\n    pass\n")
    folder_tree = _tree(BASE, {})
    checks = PythonChecks(folder_tree, load_record(BI100_RECORD))
    checks.check(PyFile("/workspace/qwen3_6_scripts/patch_fused.py", text, "organisers-baseline",
                        ("/workspace/qwen3_6_scripts", SITE)))
    (f,) = [f for f in checks.scan.findings if f.check == "py-import"]
    assert f.line == 4 and "no module named 'ex_engine.python.patch_fused_linear_allreduce'" in f.message
    assert "guarded by try/except at line 3: silently off, lines 5-6 after it in the try block never run" in f.message
    assert f.step == "organisers-baseline"


def test_from_import_of_a_missing_name_and_an_open_ended_module() -> None:
    text = ("from vllm.triton_utils import HAS_TRITON, HAS_TRITON_KERNELS\nfrom vllm.lazy import anything\n"
            "from vllm.attention import ops\nimport vllm.nowhere\nimport json\nimport torch\nimport pydantic\n")
    tree = _tree({**BASE, f"{VLLM}/y.py": text}, {f"{VLLM}/y.py": "s"})
    found = {(f.check, f.line): f for f in _check(tree, [f"{VLLM}/y.py"]).scan.findings}
    assert set(found) == {("py-import", 1), ("py-import-unknown", 2), ("py-import", 4)}, found
    assert "cannot import name 'HAS_TRITON_KERNELS' from 'vllm.triton_utils'" in found[("py-import", 1)].message
    assert found[("py-import-unknown", 2)].level == "info"


def test_syntax_of_the_target_python_and_compile() -> None:
    newer = "try:\n    pass\nexcept* ValueError:\n    pass\n"  # 3.11 syntax, the card's Python is 3.10
    unclosed = "def verify(chain):\n    print(sorted(chain)\n"  # the team's verify_dlopen_chain.py at eaf4cfa9
    tree = _tree({**BASE, f"{VLLM}/a.py": newer, f"{VLLM}/b.py": unclosed}, {f"{VLLM}/a.py": "s", f"{VLLM}/b.py": "s"})
    found = {f.path: f for f in _check(tree, [f"{VLLM}/a.py", f"{VLLM}/b.py"]).scan.findings}
    assert found[f"{VLLM}/a.py"].check == "py-syntax" and "3.10" in found[f"{VLLM}/a.py"].message
    assert found[f"{VLLM}/b.py"].check == "py-syntax" and found[f"{VLLM}/b.py"].line in (2, 3)


def _target_interpreter(files: Sequence[tuple[str, str]]) -> Compiled | None:
    """The in-image compile program run by an interpreter of this machine (a target whose Python is ours)."""
    from imageforge.inimage import program
    from imageforge.inimage.compile_files import MARKER

    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "files.json"
        listing.write_text(json.dumps([{"path": p, "text": t} for p, t in files]))
        done = subprocess.run([sys.executable, "-c", program("compile_files"), str(listing)], capture_output=True,
                              text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith(MARKER))
    return Compiled.from_json(json.loads(line[len(MARKER):]))


def test_the_target_interpreter_compiles_every_file_in_one_call() -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    outside = "def f():\n    pass\nreturn 1\n"  # parses; only a compiler refuses it
    newer = "try:\n    pass\nexcept* ValueError:\n    pass\n"  # 3.11 syntax
    files = {f"{VLLM}/r.py": outside, f"{VLLM}/n.py": newer, f"{VLLM}/ok.py": "X = 1\n"}
    # a target whose interpreter is of the grammar's version: its verdict replaces this machine's check
    tree = tree_from_mapping({p: t.encode() for p, t in {**BASE, **files}.items()}, changed=dict.fromkeys(files, "s"),
                             site=SITE, package="vllm", python_version=platform.python_version())
    checks = _check(tree, list(files))
    assert all("no target interpreter ran" in f.message for f in checks.scan.findings if f.check == "py-syntax")
    sources = [(f.path, f.text) for f in checks.compiled_files]
    assert [p for p, _ in sources] == list(files), "every checked file, for one interpreter call"
    said = checks.compiled(_target_interpreter(sources))
    assert said == f"3 .py compiled by the target's Python {platform.python_version()} ({sys.executable})"
    syntax = {f.path: f for f in checks.scan.findings if f.check == "py-syntax"}
    assert set(syntax) == {f"{VLLM}/r.py"} and syntax[f"{VLLM}/r.py"].line == 3
    assert "'return' outside function (compiled by the target's Python" in syntax[f"{VLLM}/r.py"].message
    # the card's 3.10 (the record's) is not the interpreter's: the grammar's findings stand beside its verdict
    tree = _tree({**BASE, **files}, dict.fromkeys(files, "s"))
    checks = _check(tree, list(files))
    said = checks.compiled(_target_interpreter([(f.path, f.text) for f in checks.compiled_files]))
    assert f"the target's 3.10.12 grammar checked by this machine's Python {here} too" in said
    syntax = {f.path: f for f in checks.scan.findings if f.check == "py-syntax"}
    assert set(syntax) == {f"{VLLM}/r.py", f"{VLLM}/n.py"} and "3.10" in syntax[f"{VLLM}/n.py"].message
    # no interpreter: the grammar check, said
    checks = _check(tree, list(files))
    assert checks.compiled(None) == (f"3 .py: the target's 3.10.12 grammar checked by this machine's "
                                     f"Python {here} (no target interpreter ran)")
    assert len([f for f in checks.scan.findings if f.check == "py-syntax"]) == 2


def test_the_compile_program_reads_a_file_by_path_and_says_what_it_cannot(tmp_path: Path) -> None:
    from imageforge.inimage.compile_files import compile_one

    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("# -*- coding: latin-1 -*-\nX = 'caf\xe9'\n", encoding="latin-1")
    bad.write_text("if True:\n\tx = 1\n        y = 2\n")
    assert compile_one(0, {"path": str(good), "text": None}) is None, "read as bytes: its coding line honoured"
    error = compile_one(1, {"path": str(bad), "text": None})
    assert error is not None and error["index"] == 1 and error["msg"].startswith(("TabError", "IndentationError"))
    gone = compile_one(2, {"path": str(tmp_path / "gone.py"), "text": None})
    assert gone is not None and gone["msg"].startswith("FileNotFoundError")
    nul = compile_one(3, {"path": "x.py", "text": "X = 1\x00\n"})
    assert nul is not None and nul["lineno"] in (None, 1)


def test_dead_files_are_reported_not_failed() -> None:
    files = {**BASE, f"{VLLM}/used.py": "X = 1\n", f"{VLLM}/orphan.py": "Y = 2\n",
             f"{VLLM}/z.py": "from vllm.used import X\n"}
    tree = _tree(files, {p: "s" for p in (f"{VLLM}/used.py", f"{VLLM}/orphan.py", f"{VLLM}/z.py")},
                 added=(f"{VLLM}/used.py", f"{VLLM}/orphan.py"))
    checks = _check(tree, [f"{VLLM}/z.py", f"{VLLM}/used.py", f"{VLLM}/orphan.py"])
    dead = dead_files(tree, checks.scan.imported, [], set())
    assert [(f.path, f.level) for f in dead] == [(f"{VLLM}/orphan.py", "info")]


# --------------------------------------------------------------------------- the shipped folder's scripts

PATCH_OPS = """\
#!/bin/bash
set -e
cd "$(dirname "$0")"
sha256sum -c SHA256SUMS
VLLM=/usr/local/corex/lib64/python3/dist-packages/vllm
cp cli_args.py "$VLLM/entrypoints/openai/cli_args.py"
cp verify_chain.py "$VLLM/verify_chain.py"
for so in ix_full_bridge_fused_ar.so; do
    cp "${SCRIPT_DIR}/$so" "$VLLM/"
done
python3 -c "import torch; print(torch.__version__)"
python3 check_ops.py
"""


def _scripts_folder(tmp_path: Path) -> ShippedFolder:
    host = tmp_path / "qwen3_6_scripts"
    host.mkdir()
    (host / "patch_ops.sh").write_text(PATCH_OPS)
    (host / "cli_args.py").write_bytes(b"import argparse\r\nPARSER = argparse.ArgumentParser()\r\n")
    (host / "ix_full_bridge_fused_ar.so").write_bytes(b"\x7fELF" + b"\0" * 60)
    (host / "ix_paged.so").write_bytes(b"\x7fELF" + b"\1" * 60)
    (host / "check_ops.py").write_text("import torch\n\nprint(torch.ops)\n")
    stale = hashlib.sha256(b"the .so before its rebuild").hexdigest()
    (host / "SHA256SUMS").write_text(f"{stale}  ix_paged.so\n")
    return ShippedFolder("organisers-baseline", host, "/workspace/qwen3_6_scripts", ("bash", "patch_ops.sh"))


def test_the_shipped_folder_findings(tmp_path: Path) -> None:
    folder = _scripts_folder(tmp_path)
    (script,) = shell_scripts([folder])
    assert bash_n(script) == []
    lint = shellcheck(script)
    unset = [f for f in lint if "SC2154" in f.message]
    assert len(unset) == 1 and unset[0].line == 9 and "SCRIPT_DIR" in unset[0].message and unset[0].level == "error"
    missing = cp_sources(script)
    assert [(f.line, f.check) for f in missing] == [(7, "cp-source")], "verify_chain.py is not shipped"
    stale = [f for f in pins(folder) if f.check == "pin-stale"]
    assert len(stale) == 1 and stale[0].path.endswith("/SHA256SUMS") and stale[0].line == 1
    assert stale[0].found == hashlib.sha256(b"\x7fELF" + b"\1" * 60).hexdigest()
    unpinned = [f.path for f in pins(folder) if f.check == "pin-missing"]
    assert unpinned == ["/workspace/qwen3_6_scripts/ix_full_bridge_fused_ar.so"]
    (cr,) = crlf([folder])
    assert cr.path.endswith("/cli_args.py") and cr.line == 1 and "2 line(s)" in cr.message
    device = {(f.path.rsplit("/", 1)[-1], f.line) for f in build_device_imports(script)}
    assert device == {("patch_ops.sh", 11), ("check_ops.py", 1)}


def test_bash_n_and_pipes_without_pipefail(tmp_path: Path) -> None:
    host = tmp_path / "s"
    host.mkdir()
    (host / "broken.sh").write_text("#!/bin/bash\nif true; then\n  echo x\n")
    (host / "pipe.sh").write_text("#!/bin/bash\nset -e\nbash deploy.sh | tee /tmp/log\nx=\"$(ls /)\"\necho \"$x\"\n")
    folder = ShippedFolder("s", host, "/w", ("bash", "pipe.sh"))
    scripts = {s.rel: s for s in shell_scripts([folder])}
    (syntax,) = bash_n(scripts["broken.sh"])
    assert syntax.check == "sh-syntax" and "unexpected end of file" in syntax.message
    pipe = [f for f in shellcheck(scripts["pipe.sh"]) if "SC2312" in f.message]
    assert [f.line for f in pipe] == [3], "the pipe, not the command substitution"


def test_a_run_that_swallows_its_exit_code(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM vendor:1\nCOPY qwen3_6_scripts /workspace/qwen3_6_scripts\n"
                          "RUN chmod +x /workspace/qwen3_6_scripts/patch_ops.sh && \\\n"
                          "    bash /workspace/qwen3_6_scripts/patch_ops.sh 2>&1 | tee /tmp/patch.log; \\\n"
                          "    echo 'patch done'\n"
                          "RUN set -e; pip install x; echo ok\n")
    (f,) = run_exit_codes(dockerfile)
    assert f.check == "run-exit-code" and f.line == 3 and "tee" in f.message
    assert swallowed("bash patch_ops.sh; echo done") is not None
    assert swallowed("bash patch_ops.sh || true") is not None
    assert swallowed("set -o pipefail; bash patch_ops.sh | tee log") is None
    assert swallowed("bash patch_ops.sh && echo done") is None


def test_an_untracked_shipped_file_is_a_finding(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "patch_ops.sh").write_text("#!/bin/bash\n")
    (repo / "new_module.py").write_text("X = 1\n")
    subprocess.run([*git, "add", "patch_ops.sh"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    files = [(repo / "patch_ops.sh", "s"), (repo / "new_module.py", "s")]
    (f,) = git_findings(files, allow_dirty=False)
    assert f.check == "git-state" and f.path.endswith("new_module.py") and "untracked" in f.message
    assert f.level == "error"
    (w,) = git_findings(files, allow_dirty=True)
    assert w.level == "warning"
    outside = tmp_path / "loose"
    outside.mkdir()
    (outside / "a.sh").write_text("x")
    (o,) = git_findings([(outside / "a.sh", None)], allow_dirty=False)
    assert o.level == "warning" and "outside a git work tree" in o.message


# --------------------------------------------------------------------------- the probe


def test_probe_records_this_interpreter_and_the_elf_facts(tmp_path: Path) -> None:
    out = tmp_path / "vendor-api.json"
    result = probe(out, python=sys.executable, modules=["_json", "json"], walk=["email.mime"], ops=[])
    api = load_record(out)
    assert api.python == ".".join(map(str, sys.version_info[:3]))
    assert api.member("json", "dumps") is not None and api.member("json", "dumps").kind == "function"  # type: ignore[union-attr]
    assert api.lookup("email.mime", "text") == "present", "a walked submodule"
    lib = next(p for p in api.libraries if "_json" in p)
    assert "PyInit__json" in api.libraries[lib].exports
    assert read_elf(Path(lib)).exports == tuple(sorted(api.libraries[lib].exports))
    assert result.libraries >= 1 and "pip" in {d.lower() for d in api.distributions}


def test_a_manifest_that_does_not_load_is_findings_and_exit_3(tmp_path: Path) -> None:
    from imageforge import app
    from imageforge.errors import BuildError

    manifest = tmp_path / "build.yaml"
    manifest.write_text("default_target: x\ntargets:\n  x:\n    base: {image: a:b}\n    steps: [}\n")
    shown: list[PreflightReport] = []
    with pytest.raises(BuildError) as info:
        app.preflight(app.settings(manifest=str(manifest)), None, None, show=shown.append)
    assert info.value.exit_code == 3
    (report,) = shown
    assert report.ran == ("validate",) and report.findings
    assert all(f.check == "validate" for f in report.findings)
    assert report.findings[0].path.endswith("build.yaml") and report.findings[0].line == 5


def test_python_heredocs_are_checked_at_the_scripts_lines(tmp_path: Path) -> None:
    from imageforge.preflight.shell import python_heredocs

    host = tmp_path / "qwen3_6_scripts"
    host.mkdir()
    (host / "patch_ops.sh").write_text(
        "#!/bin/bash\nset -euo pipefail\npython3 - <<'EOF'\nimport os\nimport vllm\ntry:\n"
        "    from ex_engine.python.patch_fused_linear_allreduce import apply\n    apply()\nexcept ImportError:\n"
        "    pass\nEOF\necho between\npython3 - <<-PY\n\timport torch\n\tprint(sorted([1, 2)\n\tPY\necho done\n")
    folder = ShippedFolder("organisers-baseline", host, "/workspace/qwen3_6_scripts", ("bash", "patch_ops.sh"))
    (script,) = shell_scripts([folder])
    docs = python_heredocs(script)
    assert [start for start, _ in docs] == [4, 14]
    checks = PythonChecks(_tree(BASE, {}), load_record(BI100_RECORD))
    for _, text in docs:
        checks.check(PyFile(script.image_path, text, folder.step, (folder.dest, SITE)))
    found = {(f.check, f.line) for f in checks.scan.findings}
    assert found == {("py-import", 7), ("py-syntax", 15)}, checks.scan.findings
    device = [(f.line, f.found) for f in build_device_imports(script)]
    assert device == [(5, "a python heredoc from line 4")], "vllm imports torch: the builder has no device"


TEAM_REPO = REPO / "tests" / "fixtures" / "team-repo"


def _team_checkout(tmp_path: Path) -> Path:
    import shutil

    repo = tmp_path / "team"
    shutil.copytree(TEAM_REPO, repo)
    shutil.copytree(REPO / "tests" / "fixtures" / "bi100-baseline" / "qwen3_6_scripts", repo / "qwen3_6_scripts")
    return repo


def test_init_from_adopts_the_dockerfile_and_the_run_file(tmp_path: Path) -> None:
    from imageforge.manifest.adopt import adopt, write_adopted
    from imageforge.manifest.load import load_manifest

    repo = _team_checkout(tmp_path)
    adoption = adopt(repo, repo, base="vendor:local")
    target = adoption.manifest["targets"]["adopted"]
    (step,) = target["steps"]
    assert step["directory"] == "qwen3_6_scripts" and step["dest"] == "/workspace/qwen3_6_scripts"
    # the RUN as teams write it (chmod && bash X 2>&1 | tee LOG; echo ...), read with bashlex: the script it runs
    assert step["command"] == ["bash", "patch_ops.sh"] and step["workdir"] == "/workspace/qwen3_6_scripts"
    assert "touches" not in step, "no scan was asked for"
    serving = target["serving"]
    assert serving["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert serving["args"]["tensor-parallel-size"] == 4 and serving["flag_names"] == {"tensor-parallel-size": "-tp"}
    assert serving["args"]["max-model-len"] == 100000 and serving["args"]["trust-remote-code"] is True
    assert serving["args"]["reasoning-parser"] == "qwen3"
    assert serving["env"] == {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "3600"}
    assert target["base"] == {"image": "vendor:local"} and "vendor_api" not in target
    said = "\n".join(adoption.untranslated)
    assert "EXPOSE" in said and "concurrency" in said and "no vendor-api.json" in said and "--base" in said
    assert "Dockerfile:5: the RUN discarded patch_ops.sh's exit code (`| tee` without pipefail, a `;` after it)" in said
    assert "`chmod +x patch_ops.sh` dropped" in said and "`2>&1 | tee /tmp/patch_ops.log` dropped" in said
    path, _ = write_adopted(repo, repo, base="vendor:local")
    manifest = load_manifest(path)  # the written build.yaml loads and validates, no environment variable needed
    assert manifest.default_target == "adopted" and manifest.targets["adopted"].steps[0].kind == "script"
    with pytest.raises(ConfigError):
        write_adopted(repo, repo)  # build.yaml exists: --force


@pytest.mark.parametrize(("line", "command", "workdir", "said"), [
    ("chmod +x patch_ops.sh && bash patch_ops.sh 2>&1 | tee /tmp/p.log; echo done", ("bash", "patch_ops.sh"), "/w",
     "discarded patch_ops.sh's exit code (`| tee` without pipefail, a `;` after it)"),
    ("set -o pipefail && bash x.sh | tee l", ("bash", "x.sh"), "/w", None),  # pipefail: the exit code was kept
    ("set -e; bash x.sh; echo done", ("bash", "x.sh"), "/w", None),  # errexit: the `;` loses nothing
    ("cd sub && ./go.sh --fast > /tmp/log", ("./go.sh", "--fast"), "/w/sub", None),
    ("python3 patch.py --x 1", ("python3", "patch.py", "--x", "1"), "/w", None),
])
def test_a_run_line_becomes_the_script_it_runs(line: str, command: tuple[str, ...], workdir: str,
                                              said: str | None) -> None:
    from imageforge.manifest.adopt import RunTranslation, translate_run

    got = translate_run(line, "/w")
    assert isinstance(got, RunTranslation), got
    assert (got.command, got.workdir) == (command, workdir)
    lost = [n for n in got.notes if "exit code" in n]
    if said is None:
        assert lost == [], "the RUN kept the script's exit code"
    else:
        assert len(lost) == 1 and said in lost[0]


@pytest.mark.parametrize(("line", "why"), [
    ("pip install foo && bash x.sh", "`pip install foo`"),
    ("bash $DIR/x.sh", "expanded at run time"),
    ("bash a.sh && bash b.sh", "a second script"),
    ("bash a.sh || true", "the operator '||'"),
    ("bash x.sh | grep ok", "only `SCRIPT | tee LOG`"),
    ("echo nothing", "no script runs"),
    ("bash 'unclosed", "does not parse"),
])
def test_a_run_line_that_is_more_than_one_script_is_kept_and_said(line: str, why: str, tmp_path: Path) -> None:
    from imageforge.manifest.adopt import adopt, translate_run

    got = translate_run(line, "/w")
    assert isinstance(got, str) and why in got, got
    repo = _team_checkout(tmp_path)
    dockerfile = repo / "Dockerfile"
    text = dockerfile.read_text().splitlines()
    text[4] = f"RUN {line}"
    dockerfile.write_text("\n".join(text) + "\n")
    adoption = adopt(repo, repo, base="vendor:local")
    (step,) = adoption.manifest["targets"]["adopted"]["steps"]
    assert step["command"] == ["bash", "-c", line], "kept as written"
    assert any(n.startswith("Dockerfile:5: RUN kept as written") and why in n for n in adoption.untranslated)


def test_touches_are_the_files_a_script_changed_from_its_docker_diff(tmp_path: Path) -> None:
    from imageforge.manifest.adopt import Touches, adopt, touches_of

    site = SITE
    diff = [("/workspace", 1), ("/workspace/qwen3_6_scripts", 1), ("/workspace/qwen3_6_scripts/patch_ops.sh", 1),
            ("/usr", 0), ("/usr/local", 0), (site, 0), (VLLM, 0), (f"{VLLM}/attention", 0),
            (f"{VLLM}/attention/ops", 0), (f"{VLLM}/attention/ops/paged_attn.py", 0),
            (f"{VLLM}/model_executor/models", 0), (f"{VLLM}/model_executor/models/qwen3_5.py", 1),
            (f"{VLLM}/old.py", 2), ("/usr/local/lib/python3.10/site-packages", 0),
            ("/usr/local/lib/python3.10/site-packages/transformers", 1),
            ("/usr/local/lib/python3.10/site-packages/transformers/__init__.py", 1),
            ("/tmp", 0), ("/tmp/patch_ops.log", 1), ("/root/.cache", 1), ("/root/.cache/pip/x", 1)]
    assert touches_of(diff, site, "/workspace/qwen3_6_scripts") == [
        "/usr/local/lib/python3.10/site-packages/transformers",  # a folder it added: one entry
        "vllm/attention/ops/paged_attn.py", "vllm/model_executor/models/qwen3_5.py", "vllm/old.py"]
    repo = _team_checkout(tmp_path)
    adoption = adopt(repo, repo, base="vendor:local")
    adoption.add_touches(Touches(skipped="base image 'vendor:local' is not on the Docker daemon"))
    assert "touches" not in adoption.steps()[0]
    assert any(n.startswith("touches: could not be scanned (base image 'vendor:local' is not on the Docker daemon")
               for n in adoption.untranslated)
    adoption.add_touches(Touches({"run-1": diff}, site, {"run-1": "exit 3"}))
    assert adoption.steps()[0]["touches"][1:] == ["vllm/attention/ops/paged_attn.py",
                                                  "vllm/model_executor/models/qwen3_5.py", "vllm/old.py"]
    assert any("the script failed in the base (exit 3)" in n for n in adoption.untranslated)
