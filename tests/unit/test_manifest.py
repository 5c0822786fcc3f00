"""Loader, schema and semantic checks: every bad input gives one clear ConfigError (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import EXIT_CONFIG, ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.model import normalise_image_path
from imageforge.steps import PatchSpec
from tests.unit.conftest import MINIMAL

REPO = Path(__file__).resolve().parents[2]


def error_of(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_manifest(path)
    assert info.value.exit_code == EXIT_CONFIG
    return info.value


def test_minimal_manifest_loads_into_frozen_dataclasses(write_manifest: Callable[[str], Path]) -> None:
    m = load_manifest(write_manifest(MINIMAL))
    t = m.targets["t"]
    assert [s.id for s in t.steps] == ["over", "fix"]
    assert t.steps[0].source.name == "x.py"
    assert PatchSpec.of(t.steps[1]).count == 1
    assert t.image == "imageforge/t"
    assert [p.name for p in t.profile_chain("big")] == ["small", "big"]
    with pytest.raises(AttributeError):
        t.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.serving.args["model"] = "x"  # type: ignore[index]


def test_repo_manifest_validates() -> None:
    m = load_manifest(REPO / "build.yaml")
    assert {"cpu", "bi100"} <= set(m.targets)
    assert m.default_target == "bi100"
    assert {"baseline", "conservative", "aggressive"} <= set(m.targets["cpu"].profiles)
    assert {"baseline", "replay"} <= set(m.targets["bi100"].profiles)  # bi100: one request at a time


def test_unknown_key_did_you_mean(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("default_profile: small", "default_profil: small")))
    text = err.render()
    assert "build.yaml:20:5: targets.t.default_profil: unknown key 'default_profil'" in text
    assert "did you mean 'default_profile'?" in text


def test_unknown_key_inside_step(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace("        dest: vllm/x.py", "        dest: vllm/x.py\n        mdoe: '0644'")
    err = error_of(write_manifest(text))
    assert "targets.t.steps[0].mdoe: unknown key 'mdoe'" in err.render()
    assert "did you mean 'mode'?" in err.render()


def test_unknown_top_level_key(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL + "extra: 1\n"))
    assert ":24:1: extra: unknown key 'extra'" in err.render()


def test_all_schema_errors_are_reported(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace("version: 1", "version: 2").replace("default_profile: small", "default_profil: small")
    err = error_of(write_manifest(text))
    assert "(2 problems)" in err.message
    rendered = err.render()
    assert "version: value not allowed" in rendered and "default_profil" in rendered


def test_wrong_type_message(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("config_path: /etc/serve.yaml", "config_path: 12")))
    text = err.render()
    assert "targets.t.serving.config_path: wrong type" in text
    assert "expected: string" in text and "found:    integer 12" in text


def test_run_volumes_bind_by_default_or_a_named_volume(write_manifest: Callable[[str], Path]) -> None:
    volumes = """    run:
      volumes:
        - {source: weights, target: /model}
        - {type: volume, source: my-cache.1, target: /root/.cache/vllm, read_only: false}
    steps:
