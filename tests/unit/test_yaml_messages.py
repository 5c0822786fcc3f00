"""Positions and messages: each mistake gives its own exact message, position and hint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import EXIT_CONFIG, ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.yaml_messages import key_path_at
from tests.unit.conftest import MINIMAL

Write = Callable[..., Path]


def error_of(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_manifest(path)
    assert info.value.exit_code == EXIT_CONFIG
    return info.value


def only(err: ConfigError) -> str:
    """The error's text without the file's directory (the tmp dir differs per test)."""
    return err.render().replace(str(err.location.file if err.location else ""), "build.yaml")


# --------------------------------------------------------------------------- YAML syntax


def test_over_indented_key(write_manifest: Write) -> None:
    text = "version: 1\ntargets:\n  t:\n    base: x\n      package: y\n"
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:5:7: targets.t.package: invalid YAML: 'package' at line 5 is indented more than"
        " the key above it\n"
        "  expected: 4 spaces, like 'base' above it\n"
        "  found:    6 spaces: YAML reads the line as the rest of the value above\n"
        "  hint:     over-indented key: move 'package' left to its siblings' indentation"
    )


def test_under_indented_key(write_manifest: Write) -> None:
    text = "version: 1\ntargets:\n  t:\n    base:\n      image: x\n     recipe: y\n"
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:6:6: targets.t.base: invalid YAML: 'recipe' at line 6 is indented less than"
        " the key above it\n"
        "  expected: 4 spaces (next to 'base' at line 4) or 6 spaces (next to 'image' above it)\n"
        "  found:    5 spaces\n"
        "  hint:     under-indented key: align 'recipe' with the keys it belongs with"
    )


def test_tab_names_its_position(write_manifest: Write) -> None:
    assert only(error_of(write_manifest("version: 1\ntargets:\n\tt: {}\n"))) == (
        "config error: build.yaml:3:1: invalid YAML: a tab character at line 3, column 1\n"
        "  expected: indentation with spaces\n"
        "  found:    a tab at line 3, column 1\n"
        "  hint:     YAML is indented with spaces, never tabs: replace the tab with spaces"
    )


def test_unclosed_bracket_reports_where_it_opened_and_where_it_was_noticed(write_manifest: Write) -> None:
    text = "version: 1\ntargets:\n  t:\n    steps:\n      - id: a\n        args: [1, 2\n      - id: b\n"
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:7:11: targets.t.steps[0].args: invalid YAML: the '[' opened at line 6, column 15"
        " is never closed\n"
        "  expected: ',' or ']' before the next key\n"
        "  found:    ':' at line 7, column 11, where the parser noticed\n"
        "  hint:     close it with ']', or write the items as a block list/mapping on their own lines"
    )


def test_unclosed_brace_at_end_of_file(write_manifest: Write) -> None:
    text = "version: 1\ntargets:\n  t:\n    base: {image: x\n"
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:5:1: targets.t.base: invalid YAML: the '{' opened at line 4, column 11"
        " is never closed\n"
        "  expected: ',' or '}' before the next key\n"
        "  found:    the end of the file at line 5, column 1, where the parser noticed\n"
        "  hint:     close it with '}', or write the items as a block list/mapping on their own lines"
    )


def test_unclosed_quote_reports_where_it_opened(write_manifest: Write) -> None:
    text = 'version: 1\ndefault_target: "t\ntargets: {}\n'
    assert only(error_of(write_manifest(text))) == (
        'config error: build.yaml:4:1: default_target: invalid YAML: the " opened at line 2, column 17'
        " is never closed\n"
        '  expected: a closing " on the same value\n'
        "  found:    the end of the file at line 4, column 1, where the parser noticed\n"
        '  hint:     add the closing "; inside "..." write a " as \\"'
    )


def test_colon_inside_a_value(write_manifest: Write) -> None:
    assert only(error_of(write_manifest("version: 1\ndescription: a: b\n"))) == (
        "config error: build.yaml:2:15: description: invalid YAML: a ': ' inside a value at line 2, column 15\n"
        "  expected: one 'key: value' per line\n"
        "  found:    ': ' at line 2, column 15\n"
        "  hint:     quote a value that contains ': ' (e.g. why: \"a: b\"), or put the key on its own line"
    )


@pytest.mark.parametrize(
    ("line", "column", "expected"),
    [(1, 9, ("version",)), (10, 16, ("targets", "t", "steps", 0, "source")),
     (13, 14, ("targets", "t", "steps", 1, "kind")), (19, 20, ("targets", "t", "serving", "args")),
     (12, 8, ("targets", "t", "steps", 1)), (4, 2, ("targets",))],
)
def test_key_path_from_the_text(line: int, column: int, expected: tuple[str | int, ...]) -> None:
    """The path of the innermost key (or list item) whose value holds the 1-based line, 0-based column."""
    assert key_path_at(MINIMAL, line - 1, column) == expected


# --------------------------------------------------------------------------- encodings


def test_non_utf8_byte_has_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "build.yaml"
    path.write_bytes(b"version: 1\ndescription: caf" + b"\xe9 cr\xc3\xa8me\n")
    err = error_of(path)
    assert err.message == "manifest is not UTF-8 text"
    assert str(err.location) == f"{path}:2:17"
    assert err.found == "byte 0xe9 at line 2, column 17 (offset 27)"


def test_utf16_is_named(tmp_path: Path) -> None:
    path = tmp_path / "build.yaml"
    path.write_text("version: 1\n", encoding="utf-16")  # with a byte-order mark
    err = error_of(path)
    assert err.message == "manifest is UTF-16 text"
    assert err.found == "UTF-16 (little-endian byte-order mark)"
    path.write_bytes("version: 1\n".encode("utf-16-be"))  # without one
    assert error_of(path).found == "UTF-16 (big-endian, no byte-order mark)"


# --------------------------------------------------------------------------- values YAML turned into numbers


def test_unquoted_mode_shows_what_was_written(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace("dest: vllm/x.py", "dest: vllm/x.py\n        mode: 0644")))
    assert only(err) == (
        "config error: build.yaml:12:9: targets.t.steps[0].mode: wrong type\n"
        "  expected: string\n"
        "  found:    integer 0644 (YAML reads the unquoted 0644 as 420)\n"
        "  hint:     write it quoted: '0644'"
    )


def test_version_as_a_date(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace("version: 1", "version: 2025-01-15")))
    assert only(err) == (
        "config error: build.yaml:1:1: version: value not allowed\n"
        "  expected: one of 1\n"
        "  found:    a date, 2025-01-15"
    )


def test_a_date_where_text_is_expected(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace('version: "1.0"', "version: 2025-01-15")))
    assert err.key_path == "targets.t.package.version"
    assert err.found == "date 2025-01-15"
    assert err.hint == "write it quoted: '2025-01-15'"


def test_an_explicit_timestamp_tag_is_still_a_tag(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace("version: 1", "version: !!timestamp 2025-01-15")))
    assert err.message == "YAML tag 'tag:yaml.org,2002:timestamp' is not allowed"


# --------------------------------------------------------------------------- schema messages


def test_key_pattern_error_points_at_the_key(write_manifest: Write) -> None:
    text = MINIMAL.replace(
        "      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}",
        "      args:\n        model: /m\n        max_num_seqs: 1",
    )
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:21:9: targets.t.serving.args.max_num_seqs: key 'max_num_seqs' has the wrong form\n"
        "  expected: a vLLM flag name without the leading dashes, lowercase with dashes (max-num-seqs)\n"
        "  found:    'max_num_seqs'\n"
        "  hint:     use dashes: 'max-num-seqs'"
    )


def test_base_as_a_string_names_the_accepted_forms(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace('base: {image: "debian:bookworm"}', "base: images/cpu")))
    assert only(err) == (
        "config error: build.yaml:5:5: targets.t.base: not one of the accepted forms\n"
        "  expected: a mapping with 'image' (an image reference or '${VAR}') or a mapping with 'recipe'"
        " (a directory such as images/cpu)\n"
        "  found:    string 'images/cpu'\n"
        "  hint:     write it as a mapping: base: {image: images/cpu} or base: {recipe: images/cpu}"
    )


def test_ulimit_value_names_the_accepted_forms(write_manifest: Write) -> None:
    text = MINIMAL.replace("    steps:\n", '    run:\n      ulimits: {nofile: "65536"}\n    steps:\n', 1)
    assert only(error_of(write_manifest(text))) == (
        "config error: build.yaml:8:17: targets.t.run.ulimits.nofile: not one of the accepted forms\n"
        "  expected: an integer (soft and hard limit alike, e.g. nofile: 65536) or a mapping"
        " {soft: INTEGER, hard: INTEGER}\n"
        "  found:    string '65536'"
    )


def test_symlink_with_both_forms(write_manifest: Write) -> None:
    text = MINIMAL.replace(
        "      - id: fix\n",
        "      - id: ln\n        kind: symlink\n        link: /a\n        target: /b\n        glob: /c*\n"
        "        into: /d\n      - id: fix\n",
    )
    err = error_of(write_manifest(text))
    assert err.message == "not one of the accepted forms"
    assert err.expected == (
        "one link: {link: /abs/path, target: WHAT} or one link per file: {glob: /abs/glob*, into: /abs/dir}"
    )
    assert err.found == "keys 'id', 'kind', 'link', 'target', 'glob', 'into'"


def test_dest_ending_in_a_slash(write_manifest: Write) -> None:
    err = error_of(write_manifest(MINIMAL.replace("dest: vllm/x.py", "dest: vllm/ops/")))
    assert only(err) == (
        "config error: build.yaml:11:9: targets.t.steps[0].dest: dest names a file; add the file name\n"
        "  expected: a file path, e.g. 'vllm/ops/x.py'\n"
        "  found:    'vllm/ops/' (a directory)\n"
        "  hint:     imageforge writes exactly the path given; it never guesses a name inside a directory"
    )


def test_environment_values_are_kept_as_written(write_manifest: Write) -> None:
    text = MINIMAL.replace(
        "      config_path: /etc/serve.yaml\n",
        "      config_path: /etc/serve.yaml\n      env: {A: true, B: 010, C: 1.50, D: \"x\", E: 0x1F, F: yes}\n",
    )
    env = load_manifest(write_manifest(text)).targets["t"].serving.env
    assert dict(env) == {"A": "true", "B": "010", "C": "1.50", "D": "x", "E": "0x1F", "F": "yes"}
