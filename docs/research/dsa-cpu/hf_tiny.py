"""Tiny random GLM-5 (glm_moe_dsa) in transformers 5.19 on CPU, float32.

Builds a 2-layer model (1 dense + 1 MoE layer, 8 experts), seeded with
torch.manual_seed(0), greedy-generates 16 tokens after a 40-token prompt and
reports wall time, indexer use (hook call counts, top-k shape) and whether the
top-k actually changes the result (index_topk=16 vs a dense index_topk=4096).

Run: /work/main/.venv/bin/python /tmp/dsa-research/hf_tiny.py [--threads N]
"""

from __future__ import annotations

import argparse
import inspect
import time

import torch
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mod

TINY = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    first_k_dense_replace=1,  # layer 0 dense MLP, layer 1 MoE
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=64,
    v_head_dim=64,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    index_topk=16,
    index_n_heads=2,
    # 128, not 64: vLLM's indexer quantizes k in blocks of 128 (quant_block_size)
    # and sizes its cache row as head_dim + head_dim // 128 * 4 bytes.
    index_head_dim=128,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=None,  # never stop early: always 16 new tokens
    pad_token_id=None,
)


def build(**over) -> GlmMoeDsaForCausalLM:
    torch.manual_seed(0)
    cfg = GlmMoeDsaConfig(**{**TINY, **over})
    cfg._attn_implementation = "eager"
    model = GlmMoeDsaForCausalLM(cfg).to(torch.float32).eval()
    return model


def generate(model, prompt, n=16):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True
        )
    return out[0, prompt.shape[1]:].tolist(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    print("transformers", transformers.__version__, "torch", torch.__version__)
    print("\n== GlmMoeDsaConfig() defaults ==")
    print(GlmMoeDsaConfig().to_json_string(use_diff=False))
    print("config fields:", sorted(GlmMoeDsaConfig.__dataclass_fields__) if hasattr(
        GlmMoeDsaConfig, "__dataclass_fields__") else "n/a")

    model = build()
    cfg = model.config
    print("\n== tiny config ==")
    print(cfg.to_json_string(use_diff=True))
    print("indexer_types:", cfg.indexer_types, "mlp_layer_types:", cfg.mlp_layer_types)
    print("params:", sum(p.numel() for p in model.parameters()))
    print("dtype:", next(model.parameters()).dtype)

    calls: list[tuple[int, tuple[int, ...]]] = []
    for i, layer in enumerate(model.model.layers):
        idx = layer.self_attn.indexer
        if idx is not None:
            idx.register_forward_hook(
                lambda m, a, out, i=i: calls.append((i, tuple(out.shape)))
            )

    torch.manual_seed(1)
    prompt = torch.randint(1, TINY["vocab_size"], (1, 40))
    tokens, wall = generate(model, prompt)
    print("\n== greedy generate (40-token prompt, 16 new) ==")
    print("tokens:", tokens)
    print(f"wall: {wall:.3f} s ({args.threads} thread(s))")
    print("indexer calls:", len(calls), "first:", calls[:2], "last:", calls[-1:])

    # Prefill logits for the prompt: sparse top-16 vs dense (top-k >= seq).
    with torch.no_grad():
        sparse_logits = model(prompt).logits
        dense = build(index_topk=4096)
        dense_logits = dense(prompt).logits
        dense_tokens, _ = generate(dense, prompt)
    diff = (sparse_logits - dense_logits).abs()
    print("\n== does top-k matter? ==")
    print("max |logits(topk=16) - logits(topk=4096)| over the 40 prompt rows:",
          f"{diff.max().item():.4e}")
    print("rows 0..15 (<= topk visible tokens) max diff:", f"{diff[0, :16].max().item():.4e}")
    print("rows 16..39 max diff:", f"{diff[0, 16:].max().item():.4e}")
    print("dense tokens:", dense_tokens, "same as sparse:", dense_tokens == tokens)

    # An unknown key is accepted (and kept) by the config, but the modeling code
    # never reads it: the indexer RoPE is always interleaved.
    c2 = GlmMoeDsaConfig(**TINY, indexer_rope_interleave=False)
    print("\nindexer_rope_interleave kept on config:", getattr(c2, "indexer_rope_interleave", "<dropped>"))
    src = inspect.getsource(mod.GlmMoeDsaIndexer.forward)
    print("indexer forward uses apply_rotary_pos_emb_interleave:",
          "apply_rotary_pos_emb_interleave" in src,
          "| reads indexer_rope_interleave / config:", "indexer_rope_interleave" in src, "config." in src)


if __name__ == "__main__":
    main()
