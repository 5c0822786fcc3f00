"""check-patches (against an in-memory image) and patch-from (pure): no daemon."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.patches.anchored import apply_patch
from imageforge.patches.check import CheckRow, DictFS, check_steps
from imageforge.patches.from_image import package_file
from imageforge.patches.from_text import apply_steps, derive_patch_steps, occurrences, render_steps_yaml
from imageforge.steps import PatchSpec, SymlinkSpec, kind
from tests.unit.conftest import manifest_text

SITE = "/opt/venv/lib/python3.11/site-packages"

MANIFEST = manifest_text("""\
    steps:
      - id: first
        kind: patch
        file: vllm/y.py
        old: "A = 1"
        new: "A = 2"
      - id: second
        kind: patch
        file: vllm/y.py
        old: "A = 2\\nB = 1"
        new: "A = 2\\nB = 3"
      - id: gone
        kind: patch
        file: vllm/y.py
        old: "C = 42"
        new: "C = 43"
      - id: twice
        kind: patch
        file: vllm/y.py
        old: "D = 0"
        new: "D = 1"
      - id: missing-file
        kind: patch
        file: vllm/nothere.py
        old: "x"
        new: "y"
      - id: new-module
        kind: overlay
        source: overlays/x.py
        dest: vllm/ops/x.py
      - id: same-module
        kind: overlay
        source: overlays/same.py
        dest: vllm/same.py
      - id: lost-dir
        kind: overlay
        source: overlays/x.py
        dest: vllm/moved/x.py
      - id: patch-overlaid
        kind: patch
        file: vllm/ops/x.py
        old: "X = 1"
        new: "X = 5"
      - id: libs
        kind: symlink
        glob: /usr/lib/torch/lib*.so*
        into: /usr/local/lib
      - id: nolibs
        kind: symlink
        glob: /usr/lib/torch/none*.so
        into: /usr/local/lib
      - id: run
        kind: script
        source: overlays/run.sh
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1}
    default_profile: small
    profiles:
      small:
        args: {max-num-seqs: 2}
        steps:
          - id: profile-patch
            kind: patch
            file: vllm/y.py
            old: "E = 0"
            new: "E = 9"
      big: {extends: small, args: {max-num-seqs: 64}}
