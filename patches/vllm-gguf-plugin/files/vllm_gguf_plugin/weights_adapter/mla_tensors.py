# SPDX-License-Identifier: Apache-2.0
"""Tensor conversions for MLA GGUF loading: raw reads, dequantization, kv_b fusion."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ..gguf_headers import TensorInfo
from ..gguf_tensors import PLAIN_TYPES

__all__ = ["PLAIN_TYPES", "dequantized", "fuse_kv_b", "split_kv_b"]


def dequantized(info: TensorInfo, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values of one stored tensor (``gguf_tensors.tensor_view``) in numpy order as *dtype*.

    Plain types of the same dtype come back as the view itself (the loader copies
    it); quantized ones are decoded by gguf-py.
    """
    if info.type_name in PLAIN_TYPES:
        return stored.to(dtype)
    values = dequantize(stored.numpy(), GGMLQuantizationType(info.type_id))
    return torch.from_numpy(values.reshape(info.shape)).to(dtype)


def fuse_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """Exact inverse of llama.cpp's kv_b split.

    The converter did ``view(H, nope + v, kv_lora)``, split rows into k_nope and
    v per head and stored ``k_b`` transposed as (H, kv_lora, nope) and ``v_b``
    as (H, v, kv_lora). Undo the transpose, restack per head, flatten heads.
    Works on dequantized values only: the transpose scrambles quant blocks.
    """
    if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[0] != v_b.shape[0]:
        raise ValueError(f"k_b {tuple(k_b.shape)} and v_b {tuple(v_b.shape)} do not pair")
    heads, kv_lora, nope = k_b.shape
    if v_b.shape[2] != kv_lora:
        raise ValueError(f"k_b {tuple(k_b.shape)} and v_b {tuple(v_b.shape)} do not pair")
    fused = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return fused.reshape(heads * (nope + v_b.shape[1]), kv_lora).contiguous()


def split_kv_b(kv_b: torch.Tensor, heads: int, nope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The converter's split, for building test files and checking the inverse."""
    rows, kv_lora = kv_b.shape
    per_head = kv_b.view(heads, rows // heads, kv_lora)
    k_b, v_b = per_head.split([nope, rows // heads - nope], dim=1)
    return k_b.transpose(1, 2).contiguous(), v_b.contiguous()
