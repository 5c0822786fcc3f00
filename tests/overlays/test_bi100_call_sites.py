"""The bi100 call-site patches: each patched function of the baseline fixture calls its
overlay module and gives the same numbers as the code it replaces.

The patches are read from build.yaml and applied to the fake baseline files in tests/fixtures/ (written
from the facts note); the patched and the original function are compiled from those texts and run here
with torch, the overlay module standing in for its in-image path behind a spy.
"""

from __future__ import annotations

import ast
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from imageforge.manifest.load import load_manifest
from imageforge.patches.anchored import apply_patch
from imageforge.patches.from_text import apply_steps
from imageforge.steps import PatchSpec

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "tests" / "fixtures" / "bi100-baseline" / "qwen3_6_scripts"
#: The typing names the (Python 3.10-style) fixture files use in annotations.
TYPING = {name: getattr(typing, name) for name in ("Any", "Dict", "List", "Literal", "Optional", "Tuple", "Union")}


def patch_of(step_id: str) -> dict[str, Any]:
    target = load_manifest(REPO / "build.yaml").target("bi100")
    step = next(s for s in target.steps if s.id == step_id)
    spec = PatchSpec.of(step)
    return {"id": step.id, "old": spec.old, "new": spec.new}


def texts(file: str, step_id: str) -> tuple[str, str]:
    original = (BASELINE / file).read_text()
    return original, apply_steps(original, [patch_of(step_id)])


def compile_class(source: str, name: str, namespace: dict[str, Any]) -> Any:
    """Class ``name`` of ``source`` (the file's imports are not run: ``namespace`` provides the names)."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    # dont_inherit: this file's `from __future__ import annotations` must not reach the fixture code
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"<{name}>", "exec", dont_inherit=True), namespace)
    return namespace[name]


class Spy:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def in_image(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str, str], Spy]]:
    """Put overlay module FILE at its in-image module name, with a spy on one function."""

    def install(module: str, overlay: str, function: str) -> Spy:
        import importlib

        mod = importlib.import_module(overlay)
        fake = types.ModuleType(module)
        fake.__dict__.update(mod.__dict__)
        spy = Spy(getattr(mod, function))
        setattr(fake, function, spy)
        monkeypatch.setitem(sys.modules, module, fake)
        return spy

    yield install


# --------------------------------------------------------------------------- sorted_moe in qwen3_5.py


def moe_inputs(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(tokens)
    experts, hidden, inter, top_k = 16, 64, 32, 4
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return x, w13, w2, weights / weights.sum(-1, keepdim=True), ids


MOE_NAMES: dict[str, Any] = {**TYPING, "torch": torch, "F": F, "nn": torch.nn,
                             "get_tensor_model_parallel_world_size": lambda: 1, "ReplicatedLinear": None,
                             "tensor_model_parallel_all_reduce": None}


def experts_of(source: str) -> Callable[..., torch.Tensor]:
    """``_pure_pytorch_experts`` of the fixture's block, bound to an object holding ``experts.w13_weight/w2_weight``."""
    block = compile_class(source, "Qwen3_5SparseMoeBlock", dict(MOE_NAMES))

    def call(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
             ids: torch.Tensor) -> torch.Tensor:
        owner = types.SimpleNamespace(experts=types.SimpleNamespace(w13_weight=w13, w2_weight=w2))
        return typing.cast(torch.Tensor, block._pure_pytorch_experts(owner, x, weights, ids))

    return call


def test_sorted_moe_anchor_is_the_real_indentation() -> None:
    """The baseline loop sits 12 spaces deep in the `else:`, after `out = torch.zeros_like(hidden_states)`."""
    original, patched = texts("qwen3_5.py", "sorted-moe-call")
    lines = original.splitlines()
    at = lines.index("            unique_eids = topk_ids.view(-1).unique().tolist()")
    assert lines[at - 1] == "            out = torch.zeros_like(hidden_states)"
    assert lines[at - 2] == "        else:"
    assert "        return out  # partial, all-reduce done in forward()" in lines
    ast.parse(patched)  # the patched file compiles (it broke with the old 8-space anchor)
    assert apply_patch(patched, patch_of("sorted-moe-call")["old"],
                       patch_of("sorted-moe-call")["new"]).status == "already-applied"


@pytest.mark.parametrize(("tokens", "dtype", "tol"), [(64, torch.float32, 1e-5), (300, torch.bfloat16, 2e-2)])
def test_sorted_moe_call_site_replaces_the_expert_loop(in_image: Any, tokens: int, dtype: torch.dtype,
                                                        tol: float) -> None:
    original, patched = texts("qwen3_5.py", "sorted-moe-call")
    spy = in_image("vllm.model_executor.layers.fused_moe.sorted_moe", "sorted_moe", "fused_experts")
    before, after = experts_of(original), experts_of(patched)
    args = moe_inputs(tokens, dtype)
    want = before(*args)
    assert spy.calls == 0
    got = after(*args)
    assert spy.calls == 1, "the patched T > 1 path calls sorted_moe.fused_experts"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_sorted_moe_call_site_leaves_decode_alone(in_image: Any) -> None:
    original, patched = texts("qwen3_5.py", "sorted-moe-call")
    spy = in_image("vllm.model_executor.layers.fused_moe.sorted_moe", "sorted_moe", "fused_experts")
    before, after = experts_of(original), experts_of(patched)
    args = moe_inputs(1, torch.float32)
    torch.testing.assert_close(after(*args), before(*args), rtol=0, atol=0)
    assert spy.calls == 0, "T == 1 keeps the baseline's gathered-weights path"
    assert "if T == 1:" in patched and patched.index("if T == 1:") < patched.index("_imageforge_sorted_moe")


