"""Tiny MLA model folders (config.json only) for the backend checks: GLM-5-shaped
(DSA sparse MLA) or DeepSeek-V2-shaped (dense MLA), small enough for the CPU tier."""

from __future__ import annotations

import json
from pathlib import Path


def tiny_mla_model(folder: Path, *, sparse: bool, heads: int = 4, topk: int = 2048) -> Path:
    """Write config.json into folder (created) and return it.

    topk defaults to GLM-5's 2048, the only value FLASHINFER_MLA_SPARSE_SM120 takes."""
    cfg: dict[str, object] = {
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": 64,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 64,
        "v_head_dim": 32,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "intermediate_size": 128,
        "moe_intermediate_size": 64,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    if sparse:
        cfg |= {
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "index_topk": topk,
            "index_n_heads": 2,
            "index_head_dim": 128,
            "num_nextn_predict_layers": 0,
        }
    else:
        cfg |= {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder
