"""Sorted-expert MoE forward (SwiGLU experts) in plain PyTorch, with a grouped-GEMM path.

Replaces, in the BI-V100 image, the PyTorch expert loop behind
``vllm.model_executor.layers.fused_moe.fused_moe.fused_experts`` (the baseline's
``for eid in unique_eids: tokens = hidden_states[tok_ids]; F.linear(tokens, w13[eid]) ...``), and keeps
``fused_experts``' argument names. Qwen3.6-35B-A3B: 256 experts, top-8, hidden 2048, intermediate 512
(128 per rank at tensor-parallel 4).

Algorithm:

1. flatten the ``T*K`` (token, expert) pairs and sort them by expert (stable), so each expert's rows of
   the gathered input are one contiguous slice (offsets from ``searchsorted``, no host sync);
2. gate/up projection per expert slice, then ONE ``silu(gate) * up`` over all pairs;
3. down projection per expert slice;
4. routing weights applied per pair, ONE ``index_add_`` scatters the pairs back onto their tokens
   (accumulated in fp32, cast to the input dtype at the end).

Steps 2 and 3 run either as one ``torch._grouped_mm`` call per projection over all experts (``grouped``:
one launch each, where the running torch and device support it) or as a Python loop of ``torch.mm``
over the non-empty experts (``loop``: one host sync for the offsets, one launch per active expert).
Support is found by feature detection: a tiny ``_grouped_mm`` call checked against a plain matmul, run
at import for the CPU dtypes and on first use for any other device (probing CUDA at import would
initialise it before vLLM forks its workers); results are cached per (device, dtype).
``impl="auto"`` takes ``grouped`` when supported and the strides are 16-byte aligned, else ``loop``.

Expected layouts (vLLM's fused MoE):

* ``hidden_states``: ``[T, H]``
* ``w1`` (w13): ``[E, 2*I, H]``, rows ``[:I]`` the gate projection, rows ``[I:]`` the up projection
* ``w2``: ``[E, H, I]``
* ``topk_weights``: ``[T, K]`` (float), ``topk_ids``: ``[T, K]`` (int), global expert ids
* ``expert_map`` (expert parallelism): ``[global_num_experts]`` int, global id -> local id or -1 (pair
  dropped)

Imports only torch and the standard library: the build copies this file into the image's vllm package.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = [
    "GROUPED_MM_AVAILABLE",
    "SortedPairs",
    "fused_experts",
    "grouped_mm_supported",
    "select_impl",
    "sort_pairs",
]

_GROUPED_MM_CACHE: dict[tuple[str, int | None, torch.dtype], bool] = {}

#: The grouping kernel a target ships as a native step, or None: ``GROUP_BY_EXPERT(ids, buckets) -> [order,
#: offsets]`` sorts the flat expert ids stably by a counting sort (``order``) and gives each bucket's start
#: (``offsets``, ``buckets + 1`` long); the cpu target sets it to its ``imageforge_moe_group.group_by_expert``.
#: None: ``torch.sort`` + ``searchsorted``. A choice per target, not a fallback: nothing catches its failure.
GROUP_BY_EXPERT: Callable[[torch.Tensor, int], list[torch.Tensor]] | None = None


def _probe_grouped_mm(device: torch.device, dtype: torch.dtype) -> bool:
    """Run a tiny ``torch._grouped_mm`` on ``device``/``dtype`` and check it against ``torch.mm``."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return False
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(24, 16, generator=gen).to(device=device, dtype=dtype)
        w = torch.randn(3, 16, 16, generator=gen).to(device=device, dtype=dtype)  # [E, N, K] like w1
        offs = torch.tensor([5, 5, 24], dtype=torch.int32, device=device)  # includes an empty group
        got = fn(a, w.transpose(1, 2), offs=offs).float()
        want = torch.cat([a[:5].float() @ w[0].float().t(), a[5:].float() @ w[2].float().t()])
        return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-1))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False


