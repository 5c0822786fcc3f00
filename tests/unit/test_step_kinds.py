"""The step kinds are defined once, each in its module of steps/: its typed frozen spec (fields,
defaults), its manifest keys as a JSON Schema fragment, its load.

The schema's step parts are made from the registry (``imageforge.steps.schema``): the loader validates against
them, and the shipped file (top-level schema/build.schema.json) is their text (``invoke schema`` rewrites it).
A kind defined here, in this module only, is accepted by the loader; an unknown kind is refused. The cache keys of
a manifest using every kind's fields are the ones main's code computed before the specs were typed.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import pytest

from imageforge.errors import ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.model import Step, StepSpec
from imageforge.manifest.resolve import resolve
from imageforge.plan import chain_key, make_plan, step_inputs
from imageforge.steps import KINDS, PatchSpec, StepKind, kind
from imageforge.steps.core import register
from imageforge.steps.schema import manifest_schema, schema_text, with_kinds
from tests.unit.conftest import MINIMAL, manifest_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "schema" / "build.schema.json"
#: The keys of every step, whatever its kind (the schema's $defs.step and the Step dataclass's own fields).
COMMON = {"id", "kind", "why", "required", "requires"}


def test_the_shipped_schema_is_the_registrys() -> None:
    text = SHIPPED.read_text()
    assert schema_text(with_kinds(json.loads(text), KINDS)) == text, "run `invoke schema` (it rewrites the file)"
    assert json.loads(text) == manifest_schema(), "the loader validates against what is shipped"
    defs = json.loads(text)["$defs"]
    assert defs["step"]["properties"]["kind"]["enum"] == sorted(KINDS) == ["native", "overlay", "patch", "script",
                                                                           "symlink"]
    for name, cls in KINDS.items():
        part = defs[f"{name}_step"]
        assert part["additionalProperties"] is False and set(part["properties"]) - COMMON == set(cls.fields), name


def test_each_kinds_spec_holds_its_manifest_keys_typed() -> None:
    for name, cls in KINDS.items():
        assert cls.name == name and issubclass(cls.spec_type, StepSpec), name
        assert {f.name for f in fields(cls.spec_type)} <= set(cls.fields), name
    steps = [s for t in load_manifest(REPO / "build.yaml").targets.values() for s in t.steps]
    assert {s.kind for s in steps} == set(KINDS), "the repository's build.yaml uses every kind"
    for step in steps:
        assert type(step.spec) is kind(step.kind).spec_type, step.id


def defaults(spec_type: type[StepSpec]) -> dict[str, Any]:
    return {f.name: f.default for f in fields(spec_type) if f.default is not MISSING}


def test_a_kinds_defaults_are_its_specs_and_fill_the_loaded_step(write_manifest: Callable[..., Path]) -> None:
    assert {k: v for k, v in defaults(PatchSpec).items() if v is not None} == {"count": 1, "verified": True}
    assert defaults(kind("symlink").spec_type) == {"link": None, "target": None, "glob": None, "into": None,
                                                    "replace": False, "replace_directory": False}
    twice = MINIMAL.replace('        new: "A = 2"\n', '        new: "A = 2"\n        count: 2\n')
    fix = PatchSpec.of(load_manifest(write_manifest(MINIMAL)).targets["t"].steps[1])
    assert (fix.count, fix.verified) == (1, True)
    assert PatchSpec.of(load_manifest(write_manifest(twice, "two.yaml")).targets["t"].steps[1]).count == 2
    # a spec made in code gets the same defaults: there is no second place that knows them
    assert PatchSpec(file="vllm/y.py", old="A = 1", new="A = 2") == fix
    over = load_manifest(write_manifest(MINIMAL)).targets["t"].steps[0]
    with pytest.raises(ConfigError, match=r"'over' \(kind overlay\) has no PatchSpec"):
        PatchSpec.of(over)


def test_a_kinds_load_reports_at_its_own_keys(write_manifest: Callable[[str], Path]) -> None:
    same = MINIMAL.replace('new: "A = 2"', 'new: "A = 1"')
    with pytest.raises(ConfigError) as info:
        load_manifest(write_manifest(same))
    assert (info.value.key_path, info.value.message) == ("targets.t.steps[1].new", "patch does not change anything")
    new_line = same.splitlines().index('        new: "A = 1"') + 1
    assert info.value.location is not None and (info.value.location.line, info.value.location.column) == (new_line, 9)


# --------------------------------------------------------------------------- a kind defined in this module only


@dataclass(frozen=True)
class DownloadSpec(StepSpec):
    url: str
    sha256: str | None = None
    retries: int = 3


class Download(StepKind):
    name = "download"
    spec_type = DownloadSpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": ["url"],
        "properties": {"url": {"type": "string", "pattern": "^https://"}, "sha256": {"type": "string"},
                       "retries": {"type": "integer", "minimum": 0}},
    }


@pytest.fixture
def download() -> Iterator[StepKind]:
    register(Download)
    try:
        yield KINDS["download"]
    finally:
        del KINDS["download"]


DOWNLOAD = MINIMAL.replace("    serving:", """\
      - id: fetch
        kind: download
        url: https://example.invalid/w.bin
