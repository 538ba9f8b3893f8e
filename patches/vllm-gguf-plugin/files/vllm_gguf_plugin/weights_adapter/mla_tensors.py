# SPDX-License-Identifier: Apache-2.0
"""Tensor conversions for MLA GGUF loading: raw reads, dequantization, kv_b fusion."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize

PLAIN_TYPES = frozenset({"F32", "F16", "BF16"})


def raw_tensor(tensor: ReaderTensor) -> torch.Tensor:
    """The tensor as stored: plain types as numbers, quantized as row bytes."""
    data = tensor.data
    if tensor.tensor_type == GGMLQuantizationType.BF16:
        # gguf-py hands BF16 back as raw bytes or uint16; numpy has no bfloat16.
        as_u16 = np.ascontiguousarray(data).view(np.uint16)
        shape = tuple(reversed([int(d) for d in tensor.shape]))
        return torch.from_numpy(as_u16.reshape(shape).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(data))


def dequantized(tensor: ReaderTensor, dtype: torch.dtype) -> torch.Tensor:
    """Values of *tensor* in numpy order as *dtype*, whatever its GGML type."""
    if tensor.tensor_type.name in PLAIN_TYPES:
        return raw_tensor(tensor).to(dtype)
    values = dequantize(np.asarray(tensor.data), tensor.tensor_type)
    shape = tuple(reversed([int(d) for d in tensor.shape]))
    return torch.from_numpy(np.ascontiguousarray(values).reshape(shape)).to(dtype)


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