# --------------------------------------------------------------------------- prefix_attention in paged_attn.py


def prefix_inputs(ctx_lens: list[int], new_lens: list[int], *, heads: int = 8, kv_heads: int = 2,
                  head_size: int = 32, block_size: int = 16) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(sum(ctx_lens) + 7 * sum(new_lens))
    x = 16 // 4  # float32: 4 elements of 4 bytes per 16-byte vector
    blocks_per_seq = [(c + block_size - 1) // block_size for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)  # blocks scattered through the cache
    table = torch.zeros(len(ctx_lens), max([*blocks_per_seq, 1]), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = perm[used:used + n]
        used += n
    total = sum(new_lens)
    starts = torch.tensor([0, *torch.cumsum(torch.tensor(new_lens), 0).tolist()], dtype=torch.int32)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    return {
        "query": torch.randn(total, heads, head_size, generator=gen),
        "key": torch.randn(total, kv_heads, head_size, generator=gen),
        "value": torch.randn(total, kv_heads, head_size, generator=gen),
        "kv_cache_dtype": "auto",
        "key_cache": torch.randn(num_blocks, kv_heads, head_size // x, block_size, x, generator=gen),
        "value_cache": torch.randn(num_blocks, kv_heads, head_size, block_size, generator=gen),
        "block_tables": table,
        "query_start_loc": starts,
        "seq_lens_tensor": ctx + torch.tensor(new_lens, dtype=torch.int32),
        "context_lens": ctx,
        "max_query_len": max(new_lens),
        "alibi_slopes": None,
        "sliding_window": None,
        "k_scale": 1.0,
        "v_scale": 1.0,
    }


@pytest.mark.parametrize(("ctx_lens", "new_lens"), [([40], [700]), ([0, 100, 33], [5, 530, 64])])
def test_prefix_attention_call_site_replaces_the_pytorch_prefix_path(in_image: Any, ctx_lens: list[int],
                                                                      new_lens: list[int]) -> None:
    original, patched = texts("paged_attn.py", "prefix-attention-call")
    spy = in_image("vllm.attention.ops.prefix_attention_pytorch", "prefix_attention", "forward_prefix")
    names = {**TYPING, "torch": torch, "ops": None, "_PARTITION_SIZE": 512}
    before = compile_class(original, "PagedAttention", dict(names))
    after = compile_class(patched, "PagedAttention", dict(names))
    inputs = prefix_inputs(ctx_lens, new_lens)
    want = before.forward_prefix(**inputs)
    assert spy.calls == 0
    got = after.forward_prefix(**inputs)
    assert spy.calls == 1, "the patched forward_prefix calls prefix_attention.forward_prefix"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert "_PYTORCH_DECODE_THRESHOLD = 32768" in patched, "the decode threshold stays"


# --------------------------------------------------------------------------- protocol.py


def request_model(text: str) -> Any:
    import pydantic

    names: dict[str, Any] = {**TYPING, "BaseModel": pydantic.BaseModel, "ConfigDict": pydantic.ConfigDict,
                             "Field": pydantic.Field, "model_validator": pydantic.model_validator}
    for name in ("OpenAIBaseModel", "StreamOptions", "ChatCompletionRequest"):
        compile_class(text, name, names)
    return names["ChatCompletionRequest"]


def test_protocol_accepts_max_completion_tokens_and_reasoning_effort() -> None:
    import pydantic

    original, patched = texts("protocol.py", "protocol-openai-fields")
    body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}]}
    before, after = request_model(original), request_model(patched)
    for extra in ({"max_completion_tokens": 64}, {"reasoning_effort": "low"}):
        with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
            before(**body, **extra)
    assert after(**body, max_completion_tokens=64).max_tokens == 64
    assert after(**body, max_completion_tokens=64, max_tokens=10).max_tokens == 10, "an explicit max_tokens wins"
    assert after(**body, reasoning_effort="high").reasoning_effort == "high"
    assert after(**body).max_tokens is None
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        after(**body, not_an_openai_field=1)
    with pytest.raises(pydantic.ValidationError, match="Stream options"):
        after(**body, stream_options={"include_usage": True}), "the baseline's own validator still runs"


# --------------------------------------------------------------------------- every bi100 patch: once, and working code

VENDOR_SITE = REPO / "tests" / "fixtures" / "bi100-vendor" / "usr" / "local" / "corex" / "lib64" / "python3" / \
    "dist-packages"
AFTER_BASELINE = {  # where patch_ops.sh puts the baseline files (tests/fixtures/bi100-baseline/.../patch_ops.sh)
    "vllm/attention/ops/paged_attn.py": BASELINE / "paged_attn.py",
    "vllm/model_executor/models/qwen3_5.py": BASELINE / "qwen3_5.py",
    "vllm/entrypoints/openai/protocol.py": BASELINE / "protocol.py",
}


def test_every_bi100_patch_applies_once_and_leaves_python_310_code_with_bound_names() -> None:
    from imageforge.patches.pycheck import check_python

    target = load_manifest(REPO / "build.yaml").target("bi100")
    for step in (s for s in target.steps if s.kind == "patch"):
        spec = PatchSpec.of(step)
        file = spec.file
        source = AFTER_BASELINE.get(file, VENDOR_SITE / file)
        text = source.read_text()
        first = apply_patch(text, spec.old, spec.new)
        assert first.status == "applies" and first.result is not None, (step.id, first.status)
        assert check_python(first.result, file, python_version="3.10.12", lines=first.new_lines) is None, step.id
        assert apply_patch(first.result, spec.old, spec.new).status == "already-applied", step.id
