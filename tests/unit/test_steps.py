"""Each step kind's ``apply`` on an in-memory image: the Changes it returns, written out by hand.

The registry against the schema: every kind of the schema has a class whose fields are the schema's keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imageforge.errors import BuildError, ConfigError, Location
from imageforge.manifest.model import Step
from imageforge.steps import KINDS, ApplyContext, Changes, DictFS, FileChange, FileMeta, LinkChange, StepProblem, kind

SITE = "/site"
LOC = Location("build.yaml", 3)
CTX = ApplyContext(site=SITE)
CHECK = ApplyContext(site=SITE, checking=True)
COMMON_KEYS = {"id", "kind", "why", "requires", "required"}


def step(kind_name: str, spec: dict[str, object], source: Path | None = None) -> Step:
    return Step("s1", kind_name, None, LOC, "targets.t.steps[0]", None, kind(kind_name).spec_type(**spec),
                source_path=source)


def test_every_schema_kind_has_one_class_with_the_schema_keys() -> None:
    schema_file = Path(__file__).resolve().parents[2] / "schema/build.schema.json"
    defs = json.loads(schema_file.read_text())["$defs"]
    kinds = defs["step"]["properties"]["kind"]["enum"]
    assert sorted(KINDS) == sorted(kinds) == ["native", "overlay", "patch", "script", "symlink"]
    for name in kinds:
        assert set(KINDS[name].fields) == set(defs[f"{name}_step"]["properties"]) - COMMON_KEYS, name
    with pytest.raises(ConfigError, match="has no definition"):
        kind("write")


# --------------------------------------------------------------------------- patch


def test_patch_returns_the_edited_file_with_the_image_files_mode_owner_and_mtime() -> None:
    fs = DictFS(files={"/site/vllm/a.py": b"x = 1\ny = 2\n"},
                meta={"/site/vllm/a.py": FileMeta(mode=0o640, uid=5, gid=6, mtime=1234)})
    changes = kind("patch").apply(step("patch", {"file": "vllm/a.py", "old": "y = 2", "new": "y = 3"}), fs, CTX)
    assert changes == Changes("applies", "/site/vllm/a.py", "anchor at line 2", "patched /site/vllm/a.py at line 2",
                              files=(FileChange("/site/vllm/a.py", b"x = 1\ny = 3\n", 0o640, 5, 6, 1234),))
    assert fs.files["/site/vllm/a.py"] == b"x = 1\ny = 2\n"  # apply returns, never writes


def test_patch_with_diff_and_already_applied() -> None:
    fs = DictFS(files={"/site/vllm/a.py": b"y = 3\n"})
    s = step("patch", {"file": "vllm/a.py", "old": "y = 2", "new": "y = 3"})
    assert kind("patch").apply(s, fs, CTX) == Changes("already applied", "/site/vllm/a.py",
                                                      "new text at line 1, anchor absent", "already applied: skipped")
    fs.files["/site/vllm/a.py"] = b"y = 2\n"
    diff = kind("patch").apply(s, fs, ApplyContext(site=SITE, with_diff=True)).diff
    assert "-y = 2\n" in diff and "+y = 3\n" in diff


def test_patch_problems_carry_the_row_and_the_build_error() -> None:
    s = step("patch", {"file": "vllm/a.py", "old": "gone", "new": "z"})
    with pytest.raises(StepProblem) as missing:
        kind("patch").apply(s, DictFS(files={"/site/vllm/a.py": b"y = 2\n"}), CTX)
    assert (missing.value.status, missing.value.blame) == ("anchor missing", "old")
    assert isinstance(missing.value.error, BuildError)
    assert missing.value.error.message == ("patch 's1' does not apply to /site/vllm/a.py: "
                                            "anchor not found; no similar line")
    with pytest.raises(StepProblem) as absent:
        kind("patch").apply(s, DictFS(dirs={"/site/vllm"}), CTX)
    assert (absent.value.status, absent.value.detail) == ("destination missing", "file not in the image "
                                                          "(its directory exists)")
    assert absent.value.error.message == "patch target /site/vllm/a.py does not exist in the image"
    with pytest.raises(StepProblem) as linked:
        kind("patch").apply(s, DictFS(links={"/site/vllm": "/elsewhere"}), CTX)
    assert linked.value.status == "conflict"
    assert linked.value.error.message == ("destination /site/vllm/a.py goes through a symbolic link in the image "
                                          "(/site/vllm -> /elsewhere)")


def test_patch_facts() -> None:
    facts = kind("patch").facts(step("patch", {"file": "vllm/a.py", "old": "a", "new": "b"}), {}, SITE)
    assert facts.python_files == ("/site/vllm/a.py",) and not facts.overlays
    text = step("patch", {"file": "vllm/a.txt", "old": "a", "new": "b"})
    assert kind("patch").facts(text, {}, SITE).python_files == ()


# --------------------------------------------------------------------------- overlay


def test_overlay_returns_the_source_with_the_steps_mode_and_owner(tmp_path: Path) -> None:
    source = tmp_path / "o.py"
    source.write_bytes(b"NEW = 1\n")
    os.chmod(source, 0o755)
    s = step("overlay", {"source": "o.py", "dest": "vllm/o.py", "owner": "1:2"}, source)
    changes = kind("overlay").apply(s, DictFS(dirs={"/site/vllm"}), CTX)
    assert changes.files == (FileChange("/site/vllm/o.py", b"NEW = 1\n", 0o755, 1, 2, None),)
    assert changes.summary == "added /site/vllm/o.py (8 bytes, mode 755)"
    assert changes.status == "applies" and changes.links == ()
    explicit = step("overlay", {"source": "o.py", "dest": "vllm/o.py", "mode": 0o600}, source)
    same = DictFS(files={"/site/vllm/o.py": b"NEW = 1\n"})
    checked = kind("overlay").apply(explicit, same, CHECK)
    # the same bytes: already applied for the report, but the file is still written (its mode may differ)
    assert checked.status == "already applied"
    assert checked.files == (FileChange("/site/vllm/o.py", b"NEW = 1\n", 0o600, 0, 0, None),)
    assert checked.summary == "replaced /site/vllm/o.py (8 bytes, mode 600)"


def test_overlay_problems_and_facts(tmp_path: Path) -> None:
    source = tmp_path / "o.py"
    source.write_bytes(b"NEW = 1\n")
    s = step("overlay", {"source": "o.py", "dest": "vllm/o.py"}, source)
    with pytest.raises(StepProblem) as isdir:
        kind("overlay").apply(s, DictFS(dirs={"/site/vllm/o.py"}), CTX)
    assert (isdir.value.status, isdir.value.blame) == ("conflict", "dest")
    assert isdir.value.error.message == "overlay destination /site/vllm/o.py is a directory in the image"
    # a missing directory: the build makes it, check-patches reports it (the package moved, most likely)
    assert kind("overlay").apply(s, DictFS(), CTX).files[0].path == "/site/vllm/o.py"
    with pytest.raises(StepProblem) as moved:
        kind("overlay").apply(s, DictFS(), CHECK)
    assert moved.value.status == "destination missing"
    facts = kind("overlay").facts(s, {"o.py": "ab" * 32}, SITE)
    assert facts.overlays == {"/site/vllm/o.py": "ab" * 32} and facts.python_files == ("/site/vllm/o.py",)


# --------------------------------------------------------------------------- symlink


def test_symlink_glob_links_every_matching_file_and_leaves_those_in_place() -> None:
    fs = DictFS(files={"/usr/lib/x/libA.so.1": b"", "/usr/lib/x/libB.so": b"", "/usr/lib/x/other": b""},
                dirs={"/usr/lib/x/libdir.so"}, links={"/opt/l/libB.so": "/usr/lib/x/libB.so"})
    s = step("symlink", {"glob": "/usr/lib/x/lib*.so*", "into": "/opt/l"})
    changes = kind("symlink").apply(s, fs, CTX)
    assert changes == Changes("applies", "/usr/lib/x/lib*.so* -> /opt/l", "1 link(s) to make, 1 in place",
                              "1 link(s) made, 1 already in place",
                              links=(LinkChange("/opt/l/libA.so.1", "/usr/lib/x/libA.so.1"),))
    facts = kind("symlink").facts(s, {}, SITE)
    assert [dict(g) for g in facts.link_globs] == [{"glob": "/usr/lib/x/lib*.so*", "into": "/opt/l"}]


def test_symlink_in_the_way_needs_replace() -> None:
    fs = DictFS(files={"/opt/new.so": b""}, links={"/usr/lib/x.so": "/opt/old.so"})
    s = step("symlink", {"link": "/usr/lib/x.so", "target": "/opt/new.so"})
    with pytest.raises(StepProblem) as taken:
        kind("symlink").apply(s, fs, CTX)
    assert taken.value.status == "conflict" and taken.value.error.message == "/usr/lib/x.so already exists in the image"
    forced = step("symlink", {"link": "/usr/lib/x.so", "target": "/opt/new.so", "replace": True})
    assert kind("symlink").apply(forced, fs, CTX).links == (LinkChange("/usr/lib/x.so", "/opt/new.so"),)
    assert kind("symlink").facts(forced, {}, SITE).links == ("/usr/lib/x.so",)
    wild = step("symlink", {"glob": "/usr/*/x/*.so", "into": "/opt"})
    with pytest.raises(StepProblem) as bad:
        kind("symlink").apply(wild, fs, CTX)
    assert isinstance(bad.value.error, ConfigError)


# --------------------------------------------------------------------------- script


def test_script_apply_needs_a_running_container(tmp_path: Path) -> None:
    source = tmp_path / "s.sh"
    source.write_text("#!/bin/sh\ntrue\n")
    s = step("script", {"source": "s.sh"}, source)
    assert kind("script").runs_process and not kind("patch").runs_process
    with pytest.raises(BuildError, match="needs a running container"):
        kind("script").apply(s, DictFS(), CTX)
    assert kind("script").row_path(s, SITE) == "s.sh"
