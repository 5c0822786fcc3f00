"""Call sites against real signatures: calls of a recorded extension function and functions replaced at run time
(``ops.reshape_and_cache = patched_reshape_and_cache``) against every call in the final tree; native build's
functions written into the vendor API record.

The fixtures follow the team's case (facts note: a patched function taking 7 arguments where vLLM passes 8):
the record lists the extension's ``reshape_and_cache`` with 8 parameters, vLLM's ``_custom_ops`` wraps it with the
same 8, an attention backend of the base calls ``ops.reshape_and_cache`` with 8, and a patcher installs its own.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from imageforge.errors import ConfigError
from imageforge.inplace.native_build import dotted_module, recorded_functions
from imageforge.preflight.findings import Finding
from imageforge.preflight.python import PyFile, PythonChecks
from imageforge.preflight.tree import FinalTree, tree_from_mapping
from imageforge.steps.native import Extension
from imageforge.vendor_api import load_record, record_from_json
from imageforge.vendor_api.record import record_functions, signature_from_doc

SITE = "/usr/local/corex/lib64/python3/dist-packages"
VLLM = f"{SITE}/vllm"
EIGHT = "(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)"
RECORD = {"format": 1, "python": "3.10.12", "versions": {"vllm": "0.6.3+corex.3.2.3"},
          "modules": {"ixformer.inference.functions": {
              "complete": False,
              "reshape_and_cache": {"kind": "function", "signature": EIGHT}}}}

CUSTOM_OPS = f"""\
from ixformer.inference import functions as ixf


def reshape_and_cache{EIGHT}:
    ixf.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def copy_cache(src, dst, block_mapping):
    reshape_and_cache(src, dst, block_mapping, None, None, "auto", 1.0, 1.0)
"""

BACKEND = """\
from vllm import _custom_ops as ops


class XFormersImpl:
    def forward(self, key, value, key_cache, value_cache, attn_metadata, kv_cache_dtype, k_scale, v_scale):
        ops.reshape_and_cache(key, value, key_cache, value_cache, attn_metadata.slot_mapping,
                              kv_cache_dtype, k_scale, v_scale)
"""

SEVEN = """\
import vllm._custom_ops


def patched_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale):
    return None


def apply():
    vllm._custom_ops.reshape_and_cache = patched_reshape_and_cache