""" + "    serving:")


def test_a_kind_in_one_module_is_accepted_and_an_unknown_kind_refused(
        download: StepKind, write_manifest: Callable[[str], Path]) -> None:
    target = load_manifest(write_manifest(DOWNLOAD)).targets["t"]
    fetch = target.steps[2]
    assert fetch.spec == DownloadSpec(url="https://example.invalid/w.bin") and kind("download") is download
    assert fetch.definition() == {"id": "fetch", "kind": "download", "retries": 3,
                                  "url": "https://example.invalid/w.bin"}
    plan = make_plan(resolve(load_manifest(write_manifest(DOWNLOAD)), "t", None, environ={}), environ={}, probe=None)
    assert [p.id for p in plan.steps if p.stage == "step"] == ["over", "fix", "fetch"]
    assert manifest_schema()["$defs"]["step"]["properties"]["kind"]["enum"] == sorted(KINDS)
    with pytest.raises(ConfigError) as info:  # its own keys are checked by its fragment
        load_manifest(write_manifest(DOWNLOAD.replace("url: https://", "url: http://").replace(
            "w.bin\n", "w.bin\n        retry: 2\n")))
    text = info.value.render()
    assert "targets.t.steps[2].url" in text and "unknown key 'retry'" in text and "did you mean 'retries'" in text
    with pytest.raises(ConfigError) as info:
        load_manifest(write_manifest(DOWNLOAD.replace("kind: download", "kind: upload")))
    assert "targets.t.steps[2].kind" in info.value.render() and "'download'" in info.value.render()


def test_without_the_kind_its_step_is_refused(write_manifest: Callable[[str], Path]) -> None:
    assert "download" not in KINDS
    with pytest.raises(ConfigError) as info:
        load_manifest(write_manifest(DOWNLOAD))
    assert "targets.t.steps[2].kind" in info.value.render()


# --------------------------------------------------------------------------- cache keys as main's code made them

#: Every kind with every field set and left out; paths written unnormalised where the loader normalises them.
EVERY_FIELD = manifest_text("""\
    steps:
      - {id: over, kind: overlay, source: overlays/x.py, dest: vllm/x.py}
      - {id: over-mode, kind: overlay, source: ./overlays//x.py, dest: /opt/x.py, mode: "0600", owner: "1000:1000",
         why: w, required: true}
      - {id: fix, kind: patch, file: vllm/y.py, old: "A = 1", new: "A = 2"}
      - {id: fix2, kind: patch, file: vllm/./y.py, old: "B = 1", new: "B = 2", count: 2, verified: false,
         requires: [fix]}
      - {id: run, kind: script, source: overlays/s.sh, args: [a, "1"], env: {X: 0644, Y: true, Z: "s"}, user: "1000",
         workdir: /tmp//w}
      - {id: run2, kind: script, source: overlays/s.sh}
      - {id: dir, kind: script, directory: tree, dest: /opt/tree/, command: [sh, run.sh], touches: [vllm/a.py],
         load_hint: "get it"}
      - {id: dirvar, kind: script, directory: "${W26_DIR}", dest: /opt/t2, command: [sh, run.sh], workdir: /opt}
      - {id: ln, kind: symlink, link: /usr/lib//a.so, target: b.so}
      - {id: lnglob, kind: symlink, glob: /usr/lib/x/*.so, into: /usr/lib/y/, replace: true, replace_directory: true}
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m}
""")

#: (definition as JSON, key chained from "sha256:base") per step, computed by main's code (0416a68, Step.spec a
#: Mapping) on EVERY_FIELD: typed specs change no key. Recomputed for KEY_VERSION imageforge-cache-v4 (script
#: layers label the .py files they changed): only the version in the payload changed, the definitions did not.
MAINS = [
    ('{"id": "over", "kind": "overlay", "dest": "vllm/x.py", "source": "overlays/x.py"}',
     "ca72f3fe36978f813867478f11e2b443461491794bd633bbcb313ac37a71c83d"),
    ('{"id": "over-mode", "kind": "overlay", "dest": "/opt/x.py", "mode": 384, "owner": "1000:1000", '
     '"source": "overlays/x.py"}', "346ae70d0345e6edde09f1c1cdfc80928f3fcaae023981f8579bfd2a9d742448"),
    ('{"id": "fix", "kind": "patch", "count": 1, "file": "vllm/y.py", "new": "A = 2", "old": "A = 1", '
     '"verified": true}', "f4ee4223bd5787f8006ca9e7c76b10607fc6c82e1adaa353bb0112a412333953"),
    ('{"id": "fix2", "kind": "patch", "count": 2, "file": "vllm/y.py", "new": "B = 2", "old": "B = 1", '
     '"verified": false}', "3af810f7438309b4a09f5445629df71e410269fde2017d2d494d3e0dba184610"),
    ('{"id": "run", "kind": "script", "args": ["a", "1"], "env": {"X": "0644", "Y": "true", "Z": "s"}, '
     '"source": "overlays/s.sh", "user": "1000", "workdir": "/tmp/w"}',
     "e6b29207c2bba8d6177be78b435ec455cc6e98abcd84cbad1a9ab0cdb0a89181"),
    ('{"id": "run2", "kind": "script", "args": [], "env": {}, "source": "overlays/s.sh"}',
     "7cd0f0dfc63a069d9f6048ede71dc7c167354f7de116b41d2a5309e17581f2f1"),
    ('{"id": "dir", "kind": "script", "args": [], "command": ["sh", "run.sh"], "dest": "/opt/tree", '
     '"directory": "tree", "env": {}, "workdir": "/opt/tree"}',
     "ef32c0fd52de3a4436eb4e6bc13b6c39cfbd0c95ffea6e87fd3b5695c1273281"),
    ('{"id": "dirvar", "kind": "script", "args": [], "command": ["sh", "run.sh"], "dest": "/opt/t2", '
     '"directory": "${W26_DIR}", "env": {}, "workdir": "/opt"}',
     "1b0e704784bed545c78ce23a974c1fbdc1f33cc97a4b966b0868e1f365f921cc"),
    ('{"id": "ln", "kind": "symlink", "link": "/usr/lib//a.so", "replace": false, "replace_directory": false, '
     '"target": "b.so"}', "d6c2abafade6391e47fb54bfc016eb18245dc73c2a4190be90f6ce965b4a9de7"),
    ('{"id": "lnglob", "kind": "symlink", "glob": "/usr/lib/x/*.so", "into": "/usr/lib/y/", "replace": true, '
     '"replace_directory": true}', "2d57e57f13c6e4fdfb511dce5230f6ef95d647257a72c3a1148e5cec34e52c29"),
]


def test_cache_keys_are_mains(tmp_path: Path) -> None:
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "x.py").write_text("X = 1\n")
    (tmp_path / "overlays" / "s.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "run.sh").write_text("echo run\n")
    (tmp_path / "build.yaml").write_text(EVERY_FIELD)
    steps: tuple[Step, ...] = load_manifest(tmp_path / "build.yaml").targets["t"].steps
    parent = "sha256:base"
    found = []
    for step in steps:
        parent = chain_key(parent, step.definition(), step_inputs(step, {}))
        found.append((json.dumps(step.definition()), parent))  # json.dumps keeps the order (the in-place journal's)
    assert found == MAINS


def test_what_other_stages_ask_of_a_step_its_kind_answers(cpu: Any) -> None:
    """Bisect's report, the subset images' verify imports, blame and the flags' parser steps ask the kind."""
    by_kind = {step.kind: step for step in cpu.steps}
    patch, overlay = by_kind["patch"], by_kind["overlay"]
    new_line = PatchSpec.of(patch).new.splitlines()[0].strip()
    assert kind("patch").wrote_line(patch, new_line) and not kind("patch").wrote_line(patch, "")
    assert not kind("overlay").wrote_line(overlay, new_line)
    assert kind("overlay").provides(overlay) == ("vllm/model_executor/layers/fused_moe/sorted_moe.py",)
    assert kind("patch").provides(patch) == ()
    for step in (s for s in cpu.steps if s.kind in ("patch", "overlay", "symlink", "script")):
        lines = kind(step.kind).describe(step)
        assert lines and "not listed here" not in lines[0], (step.kind, lines)
    assert kind("script").runs_process and not any(kind(k).runs_process for k in ("patch", "overlay", "symlink"))


def test_no_module_outside_steps_branches_on_a_kind_name() -> None:
    """``x.kind == "patch"`` (or ``in (...)``) belongs in the kind's class: a method or an attribute."""
    src = REPO / "src" / "imageforge"
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.parent.name == "steps":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)}
            on_kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            if on_kind and names & set(KINDS):
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert found == []


def test_the_in_image_step_runtime_knows_ops_by_what_they_do_and_every_op_a_kind_emits() -> None:
    """``inimage/apply_step`` (a stdlib program in the image: it cannot import the kinds) names its operations by
    what they do to the tree, never by a step kind; every ``"op"`` a kind's emit writes is one of them."""
    from imageforge.inimage import apply_step

    ops = set(apply_step._OPS)
    assert ops and not ops & set(KINDS), ops
    emitted = set()
    for path in sorted((REPO / "src" / "imageforge" / "steps").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "op" and isinstance(value, ast.Constant):
                        emitted.add(value.value)
    assert emitted == ops, (emitted, ops)
