"""The serving command (imageforge.serve.command): flags as argv, the command fitted to an image's ENTRYPOINT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve.command import (
    base_command,
    cli_args,
    fit_command,
    flag_argv,
    flag_pairs,
    image_command,
    serving_argv,
    serving_command,
)

REPO = Path(__file__).resolve().parents[2]


def test_fit_command() -> None:
    cmd = ["vllm", "serve"]
    assert fit_command(None, cmd, "/c.yaml") == ["vllm", "serve", "--config", "/c.yaml"]
    assert fit_command(["vllm"], cmd, "/c.yaml") == ["serve", "--config", "/c.yaml"]
    assert fit_command(["/usr/local/bin/vllm"], cmd, "/c.yaml") == ["serve", "--config", "/c.yaml"]
    assert fit_command(["/bin/bash", "-c"], cmd, "/c.yaml") == ["vllm serve --config /c.yaml"]
    assert fit_command(["/entrypoint.sh"], cmd, "/c.yaml") == ["vllm", "serve", "--config", "/c.yaml"]


def test_cli_args_model_first_then_flags() -> None:
    args = {"max-num-seqs": 8, "model": "/models/m", "enforce-eager": True, "enable-log": False,
            "structured-outputs-config": {"backend": "xgrammar"}, "served-model-name": ["a", "b"], "skip": None}
    assert cli_args(args) == ["/models/m", "--max-num-seqs", "8", "--enforce-eager", "--no-enable-log",
                              "--structured-outputs-config", '{"backend":"xgrammar"}',
                              "--served-model-name", "a", "b"]


def test_base_command_fits_the_entrypoint(cpu: Resolved) -> None:
    argv = base_command(cpu, None)
    assert argv[:3] == ["vllm", "serve", "/models/tiny-qwen3-moe"]
    assert "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "8"
    assert base_command(cpu, ["/opt/venv/bin/vllm"])[:2] == ["serve", "/models/tiny-qwen3-moe"]


def test_base_command_under_a_shell_entrypoint_is_one_string(write_manifest: Any) -> None:
    """A base whose ENTRYPOINT is ``sh -c`` runs its CMD as one command line (as a build's CMD does)."""
    resolved = resolve(load_manifest(write_manifest()), "t", "big", environ={})
    assert base_command(resolved, ["/bin/sh", "-c"]) == [
        "vllm serve /m --max-num-seqs 64 --gpu-memory-utilization 0.95 --enforce-eager"]
    assert base_command(resolved, ["bash", "-c"]) == [
        "vllm serve /m --max-num-seqs 64 --gpu-memory-utilization 0.95 --enforce-eager"]
    assert base_command(resolved, ["/entrypoint.sh"]) == [
        "vllm", "serve", "/m", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.95", "--enforce-eager"]


def test_flag_pairs_reads_back_what_flag_argv_wrote() -> None:
    argv = flag_argv({"max-num-seqs": 8, "enforce-eager": True, "enable-log": False, "tp": 4},
                     flag_names={"tp": "-tp"})
    assert argv == ["--max-num-seqs", "8", "--enforce-eager", "--no-enable-log", "-tp", "4"]
    assert flag_pairs(argv) == [("--max-num-seqs", "8"), ("--enforce-eager", None), ("--no-enable-log", None),
                                ("-tp", "4")]
    assert flag_pairs(["python3", "-m", "server", "--model", "/model"]) == [("-m", "server"), ("--model", "/model")]


def test_serving_command_style_config_names_the_file(cpu: Resolved) -> None:
    path = cpu.target.serving.config_path
    assert serving_command(cpu) == [*cpu.target.serving.command, "--config", path]
    assert serving_command(cpu, "/run/dir/serving.yaml")[-2:] == ["--config", "/run/dir/serving.yaml"]
    # the built image's CMD is that command fitted to the base's ENTRYPOINT
    assert image_command(cpu, ()) == serving_command(cpu)
    assert image_command(cpu, ("/opt/venv/bin/vllm",)) == serving_command(cpu)[1:]


@pytest.mark.parametrize("bi100", ["baseline"], indirect=True)
def test_serving_command_style_argv_is_every_flag(bi100: Resolved) -> None:
    assert bi100.target.serving.style == "argv"
    assert serving_command(bi100) == serving_argv(bi100) == serving_command(bi100, "/ignored.yaml")
    assert image_command(bi100, ("/bin/sh", "-c")) == [" ".join(serving_argv(bi100))]