"""

PATCHER = "/opt/patches/patch_ops.py"


def _tree(files: dict[str, str], changed: dict[str, str]) -> FinalTree:
    base = {f"{VLLM}/__init__.py": "", f"{VLLM}/_custom_ops.py": CUSTOM_OPS,
            f"{VLLM}/attention/__init__.py": "", f"{VLLM}/attention/backends/__init__.py": "",
            f"{VLLM}/attention/backends/xformers.py": BACKEND, **files}
    return tree_from_mapping({p: t.encode() for p, t in base.items()}, changed=changed, site=SITE, package="vllm",
                             python_version="3.10.12", roots=(SITE, "/opt/patches"))


def _findings(tree: FinalTree, paths: list[str], *, callers: list[str] | None = None) -> list[Finding]:
    """What preflight's Python phase gives: the files checked, then the base files that name a replaced function
    (preflight finds them by grep in the sandbox; here they are listed)."""
    checks = PythonChecks(tree, record_from_json(RECORD, "vendor-api.json"))
    for path in paths:
        checks.check(PyFile(path, (tree.read(path) or b"").decode(), tree.producer(path), tree.roots))
    if checks.replacements.found:
        checks.replacements.add_callers(callers if callers is not None else
                                        [f"{VLLM}/attention/backends/xformers.py", f"{VLLM}/_custom_ops.py"])
    return [*checks.scan.findings, *checks.replacements.findings()]


def test_a_seven_parameter_replacement_of_an_eight_argument_call_names_both() -> None:
    tree = _tree({PATCHER: SEVEN}, {PATCHER: "patch-ops"})
    found = [f for f in _findings(tree, [PATCHER]) if f.check == "call-replaced"]
    by_call = {f.found.split("; ")[1].split(" passes")[0]: f for f in found if f.found}
    backend = by_call[f"{VLLM}/attention/backends/xformers.py:6:9"]
    assert backend.level == "error" and backend.step == "patch-ops"
    assert (backend.path, backend.line) == (PATCHER, 4)  # the replacement's def
    assert "vllm._custom_ops.reshape_and_cache is replaced by patched_reshape_and_cache" in backend.message
    assert f"installed at {PATCHER}:9" in backend.message
    assert "too many positional arguments" in backend.message
    assert backend.found is not None and backend.found.endswith("passes 8 positional arguments")
    assert f"reshape_and_cache{EIGHT} ({VLLM}/_custom_ops.py:4)" in (backend.hint or "")
    # _custom_ops calls its own global inside the module: that lookup sees the replacement too
    assert f"{VLLM}/_custom_ops.py:9:5" in by_call
    assert len(found) == 2


def test_a_replacement_that_accepts_every_call_passes() -> None:
    for params in (EIGHT[1:-1], "key, value, *args, **kwargs",
                   "key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale=1.0"):
        text = SEVEN.replace("key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale", params)
        tree = _tree({PATCHER: text}, {PATCHER: "patch-ops"})
        assert [f for f in _findings(tree, [PATCHER]) if f.check == "call-replaced"] == [], params


def test_setattr_lambda_and_a_replaced_extension_function_against_the_record() -> None:
    text = ("from ixformer.inference import functions as ixf\n"
            "from vllm import _custom_ops as ops\n\n"
            "setattr(ops, 'reshape_and_cache', lambda key, value, key_cache: None)\n"
            "ixf.reshape_and_cache = lambda *a, **k: None\n"
            "setattr(ixf, 'reshape_and_cache', lambda key, value, key_cache, value_cache, slot_mapping, "
            "kv_cache_dtype, k_scale, v_scal: None)\n")
    tree = _tree({PATCHER: text}, {PATCHER: "patch-ops"})
    found = [f for f in _findings(tree, [PATCHER]) if f.check == "call-replaced"]
    ops = [f for f in found if "vllm._custom_ops.reshape_and_cache is replaced by <lambda>" in f.message]
    assert {f.line for f in ops} == {4} and len(ops) == 2  # the backend's call and _custom_ops' own
    ext = [f for f in found if f.message.startswith("ixformer.inference.functions.reshape_and_cache")]
    # the *a, **k lambda accepts everything; the one with a misspelt last parameter takes _custom_ops' 8 positional
    # arguments without trouble: only a keyword call misses it (below)
    assert ext == []
    keyword = text + "ixf.reshape_and_cache(1, 2, 3, 4, 5, 6, 7, v_scale=8)\n"
    tree = _tree({PATCHER: keyword}, {PATCHER: "patch-ops"})
    found = [f for f in _findings(tree, [PATCHER]) if f.check == "call-replaced"
             and f.message.startswith("ixformer.inference.functions.reshape_and_cache")]
    assert len(found) == 1 and found[0].line == 6
    assert "missing a required argument: 'v_scal'" in found[0].message  # the caller says v_scale=
    assert f"take the recorded parameters: reshape_and_cache{EIGHT} (vendor-api.json)" == found[0].hint


def test_a_from_import_binding_is_a_warning_and_keyword_names_count() -> None:
    caller = ("from vllm._custom_ops import reshape_and_cache\n\n\n"
              "def write(k, v, kc, vc, slots):\n"
              "    reshape_and_cache(k, v, kc, vc, slot_mapping=slots, kv_cache_dtype='auto', k_scale=1.0,"
              " v_scale=1.0)\n")
    patched = SEVEN.replace("kv_cache_dtype, k_scale)", "kv_cache_dtype, k_scale, v_scale)").replace(
        "slot_mapping,", "slots,")
    files = {PATCHER: patched, f"{VLLM}/worker/cache.py": caller, f"{VLLM}/worker/__init__.py": ""}
    tree = _tree(files, {PATCHER: "patch-ops"})
    found = [f for f in _findings(tree, [PATCHER], callers=[f"{VLLM}/worker/cache.py"])
             if f.check == "call-replaced"]
    assert len(found) == 1 and found[0].level == "warning"
    assert "missing a required argument: 'slots'" in found[0].message  # the caller says slot_mapping=
    assert "bound by `from ... import`" in found[0].message
    assert found[0].found is not None and f"{VLLM}/worker/cache.py:5:5 passes 4 positional arguments, keyword " \
        "slot_mapping, kv_cache_dtype, k_scale, v_scale" in found[0].found


def test_an_assignment_to_an_object_or_an_unreadable_function_is_no_replacement() -> None:
    text = ("import functools\nfrom vllm import _custom_ops as ops\n\n\nclass Box:\n    pass\n\n\n"
            "box = Box()\nbox.reshape_and_cache = print\n"
            "ops.reshape_and_cache = functools.partial(print, 1)\n")
    tree = _tree({PATCHER: text}, {PATCHER: "patch-ops"})
    checks = PythonChecks(tree, record_from_json(RECORD))
    checks.check(PyFile(PATCHER, text, "patch-ops", tree.roots))
    assert checks.replacements.found == {}


@pytest.mark.parametrize(("args", "why"), [
    ("1, 2, 3, 4, 5, 6, 7", "missing a required argument: 'v_scale'"),
    ("1, 2, 3, 4, 5, 6, 7, 8, 9", "too many positional arguments"),
    ("1, 2, 3, 4, 5, 6, 7, 8, scale=9", "got an unexpected keyword argument 'scale'"),
    ("1, 2, 3, 4, 5, 6, 7, v_scale=8", None),
])
def test_calls_of_a_recorded_extension_function_use_the_one_arity_check(args: str, why: str | None) -> None:
    text = f"import ixformer.inference.functions as ixf\n\n\ndef f():\n    ixf.reshape_and_cache({args})\n"
    tree = _tree({f"{VLLM}/worker/cache.py": text}, {f"{VLLM}/worker/cache.py": "team-cache"})
    found = [f for f in _findings(tree, [f"{VLLM}/worker/cache.py"]) if f.check == "vendor-arity"]
    if why is None:
        assert found == []
    else:
        assert len(found) == 1 and why in found[0].message and found[0].line == 5
        assert found[0].expected == f"reshape_and_cache{EIGHT}"


def test_an_extension_function_set_as_a_module_hook_is_checked_against_its_recorded_signature() -> None:
    """The cpu target's shape: a patch sets sorted_moe.GROUP_BY_EXPERT to the native step's function; sorted_moe
    calls the hook by its global name."""
    moe = f"{VLLM}/model_executor/layers/fused_moe"
    ext = "vllm.model_executor.layers.fused_moe.imageforge_moe_group"
    record = {**RECORD, "modules": {ext: {"complete": False, "group_by_expert": {
        "kind": "function", "signature": "(topk_ids: torch.Tensor, num_experts: int) -> List[torch.Tensor]"}}}}
    sorted_moe = ("GROUP_BY_EXPERT = None\n\n\ndef sort_pairs(ids, num_experts):\n"
                  "    return GROUP_BY_EXPERT(ids, num_experts + 1, stable=True)\n")
    hook = ("from vllm.model_executor.layers.fused_moe import imageforge_moe_group\n"
            "from vllm.model_executor.layers.fused_moe import sorted_moe as _sm\n\n"
            "_sm.GROUP_BY_EXPERT = imageforge_moe_group.group_by_expert\n")
    files = {f"{VLLM}/model_executor/__init__.py": "", f"{VLLM}/model_executor/layers/__init__.py": "",
             f"{moe}/__init__.py": "", f"{moe}/sorted_moe.py": sorted_moe, f"{moe}/cpu_moe.py": hook}
    tree = _tree(files, {f"{moe}/cpu_moe.py": "cpu-moe-native-grouping", f"{moe}/sorted_moe.py": "sorted-moe"})
    checks = PythonChecks(tree, record_from_json(record, "vendor-api.json"))
    for path in (f"{moe}/cpu_moe.py", f"{moe}/sorted_moe.py"):
        checks.check(PyFile(path, (tree.read(path) or b"").decode(), tree.producer(path), tree.roots))
    found = checks.replacements.findings()
    assert len(found) == 1 and (found[0].path, found[0].line) == (f"{moe}/cpu_moe.py", 4)
    assert f"replaced by {ext}.group_by_expert" in found[0].message
    assert "defined at vendor-api.json)" in found[0].message
    assert f"the call at {moe}/sorted_moe.py:5: got an unexpected keyword argument 'stable'" in found[0].message
    assert (found[0].hint or "").startswith(f"the call must fit the recorded {ext}.group_by_expert(topk_ids")
    fixed = sorted_moe.replace(", stable=True", "")
    checks = PythonChecks(tree, record_from_json(record, "vendor-api.json"))
    checks.check(PyFile(f"{moe}/cpu_moe.py", hook, "cpu-moe-native-grouping", tree.roots))
    checks.check(PyFile(f"{moe}/sorted_moe.py", fixed, "sorted-moe", tree.roots))
    assert checks.replacements.findings() == []


# --------------------------------------------------------------------------- native build -> the record

def test_native_build_functions_go_into_the_record_and_preflight_checks_their_calls(tmp_path: Path) -> None:
    ext = Extension("moe_group.cpython-310-x86_64-linux-gnu.so",
                    "vllm/model_executor/moe_group.cpython-310-x86_64-linux-gnu.so", "sha256:" + "0" * 64)
    imports = {"modules": [{"name": "moe_group", "ok": True,
                            "functions": {"group": "group(topk_ids: torch.Tensor, num_experts: int) -> "
                                                   "List[torch.Tensor]",
                                          "raw": "raw(self, /, *args, **kwargs)", "opaque": "Fast path."}}]}
    functions = recorded_functions([ext], imports, SITE)
    assert functions == {"vllm.model_executor.moe_group": {
        "group": "(topk_ids: torch.Tensor, num_experts: int) -> List[torch.Tensor]",
        "raw": "(self, /, *args, **kwargs)", "opaque": None}}
    record = tmp_path / "vendor-api.json"
    record.write_text(json.dumps({**RECORD, "extra": {"kept": True}}, indent=1))
    assert record_functions(record, "3.10.12", functions) is True
    assert record_functions(record, "3.10.12", functions) is False  # the same functions: the file is left alone
    data = json.loads(record.read_text())
    assert data["extra"] == {"kept": True} and "ixformer.inference.functions" in data["modules"]
    api = load_record(record)
    assert api.member("vllm.model_executor.moe_group", "group") is not None
    assert api.lookup("vllm.model_executor.moe_group", "other") == "unknown"  # other attributes are not listed
    caller = ("from vllm.model_executor import moe_group\n\n\n"
              "def route(ids, n):\n    return moe_group.group(ids, n, True)\n")
    path = f"{VLLM}/model_executor/sorted_moe.py"
    tree = _tree({path: caller, f"{VLLM}/model_executor/__init__.py": ""}, {path: "sorted-moe"})
    checks = PythonChecks(tree, api)
    checks.check(PyFile(path, caller, "sorted-moe", tree.roots))
    arity = [f for f in checks.scan.findings if f.check == "vendor-arity"]
    assert len(arity) == 1 and "too many positional arguments" in arity[0].message and arity[0].line == 5


def test_record_functions_makes_a_missing_record_and_refuses_a_broken_one(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "vendor-api.json"
    assert record_functions(fresh, "3.11.2", {"pkg.ext": {"f": "(a, b)"}}) is True
    assert load_record(fresh).member("pkg.ext", "f") is not None and load_record(fresh).python == "3.11.2"
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": 2}')
    with pytest.raises(ConfigError):
        record_functions(broken, "3.11.2", {"pkg.ext": {"f": "(a)"}})
    assert broken.read_text() == '{"format": 2}'


def test_the_module_of_an_extension_and_a_docstring_signature() -> None:
    assert dotted_module("vllm/ops/k.cpython-311-x86_64-linux-gnu.so", SITE) == "vllm.ops.k"
    assert dotted_module(f"{SITE}/vllm/k.so", SITE) == dotted_module("./vllm/k.so", SITE) == "vllm.k"
    assert dotted_module("/opt/elsewhere/k.so", SITE) is None
    assert dotted_module("vllm/my-ops/k.so", SITE) is None
    assert signature_from_doc("twice", "twice(x) -> x + x") == "(x) -> x + x"
    assert signature_from_doc("twice", "Twice the input.") is None


def test_the_callers_command_lists_the_package_files_naming_a_replaced_function(tmp_path: Path) -> None:
    """The grep preflight runs in the sandbox, run here on a copy of the tree: words only, .py only, the package's
    folder and the replaced module's."""
    site = str(tmp_path)
    files = {f"{site}/vllm/__init__.py": "", f"{site}/vllm/_custom_ops.py": CUSTOM_OPS,
             f"{site}/vllm/attention/backends/xformers.py": BACKEND,
             f"{site}/vllm/attention/backends/flash.py": "ops.reshape_and_cache_flash(k, v)\n",
             f"{site}/vllm/notes.txt": "reshape_and_cache\n", f"{site}/other/x.py": "reshape_and_cache\n",
             f"{site}/patches/patch_ops.py": SEVEN}
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    tree = tree_from_mapping({p: t.encode() for p, t in files.items()},
                             changed={f"{site}/patches/patch_ops.py": "patch-ops"}, site=site, package="vllm",
                             roots=(site, f"{site}/patches"))
    checks = PythonChecks(tree, None)
    assert checks.replacements.callers_command() == []
    checks.check(PyFile(f"{site}/patches/patch_ops.py", SEVEN, "patch-ops", tree.roots))
    argv = checks.replacements.callers_command()
    assert checks.replacements.search_dirs() == [f"{site}/vllm"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    listed = sorted(done.stdout.split())
    assert listed == [f"{site}/vllm/_custom_ops.py", f"{site}/vllm/attention/backends/xformers.py"]
    assert checks.replacements.add_callers(listed) == 2
    assert {(f.found or "").split("; ")[1].split(" passes")[0] for f in checks.replacements.findings()} == {
        f"{site}/vllm/_custom_ops.py:9:5", f"{site}/vllm/attention/backends/xformers.py:6:9"}
