"""Run INSIDE a container of the cpu base image: exercise CPUUnquantizedExperts' real methods with spies.

    python cpu_moe_probe.py [--x86-without-amx]        (prints one JSON object)

The container holds vLLM's cpu_moe.py as the test put it there (patched by the manifest's steps, or the
stock file) and the sorted_moe overlay at its destination. The probe replaces ``sorted_moe.fused_experts``,
``cpu_moe.cpu_fused_moe`` and ``cpu_moe.cpu_prepack_moe_weight`` by spies that record each call and call
the real function, runs ``process_weights_after_loading`` then ``apply`` of both the portable
(``CPUUnquantizedExperts``, float32) and the AMX class (``X86CPUUnquantizedExperts``, bf16: when this CPU
has AMX, or with ``--x86-without-amx``, which only the patched file survives: its path never reaches the
AMX kernels) on seeded tensors, and reports the calls and the error against a float64 per-(token, slot) loop
written here. The test decides what passes.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import sorted_moe
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.experts import cpu_moe

CALLS: dict[str, int] = {"sorted_moe.fused_experts": 0, "cpu_fused_moe": 0, "cpu_prepack_moe_weight": 0}


def _spy(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        return fn(*args, **kwargs)

    return wrapper


REAL_SORTED = sorted_moe.fused_experts
sorted_moe.fused_experts = _spy("sorted_moe.fused_experts", sorted_moe.fused_experts)
cpu_moe.cpu_fused_moe = _spy("cpu_fused_moe", cpu_moe.cpu_fused_moe)
cpu_moe.cpu_prepack_moe_weight = _spy("cpu_prepack_moe_weight", cpu_moe.cpu_prepack_moe_weight)


def reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
              *, weighted: bool) -> torch.Tensor:
    """sum_k w[t,k] * W2[e] (silu(W_gate[e] x) * W_up[e] x), float64, one (token, slot) at a time."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            xt = x[t].double()
            gate = w13[e, :inter].double() @ xt
            up = w13[e, inter:].double() @ xt
            y = w2[e].double() @ (torch.nn.functional.silu(gate) * up)
            out[t] += (float(weights[t, k]) if weighted else 1.0) * y
    return out


def run(cls: type, dtype: torch.dtype, *, top_k: int, on_input: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1234 + top_k)
    tokens, hidden, inter, experts = 13, 64, 32, 8
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.3).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 0.3).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    plain_w13, plain_w2 = w13.clone(), w2.clone()

    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(w13, requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2, requires_grad=False)
    experts_obj: Any = object.__new__(cls)  # the real methods, without FusedMoEConfig plumbing
    experts_obj.moe_config = SimpleNamespace(activation=MoEActivation.SILU, intermediate_size_per_partition=inter)
    experts_obj.quant_config = SimpleNamespace(w1_bias=None, w2_bias=None)
    experts_obj._use_zentorch = False
    before = dict(CALLS)
    experts_obj.process_weights_after_loading(layer)
    packed = {"w13_unchanged": bool(torch.equal(layer.w13_weight.data, plain_w13)),
              "w2_unchanged": bool(torch.equal(layer.w2_weight.data, plain_w2)),
              "w13_shape": list(layer.w13_weight.shape)}

    # prepare() scales the input rows when apply_router_weight_on_input (top-1 only); do as it does.
    hidden_states = (x.float() * weights.float()).to(dtype) if on_input else x
    output = torch.full((tokens, hidden), float("nan"), dtype=dtype)
    experts_obj.apply(output, hidden_states, layer.w13_weight, layer.w2_weight, weights, ids, MoEActivation.SILU,
                      experts, None, None, None, torch.empty(0), torch.empty(0), None, on_input)
    want = reference(hidden_states, plain_w13, plain_w2, weights, ids, weighted=not on_input)
    err = (output.double() - want).abs()
    # what sorted_moe makes of the weights as process_weights_after_loading left them (packed: garbage)
    on_layer = REAL_SORTED(hidden_states, layer.w13_weight.data, layer.w2_weight.data,
                           torch.ones_like(weights) if on_input else weights, ids)
    packed["sorted_on_layer_weights_err"] = float((on_layer.double() - want).abs().max())
    return {
        "class": cls.__name__, "dtype": str(dtype), "top_k": top_k, "apply_router_weight_on_input": on_input,
        "calls": {k: CALLS[k] - before[k] for k in CALLS}, **packed,
        "max_abs_err": float(err.max()), "ref_max_abs": float(want.abs().max()),
        "finite": bool(torch.isfinite(output).all()),
    }


def main() -> int:
    cases = [run(cpu_moe.CPUUnquantizedExperts, torch.float32, top_k=2, on_input=False),
             run(cpu_moe.CPUUnquantizedExperts, torch.float32, top_k=1, on_input=True)]
    amx = bool(torch.cpu._is_amx_tile_supported())
    if amx or "--x86-without-amx" in sys.argv[1:]:
        cases.append(run(cpu_moe.X86CPUUnquantizedExperts, torch.bfloat16, top_k=2, on_input=False))
    print(json.dumps({"amx": amx, "cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