""")

Y = "A = 1\nB = 1\nD = 0\nD = 0\nE = 0\nC = 4\n"


@pytest.fixture
def setup(tmp_path: Path) -> Callable[[], tuple[list[CheckRow], DictFS]]:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "x.py").write_text("X = 1\n")
    (tmp_path / "overlays" / "same.py").write_text("SAME = 1\n")
    (tmp_path / "overlays" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    path = tmp_path / "build.yaml"
    path.write_text(MANIFEST)

    def make() -> tuple[list[CheckRow], DictFS]:
        m = load_manifest(path)
        fs = DictFS(files={f"{SITE}/vllm/y.py": Y.encode(), f"{SITE}/vllm/same.py": b"SAME = 1\n",
                           f"{SITE}/vllm/ops/__init__.py": b"", "/usr/lib/torch/libc10.so": b"",
                           "/usr/lib/torch/libtorch.so.2": b"", "/usr/lib/torch/other.txt": b""},
                    dirs={"/usr/local/lib"})
        small = resolve(m, "t", "small", environ={})
        big = resolve(m, "t", "big", environ={})
        rows, _ = check_steps(small.shared_steps, {"small": small.profile_steps, "big": big.profile_steps}, fs,
                              SITE, with_diff=True)
        return list(rows), fs

    return make


def test_check_steps_statuses(setup: Callable[[], tuple[list[CheckRow], DictFS]]) -> None:
    rows, _ = setup()
    by = {r.step: r for r in rows}
    assert by["first"].status == "applies"
    assert by["second"].status == "applies", "sees the first patch's result on the in-memory copy"
    assert "+A = 2" in by["first"].diff and "-A = 1" in by["first"].diff
    assert by["gone"].status == "anchor missing"
    assert by["gone"].near and by["gone"].near[0].text == "C = 4"
    assert by["twice"].status == "ambiguous" and "2 times" in by["twice"].detail
    assert by["missing-file"].status == "destination missing"
    assert by["new-module"].status == "applies" and "adds a new file" in by["new-module"].detail
    assert by["same-module"].status == "already applied"
    assert by["lost-dir"].status == "destination missing"
    assert by["patch-overlaid"].status == "applies", "patches see the overlay written before them"
    assert by["libs"].status == "applies" and "2 link(s)" in by["libs"].detail
    assert by["nolibs"].status == "destination missing"
    assert by["run"].status == "not checked" and by["run"].ok
    assert by["profile-patch"].status == "applies" and by["profile-patch"].profile == "small"
    assert [r.step for r in rows].count("profile-patch") == 1, "an inherited profile step is reported once"
    failing = {r.step for r in rows if not r.ok}
    assert failing == {"gone", "twice", "missing-file", "lost-dir", "nolibs"}


def test_already_applied_patch_and_links() -> None:
    from imageforge.errors import Location
    from imageforge.manifest.model import Step

    loc = Location("build.yaml", 1)
    patch = Step("p", "patch", None, loc, "steps[0]", None, PatchSpec(file="vllm/y.py", old="A = 1", new="A = 2"))
    link = Step("l", "symlink", None, loc, "steps[1]", None, SymlinkSpec(link="/usr/local/lib/libx.so",
                                                                           target="/opt/libx.so"))
    fs = DictFS(files={f"{SITE}/vllm/y.py": b"A = 2\n", "/opt/libx.so": b""},
                links={"/usr/local/lib/libx.so": "/opt/libx.so"})
    rows, _ = check_steps([patch, link], {}, fs, SITE)
    assert [r.status for r in rows] == ["already applied", "already applied"]


def test_symlink_conflict_and_link_path() -> None:
    from imageforge.errors import Location
    from imageforge.manifest.model import Step

    loc = Location("build.yaml", 1)
    link = Step("l", "symlink", None, loc, "steps[0]", None, SymlinkSpec(link="/usr/local/lib/libx.so",
                                                                          target="/opt/libx.so"))
    through = Step("o", "patch", None, loc, "steps[1]", None, PatchSpec(file="vllm/linked/a.py", old="a", new="b"))
    fs = DictFS(files={"/usr/local/lib/libx.so": b"real file", "/opt/libx.so": b"", "/real/a.py": b"a"},
                links={f"{SITE}/vllm/linked": "/real"})
    rows, _ = check_steps([link, through], {}, fs, SITE)
    assert rows[0].status == "conflict" and "replace: true" in rows[0].detail
    assert rows[1].status == "conflict" and "symbolic link" in rows[1].detail


# --------------------------------------------------------------------------- patch-from


ORIGINAL = textwrap.dedent('''\
    import torch

    BASE_BLOCK = 128 if current_platform.has_device_capability(80) else 64
    NUM_WARPS = 4 if current_platform.is_rocm() else 8


    def f(x):
        return x + 1


    def g(x):
        return x + 1
    ''')


def test_derive_single_line_change_is_one_minimal_step() -> None:
    edited = ORIGINAL.replace("NUM_WARPS = 4 if current_platform.is_rocm() else 8", "NUM_WARPS = 4")
    steps = derive_patch_steps(ORIGINAL, edited, file="vllm/a.py", id_prefix="a")
    assert len(steps) == 1
    assert steps[0]["old"] == "NUM_WARPS = 4 if current_platform.is_rocm() else 8\n"
    assert steps[0]["new"] == "NUM_WARPS = 4\n"
    assert steps[0]["id"] == "a" and steps[0]["kind"] == "patch" and steps[0]["file"] == "vllm/a.py"
    assert apply_steps(ORIGINAL, steps) == edited


def test_derive_grows_context_until_unique() -> None:
    edited = ORIGINAL.replace("def g(x):\n    return x + 1", "def g(x):\n    return x + 2")
    steps = derive_patch_steps(ORIGINAL, edited, file="vllm/a.py")
    assert len(steps) == 1
    old = steps[0]["old"]
    assert occurrences(ORIGINAL, old) == 1
    assert "def g(x):" in old, "the duplicated body line needs its def as context"
    assert apply_steps(ORIGINAL, steps) == edited


def test_derive_several_regions_in_order_and_insertions() -> None:
    edited = (ORIGINAL.replace("import torch\n", "import torch\nimport os\n")
              .replace("BASE_BLOCK = 128 if current_platform.has_device_capability(80) else 64", "BASE_BLOCK = 64")
              .replace("\n\ndef g(x):", "\nH = 3\n\ndef g(x):"))
    steps = derive_patch_steps(ORIGINAL, edited, file="vllm/a.py", id_prefix="a", taken=["a-2"])
    assert apply_steps(ORIGINAL, steps) == edited
    assert all(s["old"] for s in steps), "an insertion carries at least one line of context"
    assert len({s["id"] for s in steps}) == len(steps) and "a-2" not in {s["id"] for s in steps}
    # the rerun on the edited file sees every step as already applied
    assert all(apply_patch(edited, s["old"], s["new"]).status == "already-applied" for s in steps)


def test_derive_append_at_end_keeps_a_small_anchor() -> None:
    edited = ORIGINAL + "\n\nH = 3\n"
    steps = derive_patch_steps(ORIGINAL, edited, file="vllm/a.py")
    assert apply_steps(ORIGINAL, steps) == edited
    assert len(steps) == 1 and steps[0]["old"].count("\n") <= 3, "not the whole file as an anchor"


def test_derive_merges_neighbours_and_handles_deletion_and_eof() -> None:
    original = "x\nx\nx\na\nx\nb\nx\nx\nend"
    edited = "x\nx\nx\nA\nx\nB\nx\nx\nend!"
    steps = derive_patch_steps(original, edited, file="f")
    assert apply_steps(original, steps) == edited
    deleted = derive_patch_steps("a\nb\nc\n", "a\nc\n", file="f")
    assert apply_steps("a\nb\nc\n", deleted) == "a\nc\n" and deleted[0]["new"]
    assert derive_patch_steps("same\n", "same\n", file="f") == []


def test_derive_empty_original_refused() -> None:
    from imageforge.errors import BuildError

    with pytest.raises(BuildError):
        derive_patch_steps("", "new\n", file="f")


def test_render_yaml_round_trips_and_pastes_into_a_manifest(tmp_path: Path) -> None:
    original = ORIGINAL + "TRAILING = 1   \n\tTABBED\n"
    edited = original.replace("return x + 1\n\n\ndef g", "return x + 10\n\n\ndef g").replace(
        "TRAILING = 1   \n", "TRAILING = 2   \n\n\n")
    steps = derive_patch_steps(original, edited, file="vllm/a.py", id_prefix="a")
    text = render_steps_yaml(steps, header=["a comment"])
    assert yaml.safe_load(text) == steps
    # pasted under a target's steps, with more steps after it, the manifest loader reads the same values
    doc = MANIFEST.replace("    serving:\n", text + "      - id: after\n        kind: patch\n        file: vllm/y.py\n"
                           "        old: \"Q\"\n        new: \"R\"\n    serving:\n", 1)
    (tmp_path / "overlays").mkdir()
    for name in ("x.py", "same.py", "run.sh"):
        (tmp_path / "overlays" / name).write_text("X = 1\n")
    (tmp_path / "build.yaml").write_text(doc)
    m = load_manifest(tmp_path / "build.yaml")
    loaded = {s.id: s for s in m.targets["t"].steps}
    for s in steps:
        spec = PatchSpec.of(loaded[s["id"]])
        assert spec.old == s["old"] and spec.new == s["new"]
    assert "after" in loaded


def test_package_file() -> None:
    assert package_file(f"{SITE}/vllm/a.py", SITE) == "vllm/a.py"
    assert package_file("/etc/x.conf", SITE) == "/etc/x.conf"
    assert package_file("vllm/./a.py", SITE) == "vllm/a.py"


lines = st.lists(st.sampled_from(["a", "b", "x = 1", "", "  y", "def f():", "    return 1", "é", "k: v", "- z",
                                  "#", "a  ", "\t"]), max_size=14)


@settings(max_examples=400, deadline=None)
@given(lines, lines, st.booleans(), st.booleans())
def test_derive_property(a: list[str], b: list[str], nl_a: bool, nl_b: bool) -> None:
    original = "\n".join(a) + ("\n" if nl_a else "")
    edited = "\n".join(b) + ("\n" if nl_b else "")
    if not original:
        return
    steps = derive_patch_steps(original, edited, file="vllm/f.py")
    assert apply_steps(original, steps) == edited
    current = original
    for s in steps:  # every anchor is unique (overlapping matches counted) where it is applied
        assert occurrences(current, s["old"]) == 1
        current = apply_steps(current, [s])
    if steps:
        assert yaml.safe_load(render_steps_yaml(steps)) == steps


# ------------------------------------------------------------------------ the line-anchored rule and the file checks


def _step(ident: str, kind_name: str, spec: dict[str, object], index: int = 0) -> object:
    from imageforge.errors import Location
    from imageforge.manifest.model import Step

    return Step(ident, kind_name, None, Location("build.yaml", 1 + index), f"steps[{index}]", None,
                kind(kind_name).spec_type(**spec))


MOE_PY = ("def f(x, T):\n    if T == 1:\n        out = x\n    else:\n        out = x * 0\n        uniq = x + 1\n"
          "    return out\n")


def test_deeper_line_and_broken_file_rows() -> None:
    fs = DictFS(files={f"{SITE}/vllm/m.py": MOE_PY.encode()})
    inside = _step("inside", "patch", {"file": "vllm/m.py", "old": "    uniq = x + 1\n", "new": "    uniq = 2\n"})
    broken = _step("broken", "patch", {"file": "vllm/m.py", "old": "        out = x\n",
                                       "new": "        out = x\n      y = 1\n"}, 1)
    unbound = _step("unbound", "patch", {"file": "vllm/m.py", "old": "        out = x * 0\n",
                                         "new": "        out = x * topk_weights\n"}, 2)
    rows, state = check_steps([inside, broken, unbound], {}, fs, SITE, python_version="3.10.12")  # type: ignore[list-item]
    by = {r.step: r for r in rows}
    assert by["inside"].status == "inside line" and not by["inside"].ok
    assert "found inside line 6 at column 5: the line is indented 8 spaces, the anchor 4 spaces" in by["inside"].detail
    assert by["broken"].status == "breaks the file" and "line 4: IndentationError" in by["broken"].detail
    assert by["unbound"].status == "breaks the file"
    assert "NameError: name 'topk_weights' is not bound" in by["unbound"].detail
    assert state.read(f"{SITE}/vllm/m.py") == MOE_PY.encode(), "a failing step records nothing"


def test_final_state_checks_what_verify_checks(tmp_path: Path) -> None:
    from imageforge.patches.check import Overlay, final_state

    source = tmp_path / "o.py"
    source.write_text("X = 1\n")
    ov = _step("ov", "overlay", {"source": str(source), "dest": "vllm/o.py"})
    object.__setattr__(ov, "source_path", source)
    fs = DictFS(files={f"{SITE}/vllm/o.py": b"X = 2\n", f"{SITE}/vllm/s.py": b"def f(:\n"})
    state = Overlay(fs)
    final = final_state([ov], state, SITE, environ={}, python_version="3.10.12",  # type: ignore[list-item]
                        script_changed=[f"{SITE}/vllm/s.py", f"{SITE}/vllm/data.txt"])
    assert (final.python, final.overlays) == (2, 1) and not final.ok
    assert any("vllm/s.py, line 1: SyntaxError" in p for p in final.problems)
    assert any("sha256 differs" in p for p in final.problems)
    assert "2 changed .py file(s) compile, 1 overlay hash(es), 0 link(s): 2 problem(s)" in final.text()
    good = final_state([ov], Overlay(DictFS(files={f"{SITE}/vllm/o.py": b"X = 1\n"})), SITE, environ={},  # type: ignore[list-item]
                       python_version="3.10.12")
    assert good.ok and good.text().endswith(": ok")
