"""Serving flags: the static reader on the 0.6.3-style fixture, the checker's exact messages, the JSON parser."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import ConfigError, Location
from imageforge.flags.check import (
    ServingArg,
    check_serving_args,
    run_port_of,
    serving_args_of_resolved,
    serving_args_of_target,
    suite_models,
)
from imageforge.flags.learn import STATIC_FILES, flags_from_source, parse_introspection, read_static
from imageforge.flags.model import FlagSpec, FlagTable, Range
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.manifest.yamldoc import load_yaml
from tests.unit.conftest import MINIMAL

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "vllm-0.6.3-parser"
ARG_UTILS = FIXTURE / "vendor" / STATIC_FILES[0]
CLI_ARGS = FIXTURE / "vendor" / STATIC_FILES[1]
BASELINE_CLI_ARGS = FIXTURE / "baseline" / "cli_args.py"

# The flags of the bi100 target and of the baseline's computility-run.yaml command.
BI100_FLAGS = [
    "model", "served-model-name", "max-model-len", "gpu-memory-utilization", "trust-remote-code",
    "tensor-parallel-size", "max-num-seqs", "disable-log-requests", "disable-frontend-multiprocessing",
    "max-num-batched-tokens", "enable-chunked-prefill", "max-seq-len-to-capture", "enable-auto-tool-choice",
    "tool-call-parser", "enable-prefix-caching", "port", "host",
]


def vendor() -> FlagTable:
    return read_static({STATIC_FILES[0]: ARG_UTILS.read_text(), STATIC_FILES[1]: CLI_ARGS.read_text()})


def baseline() -> FlagTable:
    """The parser after the baseline's step that replaces cli_args.py."""
    return read_static({STATIC_FILES[0]: ARG_UTILS.read_text(), STATIC_FILES[1]: BASELINE_CLI_ARGS.read_text()})


def line_of(path: Path, needle: str) -> int:
    """1-based line of the add_argument call whose first option string is ``needle``."""
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        if f'"{needle}"' in line:
            # the call starts on this line or on the 'parser.add_argument(' line just above
            return index + 1 if "add_argument(" in line else index
    raise AssertionError(needle)


# --------------------------------------------------------------------------- static reader


def test_every_bi100_flag_is_read_and_reasoning_parser_comes_from_the_baseline() -> None:
    table = vendor()
    assert [f for f in BI100_FLAGS if f not in table] == []
    assert "reasoning-parser" not in table
    after = baseline()
    assert "reasoning-parser" in after
    assert after.get("reasoning-parser") == FlagSpec(
        "reasoning-parser", "str", origin=f"{STATIC_FILES[1]}:{line_of(BASELINE_CLI_ARGS, '--reasoning-parser')}"
    )


def test_static_specs() -> None:
    table = vendor()
    au, ca = STATIC_FILES
    assert table.get("max-num-seqs") == FlagSpec("max-num-seqs", "int",
                                                 origin=f"{au}:{line_of(ARG_UTILS, '--max-num-seqs')}")
    assert table.get("tensor-parallel-size") == FlagSpec(
        "tensor-parallel-size", "int", aliases=("-tp",), origin=f"{au}:{line_of(ARG_UTILS, '--tensor-parallel-size')}"
    )
    assert table.get("trust-remote-code") == FlagSpec(
        "trust-remote-code", "bool", takes_value=False, origin=f"{au}:{line_of(ARG_UTILS, '--trust-remote-code')}"
    )
    assert table.get("host") == FlagSpec("host", "str", nullable=True, origin=f"{ca}:{line_of(CLI_ARGS, '--host')}")
    spec = {name: table.get(name) for name in (
        "enable-chunked-prefill", "served-model-name", "dtype", "load-format", "block-size",
        "distributed-executor-backend", "rope-scaling", "lora-modules", "limit-mm-per-prompt", "tool-call-parser",
        "gpu-memory-utilization", "pipeline-parallel-size")}
    assert all(s is not None for s in spec.values())
    s = {k: v for k, v in spec.items() if v is not None}
    # StoreBoolean: --enable-chunked-prefill [true|false], no --no- form
    assert (s["enable-chunked-prefill"].type, s["enable-chunked-prefill"].takes_value,
            s["enable-chunked-prefill"].negatable) == ("bool", True, False)
    assert (s["served-model-name"].type, s["served-model-name"].multiple) == ("str", True)
    assert (s["dtype"].type, s["dtype"].choices) == ("choice", ("auto", "half", "float16", "bfloat16", "float",
                                                                 "float32"))
    assert (s["load-format"].type, s["load-format"].choices) == ("str", ())  # choices computed: not literal
    assert (s["block-size"].type, s["block-size"].choices) == ("int", ("8", "16", "32"))
    assert (s["distributed-executor-backend"].type, s["distributed-executor-backend"].choices) == ("choice",
                                                                                                   ("ray", "mp"))
    assert s["rope-scaling"].type == "json"
    assert s["lora-modules"].type == "any"  # a custom argparse action
    assert (s["limit-mm-per-prompt"].type, s["limit-mm-per-prompt"].nullable) == ("str", True)
    assert (s["tool-call-parser"].type, s["tool-call-parser"].choices) == ("str", ())
    assert s["gpu-memory-utilization"].type == "float"
    assert s["pipeline-parallel-size"].aliases == ("-pp",)


