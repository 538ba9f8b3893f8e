"""The function TRITON_MLA_SPARSE runs, fed the tensors the backend feeds it.

No vLLM import: backend_call.py assembles the backend's
``sparse_mla_topk_attention`` with vLLM's own remap kernel from source, so the
same checks run on the GPU machine (which has no vLLM) and, tiny and
interpreted, on the CPU tier. Inputs follow vLLM's layouts (sparse_batch.py):
decode / MTP / chunked-prefill / prefill rows, shuffled blocks, a cache whose
block stride is wider than its block, and the indexer's top-k rows.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "kernels"))
from kernel_loader import load_kernel_module  # noqa: E402

from fixtures.backend.backend_call import find_sparse_utils, load_backend_call  # noqa: E402
from fixtures.backend.sparse_batch import (  # noqa: E402
    SparseBatch,
    expected_slots,
    make_batch,
    reference_attention,
)

CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (this is the CPU tier)")

# GLM-5: index_topk 2048, 64 heads over TP8 = 8 per GPU (DeepSeek-V3.2: 16).
# Decodes, MTP verification rows, a chunked prefill and a short fresh prefill.
GLM5_QUERY_LENS = [1, 1, 1, 2, 2, 7, 4]
GLM5_SEQ_LENS = [3000, 700, 2049, 2100, 90, 5000, 4]
SCALE = 1 / math.sqrt(256)


@pytest.fixture(scope="module")
def backend_call() -> Iterator[Callable[..., torch.Tensor]]:
    # The pinned copy is committed, so a missing or edited one fails (never skips).
    sparse_utils = find_sparse_utils()
    with pytest.MonkeyPatch.context() as mp:
        if not CUDA:
            # Without a GPU the kernels run interpreted. triton.jit reads this
            # when a kernel is defined and the kernel module when it launches,
            # so it is set for this module's tests only.
            mp.setenv("TRITON_INTERPRET", "1")
        yield load_backend_call(load_kernel_module(), sparse_utils)


def _on(batch: SparseBatch, device: str) -> SparseBatch:
    """The batch on a device, keeping the cache's wide block stride."""
    nb, bs, d = batch.kv_cache.shape
    backing = torch.zeros(nb, batch.kv_cache.stride(0) // d, d, dtype=batch.kv_cache.dtype)
    backing[:, :bs] = batch.kv_cache
    return SparseBatch(
        query_lens=batch.query_lens,
        seq_lens=batch.seq_lens,
        block_table=batch.block_table.to(device),
        kv_cache=backing.to(device)[:, :bs],
        topk=batch.topk.to(device),
        req_id_per_token=batch.req_id_per_token.to(device),
        q=batch.q.to(device),
    )


def _call(fn: Callable[..., torch.Tensor], b: SparseBatch, **kw: float) -> torch.Tensor:
    return fn(b.q, b.kv_cache, b.topk, b.req_id_per_token, b.block_table, b.block_size, SCALE, **kw)


def test_remap_kernel_from_upstream_source(backend_call: Callable[..., torch.Tensor]) -> None:
    import fixtures.backend.backend_call as bc

    mod = sys.modules[bc.MODULE_NAME]
    host = make_batch([1, 2, 5], [150, 70, 260], heads=4, topk=128, seed=4)
    batch = _on(host, "cuda" if CUDA else "cpu")
    rows, stride_rows = mod.flat_kv_row_view(batch.kv_cache, batch.block_size)
    assert stride_rows == 2 * batch.block_size
    slots = mod.triton_convert_req_index_to_global_index(
        batch.req_id_per_token, batch.block_table, batch.topk,
        BLOCK_SIZE=batch.block_size, BLOCK_STRIDE_ROWS=stride_rows, NUM_TOPK_TOKENS=128,
    )  # fmt: skip
    assert torch.equal(slots.cpu(), expected_slots(host, stride_rows))


def test_backend_call_tiny(backend_call: Callable[..., torch.Tensor]) -> None:
    """Interpreted on the CPU tier (TRITON_INTERPRET=1), compiled on a GPU."""
    batch = make_batch([1, 2, 3], [150, 70, 3], heads=4, topk=128, seed=5)
    out = _call(backend_call, _on(batch, "cuda" if CUDA else "cpu"))
    ref = reference_attention(batch, SCALE)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [8, 16, 64])
def test_backend_call_glm5_shapes(
    backend_call: Callable[..., torch.Tensor], dtype: torch.dtype, heads: int
) -> None:
    batch = make_batch(
        GLM5_QUERY_LENS, GLM5_SEQ_LENS, heads=heads, topk=2048, dtype=dtype, seed=heads
    )
    out = _call(backend_call, _on(batch, "cuda"))
    assert out.dtype == dtype and out.shape == (batch.q.shape[0], heads, 512)
    ref = reference_attention(batch, SCALE)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_gpu
def test_backend_call_fp8_cache(backend_call: Callable[..., torch.Tensor]) -> None:
    # kv_cache_dtype fp8: forward_mqa passes the float8_e4m3fn view and the layer's k scale.
    batch = make_batch(GLM5_QUERY_LENS, GLM5_SEQ_LENS, heads=8, topk=2048, seed=7)
    kv_scale = float(batch.kv_cache.float().abs().amax()) / 448.0
    fp8 = (batch.kv_cache.float() / kv_scale).to(torch.float8_e4m3fn)
    batch8 = SparseBatch(**{**batch.__dict__, "kv_cache": fp8})
    out = _call(backend_call, _on(batch8, "cuda"), kv_scale=kv_scale)
    ref = reference_attention(batch8, SCALE, kv_scale=kv_scale)
    torch.testing.assert_close(out.cpu().double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("query_lens", [[1] * 6, [2] * 4], ids=["decode", "mtp"])
def test_backend_call_cuda_graph_replay(
    backend_call: Callable[..., torch.Tensor], query_lens: list[int]
) -> None:
    """A uniform decode batch, captured once and replayed on new contents."""
    seq_lens = [2500, 4000, 2049, 130, 3333, 64][: len(query_lens)]
    first, second = (
        _on(make_batch(query_lens, seq_lens, heads=8, topk=2048, seed=s), "cuda") for s in (11, 12)
    )
    static = first
    # As forward_mqa calls it: one workspace of workspace_bound fp32, reserved up front.
    numel = load_kernel_module().workspace_bound(8, 2048, static.q.device)
    ws = torch.full((numel,), float("nan"), device="cuda")
    call = lambda b: backend_call(  # noqa: E731
        b.q, b.kv_cache, b.topk, b.req_id_per_token, b.block_table, b.block_size, SCALE,
        workspace=ws,
    )  # fmt: skip
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(static)  # compile and pick configs outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static)
    for name in ("q", "topk", "req_id_per_token", "block_table", "kv_cache"):
        getattr(static, name).copy_(getattr(second, name))
    graph.replay()
    torch.cuda.synchronize()
    eager = _call(backend_call, second)
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    batch_cpu = make_batch(query_lens, seq_lens, heads=8, topk=2048, seed=12)
    ref = reference_attention(batch_cpu, SCALE)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-2, rtol=2e-2)
