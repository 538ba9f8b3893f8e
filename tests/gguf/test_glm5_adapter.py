"""GLM-5 GGUF through the patched plugin's real adapter, name map, iterator and fusion.

vLLM's ModelConfig is replaced by a stub carrying hf_config and dtype (the two
fields the adapter reads); tests that use it say so in their names.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from transformers import AutoConfig
from vllm_gguf_plugin.gguf_headers import read_header
from vllm_gguf_plugin.quantization.utils import is_layer_skipped_gguf
from vllm_gguf_plugin.weights_adapter import get_weights_adapter
from vllm_gguf_plugin.weights_adapter.glm_dsa import GGUFLoadError, MLAGGUFAdapter
from vllm_gguf_plugin.weights_adapter.mla_tensors import fuse_kv_b

from entrypoint.start import gguf_check
from fixtures.tiny_glm5_gguf import (
    CONFIG,
    DEEPSEEK_V3_CONFIG,
    GGUF_NAME,
    Tiny,
    hf_shapes,
    make_tiny,
    storage_type,
    write_gguf,
)

pytestmark = pytest.mark.vllm  # the plugin imports vLLM

EXACT = {T.F32, T.F16, T.BF16, T.Q4_K}  # Q4_K: the reference is its own dequant
# Worst-case rounding error relative to the tensor's largest magnitude.
LOSSY_TOL = {T.Q8_0: 1 / 200, T.Q4_0: 1 / 7.9}


def stub_model_config(config_dir: Path, dtype: torch.dtype) -> SimpleNamespace:
    return SimpleNamespace(hf_config=AutoConfig.from_pretrained(config_dir), dtype=dtype)


def load(path: Path, config_dir: Path, dtype: torch.dtype = torch.float32,
         model_type: str | None = None) -> tuple[MLAGGUFAdapter, dict[str, torch.Tensor]]:
    mc = stub_model_config(config_dir, dtype)
    if model_type:
        mc.hf_config.model_type = model_type
    adapter = get_weights_adapter(mc.hf_config)
    assert isinstance(adapter, MLAGGUFAdapter)
    adapter.prepare_loading(str(path), mc)
    stream = list(adapter.prepare_weights(mc))
    names = [n for n, _ in stream]
    assert len(names) == len(set(names)), "a parameter was yielded twice"
    return adapter, dict(stream)


def decode(items: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Yielded parameters back to HF tensors: qweights dequantized, experts per id."""
    out = {}
    for name, value in items.items():
        if name.endswith(".qweight_type"):
            continue
        if name.endswith(".qweight"):
            base = name.removesuffix(".qweight")
            # map_weights splits stacked experts; the type stays on expert 0.
            type_name = re.sub(r"\.experts\.\d+\.", ".experts.0.", base) + ".qweight_type"
            qtype = T(int(items[type_name]))
            values = dequantize(value.numpy(), qtype)
            out[base + ".weight"] = torch.from_numpy(values.copy())
        else:
            out[name] = value.float()
    return out


def compare(tiny: Tiny, got: dict[str, torch.Tensor], names: Iterable[str]) -> None:
    shapes = hf_shapes(tiny.cfg)
    for name in names:
        want, have = tiny.sd[name], got[name]
        assert have.shape == want.shape, name
        kind = storage_type(tiny.cfg, name, shapes[name])
        if kind in EXACT:
            assert torch.equal(have, want), f"{name} ({kind.name}) not exact"
        else:
            tol = LOSSY_TOL[kind] * float(want.abs().max())
            err = float((have - want).abs().max())
            assert err <= tol, f"{name} ({kind.name}) error {err} > {tol}"


def test_kv_b_fusion_inverts_the_converter_split() -> None:
    heads, nope, v_dim, kv_lora = 4, 96, 128, 64
    kv_b = torch.randn(heads * (nope + v_dim), kv_lora).half().float()
    # llama.cpp convert_hf_to_gguf.py: view per head, split [nope, v], transpose k.
    per_head = kv_b.view(heads, nope + v_dim, kv_lora)
    k_b, v_b = per_head.split([nope, v_dim], dim=1)
    fused = fuse_kv_b(k_b.transpose(1, 2).contiguous(), v_b.contiguous())
    assert torch.equal(fused, kv_b)
    with pytest.raises(ValueError, match="do not pair"):
        fuse_kv_b(k_b.transpose(1, 2), v_b[:, :, :-1])