def test_static_reader_ignores_positionals_and_reports_syntax_errors() -> None:
    src = 'p.add_argument("model_tag", nargs="?")\np.add_argument("--x", type=int)\n'
    assert [s.name for s in flags_from_source(src, "f.py")] == ["x"]
    with pytest.raises(ConfigError) as info:
        flags_from_source("def broken(:\n", "vllm/engine/arg_utils.py")
    assert info.value.message == "cannot read the vLLM parser source"
    assert str(info.value.location) == "vllm/engine/arg_utils.py:1:12"


# --------------------------------------------------------------------------- the checker: the issue's mistakes


def bi100_like(extra_serving: str = "", extra_profile: str = "", suite: str | None = None) -> str:
    text = MINIMAL.replace(
        "      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}\n",
        "      args:\n        model: /m\n        max-num-seqs: 1\n        gpu-memory-utilization: 0.9\n"
        + extra_serving,
    ).replace("      small: {args: {max-num-seqs: 2}}\n", "      small:\n        args:\n          max-num-seqs: 2\n"
              + extra_profile)
    if suite:
        text += f"    smoke: {{suite: {suite}}}\n"
    return text


def rendered(problems: list) -> list[str]:  # type: ignore[type-arg]
    return [p.render().split("build.yaml", 1)[-1] for p in problems]


def test_issue_mistakes_in_a_manifest_with_lines(write_manifest: Callable[..., Path]) -> None:
    path = write_manifest(bi100_like(
        extra_serving="        max-num-seq: 8\n        gpu-memory-utilization: 1.5\n",
    ).replace("        gpu-memory-utilization: 0.9\n", "", 1).replace("max-num-seqs: 2", 'max-num-seqs: "8"'))
    manifest = load_manifest(path)
    problems = check_serving_args(serving_args_of_target(manifest, "t"), vendor())
    assert rendered(problems) == [
        ":22:9: targets.t.serving.args.max-num-seq: unknown serving flag 'max-num-seq'\n"
        f"  expected: a flag of the vLLM parser source ({STATIC_FILES[0]}, {STATIC_FILES[1]})\n"
        "  found:    'max-num-seq'\n"
        "  hint:     did you mean 'max-num-seqs'?",
        ":23:9: targets.t.serving.args.gpu-memory-utilization: gpu-memory-utilization is out of range\n"
        "  expected: > 0 and <= 1\n"
        "  found:    1.5",
        ":28:11: targets.t.profiles.small.args.max-num-seqs: max-num-seqs takes an integer\n"
        "  expected: an integer\n"
        "  found:    string '8'\n"
        "  hint:     write it without quotes: 8 (imageforge keeps serving values typed, one spelling each)",
    ]


def test_many_is_not_a_count() -> None:
    arg = ServingArg("max-num-seqs", "many", Location("build.yaml", 7, 5), "targets.t.serving.args.max-num-seqs")
    assert [p.render() for p in check_serving_args([arg], vendor())] == [
        "build.yaml:7:5: targets.t.serving.args.max-num-seqs: max-num-seqs takes an integer\n"
        "  expected: an integer\n"
        "  found:    string 'many'"
    ]


def test_underscores_use_dashes() -> None:
    arg = ServingArg("max_num_seqs", 8, Location("build.yaml", 3, 1), "cli:--set max_num_seqs", "cli:--set")
    assert [p.render() for p in check_serving_args([arg], vendor())] == [
        "build.yaml:3:1: cli:--set max_num_seqs: serving flag 'max_num_seqs' is written with underscores\n"
        "  expected: 'max-num-seqs'\n"
        "  found:    'max_num_seqs'\n"
        "  hint:     use dashes: 'max-num-seqs' (imageforge keeps one spelling per flag (vLLM's parser would take"
        " both))"
    ]
    # the dashed flag's own checks still run
    bad = check_serving_args([ServingArg("max_num_seqs", "x")], vendor())
    assert [p.message for p in bad] == ["serving flag 'max_num_seqs' is written with underscores",
                                        "max-num-seqs takes an integer"]


