"""images/cpu/make_model.py: deterministic bytes, single-token specials, a working chat template."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "cpu" / "make_model.py"
CPU_ATTENTION_HEAD_DIMS = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}

tokenizers = pytest.importorskip("tokenizers")
jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_model_under_test", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mm = _load()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(mm.write_model(tmp_path_factory.mktemp("model") / "tiny"))


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_script_same_bytes(model_dir: Path, tmp_path: Path) -> None:
    again = mm.write_model(tmp_path / "again")
    assert _files(model_dir) == _files(again)
    # a fresh interpreter too (no state shared through the module)
    third = tmp_path / "third"
    subprocess.run([sys.executable, str(SCRIPT), str(third)], check=True, capture_output=True)
    assert _files(third) == _files(model_dir)


def test_files_present(model_dir: Path) -> None:
    names = set(_files(model_dir))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
            "model.safetensors"} <= names
    assert not any(n.endswith(".bin") for n in names)


def test_special_tokens_are_single_tokens(model_dir: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for content, _special in mm.ADDED_TOKENS:
        enc = tok.encode(f"a {content} b", add_special_tokens=False)
        assert content in enc.tokens, (content, enc.tokens)
        assert tok.encode(content, add_special_tokens=False).ids == [tok.token_to_id(content)]
    # Qwen3's split: chat markers special, think/tool markers plain added tokens
    decoder = json.loads((model_dir / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    special = {v["content"]: v["special"] for v in decoder.values()}
    assert special["<|im_start|>"] and special["<|im_end|>"] and special["<|endoftext|>"]
    assert not special["<think>"] and not special["</tool_call>"]


def test_byte_level_round_trip(model_dir: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = 'Héllo wörld! {"name": "get_weather", "arguments": {"x": 1}}\n\n  tabs\tand ✓ 日本'
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_config_matches_tokenizer_and_cpu_attention(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    assert cfg["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    assert cfg["head_dim"] in CPU_ATTENTION_HEAD_DIMS and cfg["head_dim"] != 16
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (64, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (8, 2, 32)
    assert cfg["eos_token_id"] == tok.token_to_id("<|im_end|>")
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert tok.token_to_id("<|im_end|>") in gen["eos_token_id"]


def _render(model_dir: Path, messages: list[dict[str, Any]], **kw: Any) -> str:
    """Render like transformers does (sandboxed jinja2, trim_blocks/lstrip_blocks, tojson)."""
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(cfg["chat_template"]).render(messages=messages, **kw)


def test_chat_template_plain(model_dir: Path) -> None:
    out = _render(
        model_dir,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
    )
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_enable_thinking(model_dir: Path) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    off = _render(model_dir, msgs, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = _render(model_dir, msgs, add_generation_prompt=True, enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n")


def test_chat_template_tools_hermes(model_dir: Path) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"c": "P"}}}],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "warm"},
    ]
    out = _render(model_dir, msgs, tools=tools, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nSys.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"c": "P"}}\n</tool_call><|im_end|>' in out
    # consecutive tool results share one user turn
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>" in out
    assert out.endswith("<|im_start|>assistant\n")


def test_chat_template_reasoning_content(model_dir: Path) -> None:
    msgs = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"},
    ]
    out = _render(model_dir, msgs)
    assert out.endswith("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nA<|im_end|>\n")


def test_chat_template_tokenizes_markers_as_single_tokens(model_dir: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    out = _render(model_dir, [{"role": "user", "content": "Hi"}], add_generation_prompt=True, enable_thinking=False)
    tokens = tok.encode(out, add_special_tokens=False).tokens
    for marker in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert marker in tokens


def test_script_usage(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert bad.returncode == 2 and "OUT_DIR" in bad.stderr
    ok = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "m")], capture_output=True, text=True)
    assert ok.returncode == 0 and (tmp_path / "m" / "config.json").is_file()


def test_merges_deterministic_tie_break() -> None:
    assert mm.compute_merges("x ab ab cd cd", 4) == mm.compute_merges("x cd cd ab ab", 4)