def main_and_draft(tiny_dir: Path, dtype: torch.dtype = torch.float32
                   ) -> tuple[MLAGGUFAdapter, dict[str, torch.Tensor]]:
    """What the main model's adapter yields, plus the MTP block from the draft's.

    The main model never reads the MTP block (vLLM drops it unread, and the adapter
    skips it before dequantizing its kv_b); the deepseek_mtp draft loads it.
    """
    mtp = f"model.layers.{CONFIG['num_hidden_layers']}."
    adapter, items = load(tiny_dir / GGUF_NAME, tiny_dir, dtype=dtype)
    assert not [n for n in items if n.startswith(mtp)]
    _, draft = load(tiny_dir / GGUF_NAME, tiny_dir, dtype=dtype, model_type="deepseek_mtp")
    return adapter, {**items, **{n: v for n, v in draft.items() if n.startswith(mtp)}}


def test_every_parameter_round_trips_with_stub_model_config(tiny: Tiny, tiny_dir: Path) -> None:
    _, items = main_and_draft(tiny_dir)
    got = decode(items)
    assert set(got) == set(tiny.sd), (set(tiny.sd) ^ set(got))
    compare(tiny, got, tiny.sd)
    # kv_b: exact from F16 (blocks 0-1) and BF16 (MTP block 3) halves.
    for b in (0, 1, 3):
        name = f"model.layers.{b}.self_attn.kv_b_proj.weight"
        assert torch.equal(got[name], tiny.sd[name])


def test_unquantized_targets_arrive_plain_in_model_dtype_with_stub_model_config(
    tiny_dir: Path,
) -> None:
    adapter, items = main_and_draft(tiny_dir, dtype=torch.bfloat16)
    plain = [
        "model.layers.1.self_attn.indexer.wk.weight",  # Q8_0 in the file
        "model.layers.1.self_attn.indexer.weights_proj.weight",  # Q4_0
        "model.layers.3.eh_proj.weight",  # Q8_0
        "model.layers.2.self_attn.kv_b_proj.weight",  # fused from Q8_0 halves
        "model.layers.0.self_attn.q_a_proj.weight",  # Q8_0, fused with a BF16 partner
    ]
    for name in plain:
        assert items[name].dtype == torch.bfloat16, name
    assert not [n for n in items if re.search(r"qweight.*\.(weight|qweight)", n)]
    assert not [n for n in items if "norm" in n and "qweight" in n]
    modules = adapter.load_spec.unquantized_modules
    packed = {"fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"],
              "gate_up_proj": ["gate_proj", "up_proj"]}
    for prefix in ("model.layers.1.self_attn.kv_b_proj",
                   "model.layers.1.self_attn.fused_qkv_a_proj",
                   "model.layers.2.mlp.shared_experts.gate_up_proj"):
        assert is_layer_skipped_gguf(prefix, modules, packed), prefix
    for prefix in ("model.layers.1.self_attn.q_b_proj", "model.layers.1.self_attn.o_proj",
                   "model.layers.0.mlp.gate_up_proj", "model.layers.1.self_attn.indexer.wq_b",
                   "lm_head"):
        assert not is_layer_skipped_gguf(prefix, modules, packed), prefix


def test_split_set_loads_like_one_file_with_stub_model_config(
    tiny: Tiny, tiny_dir: Path, tmp_path: Path
) -> None:
    shutil.copy(tiny_dir / "config.json", tmp_path)
    parts = write_gguf(tmp_path / "tiny.gguf", tiny, parts=3)
    assert parts[0].name == "tiny-00001-of-00003.gguf"
    _, split_items = load(parts[0], tmp_path)
    _, whole_items = load(tiny_dir / GGUF_NAME, tiny_dir)
    assert split_items.keys() == whole_items.keys()
    for name, value in whole_items.items():
        assert torch.equal(split_items[name], value), name


