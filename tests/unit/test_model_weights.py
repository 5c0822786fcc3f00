"""images/cpu/make_model.py weights: the Philox4x64-10 stream, the value formula, the safetensors file.

Expected values come from the Random123 known-answer vectors (kat_vectors of the reference
implementation) and from a pure-Python Philox4x64-10 written here from the paper's definition, never
from make_model itself.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import math
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "cpu" / "make_model.py"
MASK = 2**64 - 1


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_model_weights_under_test", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mm = _load()


def philox4x64(counter: list[int], key: list[int], rounds: int = 10) -> list[int]:
    """Philox4x64-R (Salmon et al. 2011): 4 words of counter, 2 of key."""
    m0, m1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157
    w0, w1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B
    x = list(counter)
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + w0) & MASK, (k1 + w1) & MASK
        p0, p1 = m0 * x[0], m1 * x[2]
        x = [(p1 >> 64) ^ x[1] ^ k0, p1 & MASK, (p0 >> 64) ^ x[3] ^ k1, p0 & MASK]
    return x


def stream(key: tuple[int, int], blocks: int) -> list[int]:
    """Blocks at counters 1..blocks (the counter as one 256-bit little-endian integer)."""
    out: list[int] = []
    for c in range(1, blocks + 1):
        out += philox4x64([c & MASK, (c >> 64) & MASK, 0, 0], list(key))
    return out


# Random123 kat_vectors, philox4x64 10: counter (4 words), key (2 words) -> 4 words.
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B]),
    ([MASK] * 4, [MASK] * 2, [0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0]),
    ([0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89],
     [0x452821E638D01377, 0xBE5466CF34E90C6C],
     [0xA528F45403E61D95, 0x38C72DBD566E9788, 0xA5A1610E72FD18B5, 0x57BD43B5E52B7FE6]),
]


@pytest.mark.parametrize(("counter", "key", "want"), KAT)
def test_reference_philox_matches_random123(counter: list[int], key: list[int], want: list[int]) -> None:
    assert philox4x64(counter, key) == want


def test_numpy_philox_is_the_reference_stream() -> None:
    for key in [(0, 0), (mm.SEED, 12345), mm.tensor_key("lm_head.weight"), (MASK, MASK)]:
        got = [int(w) for w in mm.philox_words(key, 4 * 70 + 3)]
        assert got == stream(key, 71)[: 4 * 70 + 3]


def test_tensor_key_is_seed_and_name_hash() -> None:
    name = "model.layers.1.mlp.experts.7.down_proj.weight"
    assert mm.tensor_key(name) == (mm.SEED, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))


def test_weight_values_exact_formula() -> None:
    words = [*stream((mm.SEED, 99), 8), 0, MASK, 1 << 63]
    got = mm.weight_values(np.array(words, dtype=np.uint64), 0.3)
    assert got.dtype == np.float32
    scale = math.sqrt(3.0) * 0.3
    for word, value in zip(words, got.tolist(), strict=True):
        u = word >> 40
        exact = Fraction(2 * u + 1 - 2**24, 2**24)
        assert float(np.float32(float(exact) * scale)) == value
        assert abs(value) < scale
    assert got[-3] == np.float32((1 - 2**24) / 2**24 * scale) and got[-2] == -got[-3]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = Path(mm.write_model(tmp_path_factory.mktemp("weights") / "tiny"))
    config = json.loads((out / "config.json").read_text())
    return config, safetensors_numpy.load_file(str(out / "model.safetensors"))


def test_every_qwen3_moe_weight_with_its_shape(model: tuple[dict[str, Any], dict[str, Any]]) -> None:
    config, tensors = model
    v, h = int(config["vocab_size"]), 64
    assert tensors["model.embed_tokens.weight"].shape == (v, h)
    assert tensors["lm_head.weight"].shape == (v, h)
    want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(2):
        p = f"model.layers.{layer}"
        want |= {f"{p}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "mlp.gate",
                                              "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm")}
        want |= {f"{p}.mlp.experts.{e}.{n}.weight" for e in range(8) for n in ("gate_proj", "up_proj", "down_proj")}
        assert tensors[f"{p}.self_attn.q_proj.weight"].shape == (4 * 64, 64)
        assert tensors[f"{p}.self_attn.k_proj.weight"].shape == (2 * 64, 64)
        assert tensors[f"{p}.self_attn.o_proj.weight"].shape == (64, 4 * 64)
        assert tensors[f"{p}.mlp.gate.weight"].shape == (8, 64)
        assert tensors[f"{p}.mlp.experts.3.gate_proj.weight"].shape == (32, 64)
        assert tensors[f"{p}.mlp.experts.3.down_proj.weight"].shape == (64, 32)
    assert set(tensors) == want


def test_values_come_from_the_stream(model: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, tensors = model
    scale = math.sqrt(3.0) * 0.3
    for name, arr in tensors.items():
        a = np.asarray(arr)
        assert a.dtype == np.float32
        if name.endswith("norm.weight"):
            assert (a == 1).all(), name
            continue
        key = (mm.SEED, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))
        first = stream(key, 1)
        want = [float(np.float32(float(Fraction(2 * (w >> 40) + 1 - 2**24, 2**24)) * scale)) for w in first]
        assert a.reshape(-1)[:4].tolist() == want, name
        assert abs(float(a.std()) - 0.3) < 0.03 and float(np.abs(a).max()) < scale, name


def test_distinct_tensors_differ(model: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, tensors = model
    a = np.asarray(tensors["model.layers.0.mlp.experts.0.gate_proj.weight"])
    b = np.asarray(tensors["model.layers.0.mlp.experts.1.gate_proj.weight"])
    c = np.asarray(tensors["model.layers.1.mlp.experts.0.gate_proj.weight"])
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_digest_covers_the_weight_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge import base

    recipe = ROOT / "images" / "cpu"
    before = base.model_digest(recipe)
    real = importlib.metadata.version
    for lib in ("numpy", "safetensors", "tokenizers"):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, lib=lib: "0.0" if name == lib else real(name))
        assert base.model_digest(recipe) != before, lib
    monkeypatch.setattr(importlib.metadata, "version", real)
    assert base.model_digest(recipe) == before