@pytest.mark.parametrize(
    ("key", "value", "message", "expected", "hint"),
    [
        ("dtype", "bfloat", "dtype: value not among its choices",
         "one of 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32'", "did you mean 'float' or 'bfloat16'?"),
        ("enforce-eager", False, "enforce-eager: false cannot be passed", "true, or no such key",
         "this vLLM has no --no-enforce-eager; remove the key to leave it off"),
        ("enable-prefix-caching", "true", "enable-prefix-caching takes a boolean", "true (or no such key)",
         "write it without quotes: true (imageforge keeps serving values typed, one spelling each)"),
        ("max-num-seqs", [1, 2], "max-num-seqs takes one value", "an integer", None),
        ("tp", 4, "serving flag 'tp' is an alias of 'tensor-parallel-size'", "'tensor-parallel-size'",
         "use 'tensor-parallel-size' (imageforge keeps one spelling per flag (vLLM's parser would take both))"),
        ("port", 0, "port is out of range", ">= 1 and <= 65535", None),
        ("tensor-parallel-size", 0, "tensor-parallel-size is out of range", ">= 1", None),
        ("served-model-name", 7, "served-model-name takes text", "text",
         "write it quoted: '7' (imageforge keeps serving values typed, one spelling each)"),
        ("rope-scaling", "{not json", "rope-scaling takes a mapping or JSON text", "a mapping, a list or JSON text",
         "write it as a YAML mapping: imageforge passes it on as JSON"),
        ("block-size", 12, "block-size: value not among its choices", "one of '8', '16', '32'", None),
    ],
)
def test_checker_messages(key: str, value: object, message: str, expected: str, hint: str | None) -> None:
    problems = check_serving_args([ServingArg(key, value)], vendor())
    assert [(p.message, p.expected, p.hint) for p in problems] == [(message, expected, hint)]


def test_good_values_pass() -> None:
    args = [ServingArg(k, v) for k, v in {
        "served-model-name": ["llm", "qwen"], "enable-chunked-prefill": False, "gpu-memory-utilization": 1,
        "rope-scaling": {"type": "yarn", "factor": 4.0}, "host": "0.0.0.0", "tool-call-parser": "qwen3_coder",
        "swap-space": 0, "dtype": "bfloat16", "trust-remote-code": True, "max-model-len": None,
    }.items()]
    assert check_serving_args(args, vendor()) == []


def test_the_repository_bi100_target_against_the_parser_after_the_baseline() -> None:
    manifest = load_manifest(REPO / "build.yaml")
    args = serving_args_of_target(manifest, "bi100")
    assert check_serving_args(args, baseline(), run_port=run_port_of(manifest, "bi100")) == []
    before = check_serving_args(args, vendor())
    assert [(p.message, p.key_path) for p in before] == [
        ("unknown serving flag 'reasoning-parser'", "targets.bi100.serving.args.reasoning-parser")
    ]


# --------------------------------------------------------------------------- conflicts the manifest can see


def test_port_conflicts_with_run_port(write_manifest: Callable[..., Path]) -> None:
    text = bi100_like(extra_serving="        port: 8001\n").replace(
        "    steps:\n", "    run: {port: 8000}\n    steps:\n", 1)
    manifest = load_manifest(write_manifest(text))
    problems = check_serving_args(serving_args_of_target(manifest, "t"), vendor(), run_port=run_port_of(manifest, "t"))
    assert rendered(problems) == [
        ":24:9: targets.t.serving.args.port: serving port differs from run.port\n"
        "  expected: 8000, the run.port (line 7) imageforge publishes, or no serving port\n"
        "  found:    8001\n"
        "  hint:     vLLM would listen where nobody connects: set the port once, in run.port"
    ]
    same = load_manifest(write_manifest(text.replace("port: 8001", "port: 8000")))
    assert check_serving_args(serving_args_of_target(same, "t"), vendor(), run_port=run_port_of(same, "t")) == []