def test_mtp_draft_reads_only_its_block_with_stub_model_config(tiny_dir: Path) -> None:
    # vLLM's speculative config renames glm_moe_dsa to deepseek_mtp for the draft.
    adapter, items = load(tiny_dir / GGUF_NAME, tiny_dir, model_type="deepseek_mtp")
    base = CONFIG["num_hidden_layers"]
    # The draft builds its decoder layer with prefix model.layers.N (no mtp_block)
    # and has no packed_modules_mapping, so the fused name itself must match.
    modules = adapter.load_spec.unquantized_modules
    for prefix in (f"model.layers.{base}.self_attn.kv_b_proj",
                   f"model.layers.{base}.self_attn.fused_qkv_a_proj",
                   f"model.layers.{base}.mlp.shared_experts.gate_up_proj",
                   f"model.layers.{base}.head"):  # SharedHead's ParallelLMHead prefix
        assert is_layer_skipped_gguf(prefix, modules), prefix
    assert not is_layer_skipped_gguf(f"model.layers.{base}.self_attn.q_b_proj", modules)
    assert not is_layer_skipped_gguf("model.embed_tokens", modules)
    assert {n.split(".")[2] for n in items if n.startswith("model.layers.")} == {str(base)}
    assert "model.embed_tokens.qweight" in items
    assert f"model.layers.{base}.eh_proj.weight" in items


def test_deepseek_v3_split_kv_b_round_trips_with_stub_model_config(tmp_path: Path) -> None:
    # Newer llama.cpp DeepSeek V2/V3 files (arch deepseek2) carry k_b/v_b too.
    tiny = make_tiny(DEEPSEEK_V3_CONFIG, seed=1)
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3_CONFIG))
    path = write_gguf(tmp_path / "ds.gguf", tiny)[0]
    assert "blk.1.attn_k_b.weight" in {t.name for t in read_header(path).tensors}
    _, items = load(path, tmp_path)
    got = decode(items)
    assert set(got) == set(tiny.sd), set(got) ^ set(tiny.sd)
    compare(tiny, got, tiny.sd)
    assert gguf_check.check(str(path), str(tmp_path), out=lambda _: None) == 0


# --- bad input: each error names the file and the tensor or key -------------


def _expect_load_error(path: Path, config_dir: Path, *fragments: str) -> None:
    with pytest.raises(GGUFLoadError) as info:
        load(path, config_dir)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_rejects_other_architecture_with_stub_model_config(
    tiny: Tiny, tiny_dir: Path, tmp_path: Path
) -> None:
    path = write_gguf(tmp_path / "llama.gguf", tiny, arch="llama")[0]
    _expect_load_error(path, tiny_dir, str(path), "'llama'", "glm-dsa")


def test_rejects_truncated_file_with_stub_model_config(tiny_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    path.write_bytes(data[: len(data) - 5000])
    _expect_load_error(path, tiny_gguf.parent, str(path), "truncated", "tensor ")


def test_rejects_split_set_with_missing_part_with_stub_model_config(
    tiny: Tiny, tmp_path: Path, tiny_dir: Path
) -> None:
    parts = write_gguf(tmp_path / "s.gguf", tiny, parts=3)
    parts[1].unlink()
    _expect_load_error(parts[0], tiny_dir, str(parts[1]), "missing")


def test_rejects_k_b_without_v_b_with_stub_model_config(
    tiny: Tiny, tiny_dir: Path, tmp_path: Path
) -> None:
    path = write_gguf(tmp_path / "nov.gguf", tiny, drop=["blk.1.attn_v_b.weight"])[0]
    _expect_load_error(path, tiny_dir, str(path), "blk.1.attn_k_b.weight",
                       "blk.1.attn_v_b.weight")


def test_rejects_head_count_mismatch_with_stub_model_config(
    tiny: Tiny, tiny_dir: Path, tmp_path: Path
) -> None:
    path = write_gguf(tmp_path / "heads.gguf", tiny, head_count=8)[0]
    _expect_load_error(path, tiny_dir, str(path), "head_count is 8", "says 4")
