# SPDX-License-Identifier: Apache-2.0
"""CPU compute path for GGUF weights: dequantize once, then compute in the model dtype.

The CUDA/Triton kernels of this plugin only take CUDA tensors. On CPU we give up
on quantized arithmetic: each GGUF weight is dequantized once, when the layer
finishes loading, into a tensor of the model dtype that stays on the layer
(`gguf_cpu_weight`, `w13_gguf_cpu_weight`, `w2_gguf_cpu_weight`). The forward
pass then runs torch matmuls on it. The quantized bytes are kept too (they are
what the loader and the op-level API see), so a model costs its GGUF size plus
its parameter count times the dtype's bytes.

The op-level functions (`mul_mat`, `moe_a8`, `moe_a8_vec`) implement the same
contracts as the plugin's kernels for CPU callers that pass raw bytes; they
dequantize on every call, since they have no layer to keep the result on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from gguf import GGMLQuantizationType as T

from .dequant import block_sizes, dequantize

UNQUANTIZED = frozenset({T.F32, T.F16, T.BF16})


def dequantize_2d(qweight: torch.Tensor, quant_type: int, dtype: torch.dtype) -> torch.Tensor:
    """One GGUF matrix `(rows, row_bytes)` (or float data) -> `(rows, cols)` in `dtype`."""
    if int(quant_type) in UNQUANTIZED:
        return qweight.to(dtype)
    block, size = block_sizes(quant_type)
    rows, row_bytes = qweight.shape
    return dequantize(qweight.contiguous(), quant_type, rows, row_bytes // size * block, dtype)


def dequantize_stacked(qweight: torch.Tensor, quant_type: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert-stacked bytes `(E, rows, row_bytes)` -> `(E, rows, cols)`."""
    return torch.stack([dequantize_2d(w, quant_type, dtype) for w in qweight])


def mul_mat(W: torch.Tensor, X: torch.Tensor, quant_type: int, row: int) -> torch.Tensor:
    """`X @ dequant(W).T` in X's dtype: the contract of ggml_mul_mat_a8/_vec_a8."""
    weight = dequantize_2d(W, quant_type, X.dtype)
    assert weight.shape[0] == row, (weight.shape, row)
    return X @ weight.T


def moe_a8_vec(
    X: torch.Tensor,
    W: torch.Tensor,
    topk_ids: torch.Tensor,
    top_k: int,
    quant_type: int,
    row: int,
    tokens: int,
) -> torch.Tensor:
    """Row i of the output is `X[i // top_k] @ W[topk_ids.flatten()[i]].T`."""
    experts = topk_ids.reshape(-1).long()
    src = torch.arange(experts.numel(), device=X.device) // top_k
    out = torch.zeros(experts.numel(), row, dtype=X.dtype, device=X.device)
    for e in experts.unique().tolist():
        hit = (experts == e).nonzero().squeeze(1)
        out[hit] = X[src[hit]] @ dequantize_2d(W[e], quant_type, X.dtype).T
    del tokens
    return out


def moe_a8(
    X: torch.Tensor,
    W: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    quant_type: int,
    row: int,
    top_k: int,
    tokens: int,
    block_m: int,
) -> torch.Tensor:
    """The moe_align_block_size contract: block b of `sorted_token_ids` holds flat
    (token, slot) ids routed to `expert_ids[b]`; ids >= tokens * top_k are padding."""
    out = torch.zeros(tokens * top_k, row, dtype=X.dtype, device=X.device)
    used = int(num_tokens_post_padded.reshape(-1)[0])
    ids = sorted_token_ids[:used].long()
    experts = expert_ids.long().repeat_interleave(block_m)[:used]
    keep = (ids < tokens * top_k) & (experts >= 0)
    ids, experts = ids[keep], experts[keep]
    for e in experts.unique().tolist():
        sel = ids[experts == e]
        out[sel] = X[sel // top_k] @ dequantize_2d(W[e], quant_type, X.dtype).T
    return out


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Routed experts on dequantized weights: w13 `(E, 2N, H)`, w2 `(E, H, N)`.

    Tokens are grouped per expert so each expert does one matmul pair; the
    weighted sum over a token's top-k slots is accumulated in float32.
    """
    num_tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    weights = topk_weights.reshape(-1, 1).float()
    token_of = torch.arange(flat.numel(), device=x.device) // top_k
    acc = torch.zeros(num_tokens, w2.shape[1], dtype=torch.float32, device=x.device)
    for e in flat.unique().tolist():
        slots = (flat == e).nonzero().squeeze(1)
        rows = token_of[slots]
        h = act(x[rows] @ w13[e].T)
        acc.index_add_(0, rows, (h @ w2[e].T).float() * weights[slots])
    return acc.to(x.dtype)


def merged_weight(
    qweight: torch.Tensor,
    shard_ids: Sequence[int | str],
    shard_types: dict,
    fallback_type: int,
    offsets: dict | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The dense weight `GGUFLinearMethod.apply` would multiply by, rows in its order.

    Mirrors apply(): fused shards of one type are dequantized as a whole (padded
    rows share one layout); mixed-type shards are cut out by `shard_offset_map`
    and concatenated in apply's order (q, k, v when `q` is present).
    """
    if not shard_ids:
        return dequantize_2d(qweight, fallback_type, dtype)
    order = ["q", "k", "v"] if "q" in shard_ids else list(shard_ids)
    types = [int(shard_types.get(idx, fallback_type)) for idx in order]
    if len(set(types)) == 1:
        return dequantize_2d(qweight, types[0], dtype)
    assert offsets is not None
    parts = []
    for idx, qtype in zip(order, types, strict=True):
        start, end, size = offsets[idx]
        parts.append(dequantize_2d(qweight[start:end, :size], qtype, dtype))
    return torch.cat(parts, dim=0)


def keeps_dense_copy(qweight: torch.Tensor) -> bool:
    """Only on the CPU platform: a CUDA deployment with weights on the host
    (CPU offload) must keep its own path, and its forward runs on the GPU."""
    from vllm.platforms import current_platform

    return qweight.device.type == "cpu" and current_platform.is_cpu()


def attach_linear_weight(layer: torch.nn.Module, dtype: torch.dtype) -> None:
    """Dequantize a loaded GGUF linear/embedding layer once and keep the result on it."""
    qweight = layer.qweight
    qtype = layer.qweight_type
    weight = merged_weight(
        qweight.data,
        list(getattr(qweight, "shard_id", []) or []),
        dict(getattr(qtype, "shard_weight_type", {}) or {}),
        int(qtype.weight_type),
        getattr(qweight, "shard_offset_map", None),
        dtype,
    )
    layer.register_buffer("gguf_cpu_weight", weight.contiguous(), persistent=False)


def attach_moe_weights(layer: torch.nn.Module, dtype: torch.dtype) -> None:
    """Same for a GGUF MoE layer: both expert stacks, once."""
    w13 = dequantize_stacked(layer.w13_qweight.data, layer.w13_qweight_type.weight_type, dtype)
    w2 = dequantize_stacked(layer.w2_qweight.data, layer.w2_qweight_type.weight_type, dtype)
    layer.register_buffer("w13_gguf_cpu_weight", w13, persistent=False)
    layer.register_buffer("w2_gguf_cpu_weight", w2, persistent=False)
