"""The plugin's CPU path against gguf-py's reference dequantization.

Our implementation (vllm_gguf_plugin/cpu, added by patch 0010) is torch code of
its own; gguf-py's numpy dequantizers are the reference. Both compute in float32,
so results must be bit-identical; casts to bf16/fp16 must equal the cast of the
reference. On the unpatched plugin every test here that goes through `ops` fails
with "Triton dequant kernels require CUDA tensors".
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as ref_dequantize
from gguf.quants import quantize as ref_quantize

pytestmark = pytest.mark.vllm

# Byte offsets of the fp16 fields in each block: random bytes there could be
# inf/NaN, which would hide every other value of the block, so tests clear the
# top exponent bit (bit 6 of the high byte) to keep them finite.
HALF_OFFSETS: dict[T, tuple[int, ...]] = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
    T.IQ1_S: (0,), T.IQ1_M: (54,), T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip
# Rows of token_embd compared (the whole 262144-row table takes ~1 GiB in float32).
EMBED_ROWS = 8192


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    from vllm_gguf_plugin import ops

    return ops


def random_blocks(qtype: T, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    _, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, blocks_per_row, size), np.uint8)
    for offset in HALF_OFFSETS[qtype]:
        raw[..., offset + 1] &= 0xBF
    return raw.reshape(rows, blocks_per_row * size)


def assert_matches_reference(ops, raw: np.ndarray, qtype: T, what: str) -> None:  # type: ignore[no-untyped-def]
    ref = ref_dequantize(raw, qtype)
    assert np.isfinite(ref).all(), f"{what}: the reference itself is not finite"
    rows, cols = ref.shape
    tensor = torch.from_numpy(np.ascontiguousarray(raw))
    ours = ops.ggml_dequantize(tensor, int(qtype), rows, cols, torch.float32)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == (rows, cols)
    diff = (ours - torch.from_numpy(ref)).abs().max().item()
    assert torch.equal(ours, torch.from_numpy(ref)), f"{what}: max |diff| {diff}"
    for dtype in (torch.bfloat16, torch.float16):
        cast = ops.ggml_dequantize(tensor, int(qtype), rows, cols, dtype)
        assert torch.equal(cast, torch.from_numpy(ref).to(dtype)), f"{what} as {dtype}"


def test_every_quant_type_of_the_gemma_file(ops, gemma_path: Path) -> None:  # type: ignore[no-untyped-def]
    reader = GGUFReader(gemma_path)
    by_type: dict[T, list] = defaultdict(list)
    for tensor in reader.tensors:
        if tensor.tensor_type not in (T.F32, T.F16, T.BF16):
            by_type[T(tensor.tensor_type)].append(tensor)
    assert by_type, "the Gemma file should hold quantized tensors"
    for qtype, tensors in sorted(by_type.items()):
        # two blocks' tensors per type and every embedding type: enough to cover
        # each layout (and every tensor shape class) without a 1 GiB float copy
        for tensor in tensors[:2]:
            data = np.asarray(tensor.data)
            if tensor.name == "token_embd.weight":
                data = data[:EMBED_ROWS]
            assert_matches_reference(ops, data, qtype, f"{tensor.name} ({qtype.name})")


def test_q4_0_q8_0_q4_k_written_with_gguf_py(ops, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    floats = rng.standard_normal((48, 512), dtype=np.float32)
    path = tmp_path / "written.gguf"
    writer = GGUFWriter(str(path), "llama")
    for qtype in (T.Q4_0, T.Q8_0):
        writer.add_tensor(qtype.name, ref_quantize(floats, qtype), raw_dtype=qtype)
    # gguf-py cannot quantize K-quants: real Q4_K bytes are written as raw blocks
    writer.add_tensor("Q4_K", random_blocks(T.Q4_K, 48, 2, seed=3), raw_dtype=T.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tensors = {t.name: t for t in GGUFReader(path).tensors}
    assert set(tensors) == {"Q4_0", "Q8_0", "Q4_K"}
    for name, tensor in tensors.items():
        assert tensor.tensor_type == T[name]
        assert_matches_reference(ops, np.asarray(tensor.data), T[name], f"written {name}")
    # and the quantized values still track the floats they came from
    back = ops.ggml_dequantize(
        torch.from_numpy(np.asarray(tensors["Q8_0"].data)), int(T.Q8_0), 48, 512, torch.float32
    )
    assert (back - torch.from_numpy(floats)).abs().max().item() < 0.05


@pytest.mark.parametrize("qtype", sorted(HALF_OFFSETS), ids=lambda q: q.name)
def test_every_type_the_plugin_accepts(ops, qtype: T) -> None:  # type: ignore[no-untyped-def]
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, rows=6, blocks_per_row=max(1, 512 // block), seed=int(qtype))
    assert_matches_reference(ops, raw, qtype, qtype.name)


def test_the_cpu_path_covers_the_plugin_type_list() -> None:
    from vllm_gguf_plugin.cpu.dequant import SUPPORTED_TYPES
    from vllm_gguf_plugin.quantization.utils import DEQUANT_TYPES, UNQUANTIZED_TYPES

    assert set(DEQUANT_TYPES | UNQUANTIZED_TYPES) <= set(SUPPORTED_TYPES)
    assert set(DEQUANT_TYPES) - {T.Q8_1} <= set(HALF_OFFSETS)  # each one tested above


def test_q8_1_from_known_values(ops) -> None:  # type: ignore[no-untyped-def]
    # gguf-py has no Q8_1 dequantizer: build blocks {half d, half s, int8 qs[32]} by hand
    rng = np.random.default_rng(1)
    d = rng.uniform(0.01, 2, (4, 1)).astype(np.float16)
    q = rng.integers(-128, 128, (4, 32), dtype=np.int8)
    s = (d.astype(np.float32) * q.sum(1, keepdims=True)).astype(np.float16)
    raw = np.concatenate([d.view(np.uint8), s.view(np.uint8), q.view(np.uint8)], axis=1)
    ours = ops.ggml_dequantize(torch.from_numpy(raw), int(T.Q8_1), 4, 32, torch.float32)
    assert torch.equal(ours, torch.from_numpy(d.astype(np.float32) * q.astype(np.float32)))


def assert_close_scaled(got: torch.Tensor, want: torch.Tensor) -> None:
    # random fp16 scales make large values; summation order differs between a
    # batched and a per-row matmul, so compare relative to the magnitude
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale)


def _experts(qtype: T, n_experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = np.stack([random_blocks(qtype, rows, cols // block, seed=e) for e in range(n_experts)])
    ref = np.stack([ref_dequantize(r, qtype) for r in raw])
    return torch.from_numpy(raw), torch.from_numpy(ref)


def test_mul_mat_ops(ops) -> None:  # type: ignore[no-untyped-def]
    raw, ref = _experts(T.Q4_K, 1, 64, 512)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    want = x @ ref[0].T
    for fn in (ops.ggml_mul_mat_a8, ops.ggml_mul_mat_vec_a8):
        assert_close_scaled(fn(raw[0], x, int(T.Q4_K), 64), want)


def test_moe_ops_follow_the_routing(ops) -> None:  # type: ignore[no-untyped-def]
    n_exp, top_k, tokens, rows, cols = 4, 2, 7, 32, 256
    raw, ref = _experts(T.Q6_K, n_exp, rows, cols)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, cols, generator=gen)
    topk_ids = torch.stack([torch.randperm(n_exp, generator=gen)[:top_k] for _ in range(tokens)])
    want = torch.stack([x[i // top_k] @ ref[e].T for i, e in enumerate(topk_ids.flatten())])

    got = ops.ggml_moe_a8_vec(x, raw, topk_ids, top_k, int(T.Q6_K), rows, tokens)
    assert_close_scaled(got, want)

    # the moe_align_block_size layout: per-expert blocks of flat ids, padded with a sentinel
    block_m = ops.ggml_moe_get_block_size(int(T.Q6_K))
    pad = tokens * top_k
    sorted_ids: list[int] = []
    expert_ids: list[int] = []
    for e in range(n_exp):
        flat = (topk_ids.flatten() == e).nonzero().flatten().tolist()
        while flat:
            chunk, flat = flat[:block_m], flat[block_m:]
            sorted_ids += chunk + [pad] * (block_m - len(chunk))
            expert_ids.append(e)
    got = ops.ggml_moe_a8(
        x,
        raw,
        torch.tensor(sorted_ids + [pad] * block_m),
        torch.tensor(expert_ids + [-1]),
        torch.tensor([len(sorted_ids)]),
        int(T.Q6_K),
        rows,
        top_k,
        tokens,
    )
    assert_close_scaled(got, want)


def test_fused_moe_cpu_branch() -> None:
    from vllm_gguf_plugin.quantization.fused_moe import _fused_moe_gguf

    n_exp, top_k, tokens, hidden, inter = 4, 2, 5, 256, 64
    w13_raw, w13 = _experts(T.Q4_K, n_exp, 2 * inter, hidden)
    w2_raw, w2 = _experts(T.Q8_0, n_exp, hidden, inter)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, hidden, generator=gen)
    topk_ids = torch.stack([torch.randperm(n_exp, generator=gen)[:top_k] for _ in range(tokens)])
    topk_weights = torch.rand(tokens, top_k, generator=gen)

    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for k in range(top_k):
            e = int(topk_ids[t, k])
            gate, up = (x[t] @ w13[e].T).split(inter)
            want[t] += topk_weights[t, k] * ((torch.nn.functional.silu(gate) * up) @ w2[e].T)
    got = _fused_moe_gguf(
        x, w13_raw, w2_raw, topk_weights, topk_ids, int(T.Q4_K), int(T.Q8_0), "silu"
    )
    assert_close_scaled(got, want)


def test_linear_with_mixed_shard_types_dequantizes_once() -> None:
    """A qkv layer like Gemma's (q, k: Q5_0; v: Q8_0), padded the way the loader pads it."""
    from vllm_gguf_plugin.cpu.compute import attach_linear_weight
    from vllm_gguf_plugin.quantization.linear import GGUFLinearMethod

    shards = {"q": (T.Q5_0, 64), "k": (T.Q5_0, 32), "v": (T.Q8_0, 32)}
    cols = 256
    raws = {s: random_blocks(q, rows, cols // 32, seed=i) for i, (s, (q, rows)) in
            enumerate(shards.items())}  # fmt: skip
    width = max(r.shape[1] for r in raws.values())
    padded = torch.zeros(sum(r.shape[0] for r in raws.values()), width, dtype=torch.uint8)
    offsets, start = {}, 0
    for s, raw in raws.items():
        padded[start : start + raw.shape[0], : raw.shape[1]] = torch.from_numpy(raw)
        offsets[s] = (start, start + raw.shape[0], raw.shape[1])
        start += raw.shape[0]

    layer = torch.nn.Module()
    layer.qweight = torch.nn.Parameter(padded, requires_grad=False)
    layer.qweight.shard_id, layer.qweight.shard_offset_map = list(shards), offsets
    layer.qweight_type = torch.nn.Parameter(torch.zeros(3, dtype=torch.uint8), False)
    layer.qweight_type.weight_type = int(T.Q5_0)
    layer.qweight_type.shard_weight_type = {s: int(q) for s, (q, _) in shards.items()}

    ref = torch.cat([torch.from_numpy(ref_dequantize(raws[s], q)) for s, (q, _) in
                     shards.items()])  # fmt: skip
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(3))
    method = GGUFLinearMethod(None)
    assert_close_scaled(method.apply(layer, x), x @ ref.T)  # op path, no copy yet

    attach_linear_weight(layer, torch.float32)
    assert torch.equal(layer.gguf_cpu_weight, ref)
    assert_close_scaled(method.apply(layer, x), x @ ref.T)  # the kept copy