"""
    text = MINIMAL.replace("    steps:\n", volumes, 1)
    bind, named = load_manifest(write_manifest(text)).targets["t"].run.volumes
    assert (bind.type, bind.named, bind.read_only) == ("bind", False, True)  # a bare relative path stays a path
    assert (named.type, named.named, named.read_only, named.source) == ("volume", True, False, "my-cache.1")
    # a volume's name is what Docker accepts: no path there (file:line, key path, the form expected)
    err = error_of(write_manifest(text.replace("source: my-cache.1", "source: ./cache"))).render()
    assert "targets.t.run.volumes[1].source: value has the wrong form" in err
    assert "^[A-Za-z0-9][A-Za-z0-9_.-]*$" in err and "build.yaml:" in err
    text = error_of(write_manifest(MINIMAL.replace("    steps:\n", volumes.replace("type: volume", "type: tmpfs"),
                                                   1))).render()
    assert "targets.t.run.volumes[1].type" in text and "tmpfs" in text


def test_missing_key(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("        new: \"A = 2\"\n", "")))
    assert "targets.t.steps[1]: missing required key 'new'" in err.render()


def test_malformed_yaml_tab(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest("version: 1\ntargets:\n\tt: {}\n"))
    assert "invalid YAML" in err.message
    assert err.location is not None and err.location.line == 3
    assert "tabs" in (err.hint or "")


def test_duplicate_keys(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest("version: 1\nversion: 1\n"))
    assert err.message == "duplicate key 'version'"
    assert str(err.location).endswith("build.yaml:2:1")
    assert err.found == "'version' again (first at line 1)"


def test_unclosed_quote(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest('version: 1\ndefault_target: "t\n'))
    assert err.message.startswith("invalid YAML")


def test_python_tag_refused(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest("version: !!python/object:os.system 1\n"))
    assert err.message == "YAML tag 'tag:yaml.org,2002:python/object:os.system' is not allowed"
    assert err.key_path == "version"


def test_empty_file(write_manifest: Callable[[str], Path]) -> None:
    assert error_of(write_manifest("")).message == "manifest is empty"
    assert error_of(write_manifest("# only a comment\n")).message == "manifest is empty"


def test_directory_binary_and_huge(tmp_path: Path) -> None:
    assert error_of(tmp_path).message == "manifest is a directory"
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"version: 1\x00\x01")
    assert error_of(binary).message == "manifest is a binary file"
    huge = tmp_path / "h.yaml"
    huge.write_text("# " + "x" * (2 * 1024 * 1024))
    err = error_of(huge)
    assert err.message == "manifest is too large" and err.found == "2048 KiB"
    assert error_of(tmp_path / "missing.yaml").message == "manifest not found"


def test_not_a_mapping(write_manifest: Callable[[str], Path]) -> None:
    assert error_of(write_manifest("- a\n- b\n")).message == "manifest must be a mapping"


def test_missing_overlay_source(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("overlays/x.py", "overlays/nope.py")))
    assert err.message == "source file does not exist"
    assert err.key_path == "targets.t.steps[0].source"
    assert err.location is not None and err.location.line == 10


def test_source_symlink_escaping_repo(write_manifest: Callable[[str], Path], tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("x = 1\n")
    (tmp_path / "overlays" / "link.py").symlink_to(outside)
    err = error_of(write_manifest(MINIMAL.replace("overlays/x.py", "overlays/link.py")))
    assert err.message == "source escapes the manifest's directory"


@pytest.mark.parametrize("dest", ["vllm/../../etc/passwd", "../x.py", "/etc/../../x", "vllm/a/../../../x"])
def test_path_traversal_in_destination(write_manifest: Callable[[str], Path], dest: str) -> None:
    err = error_of(write_manifest(MINIMAL.replace("dest: vllm/x.py", f"dest: {dest}")))
    assert err.message == "destination escapes its root"
    assert err.key_path == "targets.t.steps[0].dest"


def test_relative_destination_outside_package(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("dest: vllm/x.py", "dest: torch/x.py")))
    assert err.message == "relative destination is outside the package"


def test_duplicate_step_ids(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("- id: fix", "- id: over")))
    assert err.message == "duplicate step id 'over'"
    assert err.found == "'over' also at line 8"


def test_unknown_default_profile_and_extends(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace("extends: small", "extends: smal")))
    assert err.message == "profile 'big' extends an unknown profile"
    assert err.hint == "did you mean 'small'?"


def test_extends_cycle(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace("small: {args: {max-num-seqs: 2}}", "small: {extends: big, args: {max-num-seqs: 2}}")
    err = error_of(write_manifest(text))
    assert any(p.message == "profile 'extends' forms a cycle" for p in err.problems)


def test_patch_old_equals_new(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace('new: "A = 2"', 'new: "A = 1"')))
    assert err.message == "patch does not change anything"


def test_env_reference_for_base(write_manifest: Callable[[str], Path]) -> None:
    m = load_manifest(write_manifest(MINIMAL.replace('image: "debian:bookworm"', "image: '${MY_BASE}'")))
    base = m.targets["t"].base
    assert base.image_env == "MY_BASE"
    assert base.reference({}) is None
    assert base.reference({"MY_BASE": "vendor:1"}) == "vendor:1"


def test_partial_env_reference_rejected(write_manifest: Callable[[str], Path]) -> None:
    err = error_of(write_manifest(MINIMAL.replace('image: "debian:bookworm"', "image: 'vendor:${TAG}'")))
    assert err.message == "only a whole '${VAR}' may be used here"


@pytest.mark.parametrize(
    ("dest", "expected"),
    [("vllm/a.py", "vllm/a.py"), ("/usr/lib/x", "/usr/lib/x"), ("vllm/./a.py", "vllm/a.py"),
     ("vllm/../x", None), ("..", None), ("/", None), ("a\\b", None)],
)
def test_normalise_image_path(dest: str, expected: str | None) -> None:
    assert normalise_image_path(dest) == expected
