"""Write a tiny GLM-5-layout GGUF (arch ``glm-dsa``) from a known HF state dict.

GLM-5's shape ratios at small size: 4 heads, 3 layers (layer 0 dense) plus one
MTP block, q_lora = 4 * kv_lora, hidden = 3 * q_lora, nope : rope : v =
3 : 1 : 4. GGUF names come from gguf-py's own llama.cpp tensor map, not from
the adapter under test, and kv_b is split the way llama.cpp's converter does
it. Tensors use a mix of F32, F16, BF16, Q8_0, Q4_0 and raw Q4_K blocks.

Usage: python tests/gguf/make_tiny_glm5_gguf.py OUT_DIR  (writes config.json
and tiny-glm5.gguf).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

CONFIG: dict[str, object] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 256,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 96,
    "qk_rope_head_dim": 32,
    "qk_head_dim": 128,
    "head_dim": 32,
    "v_head_dim": 128,
    "index_topk": 64,
    "index_n_heads": 2,
    "index_head_dim": 64,
    "num_hidden_layers": 3,
    "num_nextn_predict_layers": 1,
    "first_k_dense_replace": 1,
    "intermediate_size": 1536,
    "moe_intermediate_size": 256,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GGUF_NAME = "tiny-glm5.gguf"
ARCHES = {"glm_moe_dsa": gguf.MODEL_ARCH.GLM_DSA, "deepseek_v3": gguf.MODEL_ARCH.DEEPSEEK2}
# DeepSeek V3's layout at the same tiny size: no indexer, no MTP block.
DEEPSEEK_V3_CONFIG: dict[str, object] = {
    **{k: v for k, v in CONFIG.items() if not k.startswith("index_")},
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "num_nextn_predict_layers": 0,
}


def hf_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF checkpoint names and shapes of GLM-5 (experts listed one by one)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ql, kvl = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    ih, idim = cfg.get("index_n_heads", 0), cfg.get("index_head_dim", 0)
    vocab, n_exp, mi = cfg["vocab_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
           "lm_head.weight": (vocab, h)}
    n_layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    for b in range(n_layers):
        p, a = f"model.layers.{b}", f"model.layers.{b}.self_attn"
        out.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{a}.q_a_proj.weight": (ql, h), f"{a}.q_a_layernorm.weight": (ql,),
            f"{a}.q_b_proj.weight": (heads * (nope + rope), ql),
            f"{a}.kv_a_proj_with_mqa.weight": (kvl + rope, h),
            f"{a}.kv_a_layernorm.weight": (kvl,),
            f"{a}.kv_b_proj.weight": (heads * (nope + v), kvl),
            f"{a}.o_proj.weight": (h, heads * v),
        })
        if cfg.get("index_topk"):  # DSA indexer (GLM-5); DeepSeek V3 has none
            out.update({
                f"{a}.indexer.wq_b.weight": (ih * idim, ql), f"{a}.indexer.wk.weight": (idim, h),
                f"{a}.indexer.k_norm.weight": (idim,), f"{a}.indexer.k_norm.bias": (idim,),
                f"{a}.indexer.weights_proj.weight": (ih, h),
            })
        if b < cfg["first_k_dense_replace"]:
            i = cfg["intermediate_size"]
            out.update({f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                        f"{p}.mlp.down_proj.weight": (h, i)})
        else:
            out.update({f"{p}.mlp.gate.weight": (n_exp, h),
                        f"{p}.mlp.gate.e_score_correction_bias": (n_exp,)})
            for e in range(n_exp):
                x = f"{p}.mlp.experts.{e}"
                out.update({f"{x}.gate_proj.weight": (mi, h), f"{x}.up_proj.weight": (mi, h),
                            f"{x}.down_proj.weight": (h, mi)})
            s = f"{p}.mlp.shared_experts"
            out.update({f"{s}.gate_proj.weight": (mi, h), f"{s}.up_proj.weight": (mi, h),
                        f"{s}.down_proj.weight": (h, mi)})
        if b >= cfg["num_hidden_layers"]:
            out.update({f"{p}.eh_proj.weight": (h, 2 * h), f"{p}.enorm.weight": (h,),
                        f"{p}.hnorm.weight": (h,), f"{p}.shared_head.norm.weight": (h,),
                        f"{p}.shared_head.head.weight": (vocab, h)})
    return out


def ggml_type(gguf_name: str, shape: tuple[int, ...]) -> T:
    """The storage type of each tensor: a deliberate mix, valid for its row length."""
    block = int(gguf_name.split(".")[1]) if gguf_name.startswith("blk.") else -1
    if len(shape) == 1:
        return T.F32
    plan = {
        "token_embd": T.Q8_0, "output": T.Q4_K,
        "attn_q_a": T.Q8_0, "attn_q_b": T.Q4_0, "attn_kv_a_mqa": T.BF16,
        "attn_output": T.Q4_0, "indexer.attn_q_b": T.Q8_0, "indexer.attn_k": T.Q8_0,
        "indexer.proj": T.Q4_0, "ffn_gate_inp": T.F32,
        "ffn_gate_exps": T.Q4_K, "ffn_up_exps": T.Q4_K, "ffn_down_exps": T.Q8_0,
        "ffn_gate_shexp": T.BF16, "ffn_up_shexp": T.BF16, "ffn_down_shexp": T.F16,
        "ffn_gate": T.Q8_0, "ffn_up": T.Q8_0, "ffn_down": T.Q4_K,
        "nextn.eh_proj": T.Q8_0, "nextn.shared_head_head": T.BF16,
        # kv_b halves: exact F16 in blocks 0-1, lossy Q8_0 in block 2, BF16 in MTP
        "attn_k_b": (T.F16, T.F16, T.Q8_0, T.BF16)[block],
        "attn_v_b": (T.F16, T.F16, T.Q8_0, T.BF16)[block],
    }
    stem = gguf_name.removesuffix(".weight").removesuffix(".bias")
    stem = stem.split(".", 2)[2] if stem.startswith("blk.") else stem
    return plan[stem]


def random_q4_k(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Raw Q4_K bytes (gguf-py cannot quantize to K-quants): sane scales, random nibbles."""
    n_blocks = int(np.prod(shape)) // 256
    blocks = rng.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)
    scales = np.stack([rng.uniform(0.5e-3, 2e-3, n_blocks), rng.uniform(0, 1e-3, n_blocks)], 1)
    blocks[:, :4] = scales.astype(np.float16).view(np.uint8).reshape(n_blocks, 4)
    return blocks.reshape(*shape[:-1], shape[-1] // 256 * 144)


def gguf_name_of(cfg: dict, hf: str) -> str:
    """GGUF name of an HF tensor via gguf-py's map (experts: the stacked tensor,
    kv_b: its k_b half)."""
    n_layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    if hf.endswith("e_score_correction_bias"):  # not in gguf-py's map
        return f"blk.{hf.split('.')[2]}.exp_probs_b.bias"
    if hf.endswith("kv_b_proj.weight"):
        return f"blk.{hf.split('.')[2]}.attn_k_b.weight"
    if ".mlp.experts." in hf:
        pre, rest = hf.split(".mlp.experts.", 1)
        hf = f"{pre}.mlp.experts.{rest.split('.', 1)[1]}"
    arch = ARCHES[cfg["model_type"]]
    mapped = _name_map(arch, n_layers).get_name(hf, try_suffixes=(".weight", ".bias"))
    if mapped is None:
        raise KeyError(f"gguf-py has no GGUF name for {hf}")
    return mapped


@functools.cache
def _name_map(arch: gguf.MODEL_ARCH, n_layers: int) -> gguf.TensorNameMap:
    return gguf.get_tensor_name_map(arch, n_layers)


def to_gguf_layout(cfg: dict, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF tensors -> GGUF tensors: stacked experts, split kv_b (the converter's way)."""
    heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, list[torch.Tensor]] = {}
    for hf, value in sd.items():
        name = gguf_name_of(cfg, hf)
        if ".mlp.experts." in hf:
            stacks.setdefault(name, []).append(value)
        elif hf.endswith("kv_b_proj.weight"):
            kv = value.view(heads, -1, value.shape[1])
            k_b, v_b = kv.split([nope, kv.shape[1] - nope], dim=1)
            out[name] = k_b.transpose(1, 2).contiguous()
            out[name.replace("attn_k_b", "attn_v_b")] = v_b.contiguous()
        else:
            out[name] = value
    for name, experts in stacks.items():
        out[name] = torch.stack(experts)
    return out


@dataclass
class Tiny:
    """A tiny model: HF tensors as the file stores them, plus raw Q4_K bytes."""

    cfg: dict
    sd: dict[str, torch.Tensor]  # float32; exact for F16/BF16/Q4_K storage
    q4k: dict[str, np.ndarray] = field(default_factory=dict)  # GGUF name -> blocks


def make_tiny(cfg: dict = CONFIG, seed: int = 0) -> Tiny:
    """Random HF tensors, rounded to what their storage type holds exactly.

    Q4_K tensors take the dequantized value of their random raw blocks; Q8_0
    and Q4_0 tensors stay float32 (lossy on purpose).
    """
    gen = torch.Generator().manual_seed(seed)
    sd = {n: torch.randn(s, generator=gen) * 0.05 for n, s in hf_shapes(cfg).items()}
    for n in sd:
        if n.endswith(("norm.weight", "k_norm.bias")):
            sd[n] = 1.0 + sd[n]
    rng = np.random.default_rng(seed)
    layout = to_gguf_layout(cfg, sd)
    q4k = {}
    for g, value in layout.items():
        t = ggml_type(g, tuple(value.shape))
        if t == T.F16:
            layout[g] = value.half().float()
        elif t == T.BF16:
            layout[g] = value.bfloat16().float()
        elif t == T.Q4_K:
            q4k[g] = random_q4_k(tuple(value.shape), rng)
            deq = gguf.quants.dequantize(q4k[g], T.Q4_K).reshape(value.shape)
            layout[g] = torch.from_numpy(deq.copy())
    return Tiny(cfg, from_gguf_layout(cfg, layout), q4k)


def from_gguf_layout(cfg: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of to_gguf_layout, used to carry storage rounding back to HF names."""
    shapes = hf_shapes(cfg)
    out: dict[str, torch.Tensor] = {}
    for hf in shapes:
        name = gguf_name_of(cfg, hf)
        if ".mlp.experts." in hf:
            out[hf] = tensors[name][int(hf.split(".mlp.experts.")[1].split(".")[0])]
        elif hf.endswith("kv_b_proj.weight"):
            k_b, v_b = tensors[name], tensors[name.replace("attn_k_b", "attn_v_b")]
            out[hf] = torch.cat([k_b.transpose(1, 2), v_b], 1).reshape(shapes[hf])
        else:
            out[hf] = tensors[name]
    return out


def storage_type(cfg: dict, hf: str, shape: tuple[int, ...]) -> T:
    """The GGML type the file stores HF tensor *hf* (of *shape*) in."""
    return ggml_type(gguf_name_of(cfg, hf), shape)


def encode(value: torch.Tensor, t: T, raw: np.ndarray | None) -> np.ndarray:
    arr = value.float().numpy()
    if t == T.Q4_K:
        assert raw is not None
        return raw
    if t == T.F32:
        return arr.astype(np.float32)
    if t == T.F16:
        return arr.astype(np.float16)
    return gguf.quants.quantize(arr, t)  # BF16, Q8_0, Q4_0 -> raw bytes


def write_gguf(path: Path, tiny: Tiny, drop: Iterable[str] = (),
               reshape: dict[str, tuple[int, ...]] | None = None,
               parts: int = 1, head_count: int | None = None,
               arch: str | None = None, extra: Iterable[str] = ()) -> list[Path]:
    """Write the GGUF (optionally split into *parts*); returns the files written.

    *drop*, *reshape*, *head_count*, *arch* and *extra* (names of surplus F32
    tensors) make deliberately broken files.
    """
    cfg, raw = tiny.cfg, tiny.q4k
    tensors = to_gguf_layout(cfg, tiny.sd)
    for name in drop:
        del tensors[name]
    for name, shape in (reshape or {}).items():
        tensors[name] = tensors[name].reshape(shape)
    names = list(tensors) + list(extra)
    chunks = [names[i::parts] for i in range(parts)]
    files = []
    for i, chunk in enumerate(chunks):
        out = path if parts == 1 else path.with_name(
            f"{path.stem}-{i + 1:05d}-of-{parts:05d}.gguf")
        w = gguf.GGUFWriter(str(out), arch or gguf.MODEL_ARCH_NAMES[ARCHES[cfg["model_type"]]])
        if i == 0:
            _metadata(w, cfg, head_count)
        if parts > 1:
            w.add_uint16("split.no", i)
            w.add_uint16("split.count", parts)
        for name in chunk:
            if name in extra:
                w.add_tensor(name, np.ones(32, dtype=np.float32))
                continue
            value = tensors[name]
            t = ggml_type(name, tuple(value.shape))
            w.add_tensor(name, encode(value, t, raw.get(name)),
                         raw_dtype=None if t in (T.F32, T.F16) else t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        files.append(out)
    return files


def _metadata(w: gguf.GGUFWriter, cfg: dict, head_count: int | None) -> None:
    w.add_block_count(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_head_count(head_count or cfg["num_attention_heads"])
    w.add_uint32(f"{w.arch}.nextn_predict_layers", cfg["num_nextn_predict_layers"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0] if argv else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    write_gguf(out_dir / GGUF_NAME, make_tiny())
    print(out_dir / GGUF_NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