def grouped_mm_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` works (and is correct) on ``device`` for ``dtype``; cached."""
    dev = torch.device(device)
    key = (dev.type, dev.index, dtype)
    if key not in _GROUPED_MM_CACHE:
        _GROUPED_MM_CACHE[key] = _probe_grouped_mm(dev, dtype)
    return _GROUPED_MM_CACHE[key]


# Feature detection at import, CPU only (see the module docstring for other devices).
GROUPED_MM_AVAILABLE: bool = any(
    [grouped_mm_supported("cpu", dt) for dt in (torch.float32, torch.bfloat16, torch.float16)])


def select_impl(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, impl: str = "auto") -> str:
    """Resolve ``impl`` ("auto", "grouped" or "loop") for these tensors; raises if "grouped" can't run."""
    if impl not in ("auto", "grouped", "loop"):
        raise ValueError(f"impl must be 'auto', 'grouped' or 'loop', got {impl!r}")
    if impl == "loop":
        return "loop"
    itemsize = hidden_states.element_size()
    aligned = all((d * itemsize) % 16 == 0 for d in (w1.shape[1], w1.shape[2], w2.shape[1], w2.shape[2]))
    supported = grouped_mm_supported(hidden_states.device, hidden_states.dtype)
    if impl == "grouped":
        if not supported:
            raise RuntimeError(f"torch._grouped_mm is unavailable for {hidden_states.dtype} on "
                               f"{hidden_states.device} (torch {torch.__version__})")
        return "grouped"
    return "grouped" if supported and aligned else "loop"


class SortedPairs:
    """(token, expert) pairs sorted by local expert id.

    ``token_idx[j]`` is the token of sorted pair ``j``, ``weights[j]`` its routing weight,
    ``expert_ends[e]`` one past the last pair of expert ``e`` (so expert ``e`` owns
    ``[expert_ends[e-1], expert_ends[e])``) and ``valid`` marks pairs whose expert is local (pairs dropped
    by ``expert_map`` sort to the end).
    """

    def __init__(self, token_idx: torch.Tensor, weights: torch.Tensor, expert_ends: torch.Tensor,
                 valid: torch.Tensor) -> None:
        self.token_idx = token_idx
        self.weights = weights
        self.expert_ends = expert_ends
        self.valid = valid


def sort_pairs(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
) -> SortedPairs:
    """Flatten ``[T, K]`` routing into pairs and sort them by expert (stable: ties keep token order)."""
    if topk_ids.dim() != 2 or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         "must both be [T, K]")
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).to(torch.int64)
    if expert_map is not None:
        ids = expert_map.to(device=ids.device, dtype=torch.int64)[ids]
    # Dropped (non-local) pairs get the sentinel id num_experts and sort behind every real expert.
    ids = torch.where(ids < 0, torch.full_like(ids, num_experts), ids)
    if GROUP_BY_EXPERT is not None:  # bucket num_experts: the dropped pairs, behind every expert
        order, offsets = GROUP_BY_EXPERT(ids, num_experts + 1)
        return SortedPairs(
            token_idx=order // top_k,
            weights=topk_weights.reshape(-1)[order],
            expert_ends=offsets[1:num_experts + 1],
            valid=torch.arange(order.numel(), device=order.device) < offsets[num_experts],
        )
    sorted_ids, order = torch.sort(ids, stable=True)
    bounds = torch.arange(num_experts, device=ids.device, dtype=torch.int64)
    expert_ends = torch.searchsorted(sorted_ids, bounds, right=True)
    return SortedPairs(
        token_idx=order // top_k,
        weights=topk_weights.reshape(-1)[order],
        expert_ends=expert_ends,
        valid=sorted_ids < num_experts,
    )


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return F.silu
    if name == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'silu' or 'gelu', got {name!r}")


def _project_loop(x: torch.Tensor, w: torch.Tensor, ends: list[int], out_features: int) -> torch.Tensor:
    """``out[s:e] = x[s:e] @ w[expert].T`` for each expert's contiguous slice (rows past ends[-1]: 0)."""
    if not ends or ends[-1] < x.shape[0]:
        out = x.new_zeros(x.shape[0], out_features)  # dropped pairs' rows stay 0
    else:
        out = x.new_empty(x.shape[0], out_features)
    start = 0
    for expert, end in enumerate(ends):
        if end > start:
            torch.mm(x[start:end], w[expert].t(), out=out[start:end])
        start = end
    return out


def _project_grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """One ``torch._grouped_mm`` over all experts: rows of group ``e`` times ``w[e].T``."""
    out: torch.Tensor = torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    return out


def fused_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    inplace: bool = False,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: torch.Tensor | None = None,
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """``sum_k w[t,k] * (act(x W_gate[e].T) * (x W_up[e].T)) W2[e].T`` with ``e = topk_ids[t,k]``.

    Returns ``[T, H]`` in ``hidden_states.dtype`` (written into ``hidden_states`` if ``inplace``).
    ``apply_router_weight_on_input`` scales the input rows instead of the outputs (vLLM allows it only
    for top-1). ``impl`` forces "grouped" or "loop"; "auto" picks (see :func:`select_impl`).
    """
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be [T, H], got {tuple(hidden_states.shape)}")
    num_tokens, hidden = hidden_states.shape
    if w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w1 must be [E, 2I, H] and w2 [E, H, I], got {tuple(w1.shape)}, {tuple(w2.shape)}")
    num_experts, two_i, h1 = w1.shape
    inter = two_i // 2
    if h1 != hidden or two_i != 2 * inter or tuple(w2.shape) != (num_experts, hidden, inter):
        raise ValueError(f"shape mismatch: hidden_states {tuple(hidden_states.shape)}, w1 {tuple(w1.shape)}, "
                         f"w2 {tuple(w2.shape)}")
    if topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} rows for {num_tokens} tokens")
    if apply_router_weight_on_input and topk_ids.shape[1] != 1:
        raise ValueError("apply_router_weight_on_input needs top_k == 1")
    if expert_map is None and global_num_experts not in (-1, num_experts):
        raise ValueError(f"global_num_experts={global_num_experts} without expert_map, but w1 has "
                         f"{num_experts} experts")
    act_fn = _activation(activation)
    chosen = select_impl(hidden_states, w1, w2, impl)
    dtype = hidden_states.dtype

    pairs = sort_pairs(topk_weights, topk_ids, num_experts, expert_map)
    x = hidden_states[pairs.token_idx]  # [N, H], each expert's rows contiguous
    if apply_router_weight_on_input:
        x = (x.float() * pairs.weights.float()[:, None]).to(dtype)

    if chosen == "grouped":
        offs = pairs.expert_ends.to(torch.int32)
        gate_up = _project_grouped(x, w1, offs)
        act = act_fn(gate_up[:, :inter]) * gate_up[:, inter:]
        down = _project_grouped(act, w2, offs)
        # Rows past the last group (pairs dropped by expert_map) are not written by _grouped_mm.
        down = torch.where(pairs.valid[:, None], down, torch.zeros((), dtype=dtype, device=down.device))
    else:
        ends = [int(e) for e in pairs.expert_ends.tolist()]  # the one host sync
        gate_up = _project_loop(x, w1, ends, two_i)
        act = act_fn(gate_up[:, :inter]) * gate_up[:, inter:]
        down = _project_loop(act, w2, ends, hidden)

    contrib = down.float()
    if not apply_router_weight_on_input:
        contrib = contrib * pairs.weights.float()[:, None]
    acc = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    acc.index_add_(0, pairs.token_idx, contrib)
    if inplace:
        return hidden_states.copy_(acc)
    return acc.to(dtype)