def test_served_model_name_against_the_suite(write_manifest: Callable[..., Path], tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "version: 1\nname: s\nvars:\n  served_model_name: llm\nchecks:\n"
        "  - id: a\n    request: {endpoint: /v1/completions, body: {model: llm, prompt: x}}\n"
        "  - id: b\n    request: {endpoint: /v1/completions, body: {model: \"${model}\", prompt: x}}\n"
        "  - id: c\n    request: {endpoint: /v1/completions, body: {model: nope, prompt: x}}\n"
        "    expect: {status: 404}\n"
    )
    calls = suite_models(load_yaml(suite, what="smoke suite"))
    assert [(c.value, c.key_path, str(c.location)) for c in calls] == [
        ("llm", "suite.yaml: vars.served_model_name", f"{suite}:4:3"),
        ("llm", "suite.yaml: checks[0].request.body.model", f"{suite}:7:49"),
    ]
    manifest = load_manifest(write_manifest(bi100_like(extra_serving="        served-model-name: qwen\n")))
    problems = check_serving_args(serving_args_of_target(manifest, "t"), vendor(), suite=calls)
    assert [(p.message, p.key_path, p.expected, p.found) for p in problems] == [
        ("the smoke suite calls a model this server does not serve", "targets.t.serving.args.served-model-name",
         "'qwen'", f"'llm' (suite.yaml: vars.served_model_name at {suite}:4:3)"),
        ("the smoke suite calls a model this server does not serve", "targets.t.serving.args.served-model-name",
         "'qwen'", f"'llm' (suite.yaml: checks[0].request.body.model at {suite}:7:49)"),
    ]
    agreeing = load_manifest(write_manifest(bi100_like(extra_serving="        served-model-name: [llm, q]\n")))
    assert check_serving_args(serving_args_of_target(agreeing, "t"), vendor(), suite=calls) == []


def test_the_repository_suites_name_no_literal_model() -> None:
    for name in ("dummy.yaml", "real-weights.yaml"):
        assert suite_models(load_yaml(REPO / "smoke" / name, what="smoke suite")) == []


# --------------------------------------------------------------------------- positions of resolved values


def test_resolved_values_point_at_the_line_that_decided_them(write_manifest: Callable[..., Path]) -> None:
    manifest = load_manifest(write_manifest(bi100_like()))
    r = resolve(manifest, "t", "big", environ={"IMAGEFORGE_SET": "max-num-seqs=3"})
    by_key = {a.key: a for a in serving_args_of_resolved(r)}
    assert (by_key["model"].key_path, by_key["model"].location.line if by_key["model"].location else None) == (
        "targets.t.serving.args.model", 20)
    gmu = by_key["gpu-memory-utilization"]
    assert (gmu.key_path, gmu.source, gmu.location.line if gmu.location else None) == (
        "targets.t.profiles.big.args.gpu-memory-utilization", "profile:big", 28)
    seqs = by_key["max-num-seqs"]
    assert (seqs.key_path, seqs.location, seqs.value) == ("env:IMAGEFORGE_SET max-num-seqs", None, 3)


# --------------------------------------------------------------------------- introspection output


def test_parse_introspection() -> None:
    line = "IMAGEFORGE-FLAGS " + json.dumps({"format": 1, "vllm": "9.9", "module": "m", "flags": [
        {"name": "max-num-seqs", "type": "int", "choices": [], "bounds": {"ge": 1}, "negatable": False,
         "takes_value": True, "multiple": False, "nullable": False, "also": [], "aliases": []},
        {"name": "gpu-memory-utilization", "type": "float", "bounds": {"gt": 0, "le": 1},
         "aliases": ["--device-memory-utilization"]},
        {"name": "enforce-eager", "type": "bool", "negatable": True, "takes_value": False},
        {"name": "odd", "type": "closure?"},
    ]})
    table = parse_introspection("WARNING something\n" + line + "\nINFO bye\n")
    assert table.source == "vLLM 9.9's parser (4 flags)"
    assert table.get("max-num-seqs") == FlagSpec("max-num-seqs", "int", range=Range(1), origin="vLLM 9.9's parser")
    gmu = table.get("gpu-memory-utilization")
    assert gmu is not None and gmu.range == Range(0, 1, min_exclusive=True)
    assert gmu.range.text() == "> 0 and <= 1" and not gmu.range.contains(0) and gmu.range.contains(1)
    assert table.get("odd") is not None and table.get("odd").type == "any"  # type: ignore[union-attr]
    assert check_serving_args([ServingArg("enforce-eager", False)], table) == []  # --no-enforce-eager exists
    assert [p.message for p in check_serving_args([ServingArg("device-memory-utilization", 0.5)], table)] == [
        "serving flag 'device-memory-utilization' is an alias of 'gpu-memory-utilization'"]


def test_parse_introspection_without_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_introspection("Traceback (most recent call last):\nImportError: no vllm\n")
    assert info.value.message == "the image's vLLM did not list its flags"
    assert info.value.found == "Traceback (most recent call last): | ImportError: no vllm"
