# SPDX-License-Identifier: Apache-2.0
"""GGUF tensor layout of MLA models (llama.cpp ``glm-dsa`` and ``deepseek2``).

One table serves the loader and the preflight check: for every GGUF tensor it
gives the checkpoint name vLLM 0.32 loads (``DeepseekV2Model.load_weights``,
``deepseek_v32/nvidia/model.py`` and the MTP loaders in ``deepseek_mtp.py`` /
``deepseek_v32/nvidia/mtp.py``), the expected numpy-order shape, and whether
vLLM keeps that parameter unquantized. Standard library only, so the preflight
command can load this file without importing vLLM or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# model_type values whose weights come from these GGUF architectures;
# deepseek_mtp is what vLLM's speculative config renames GLM-5 / DeepSeek to.
MODEL_TYPE_ARCHES: dict[str, tuple[str, ...]] = {
    "glm_moe_dsa": ("glm-dsa",),
    "deepseek_v2": ("deepseek2",),
    "deepseek_v3": ("deepseek2",),
    "deepseek_v32": ("deepseek2", "glm-dsa"),
    "deepseek_mtp": ("deepseek2", "glm-dsa"),
}


@dataclass(frozen=True)
class Slot:
    """Where one GGUF tensor goes."""

    hf_name: str
    shape: tuple[int, ...]  # numpy order, experts stacked on dim 0
    unquantized: bool = False  # vLLM builds this parameter without quant_config
    optional: bool = False  # vLLM can do without it (tied / shared from target)
    kv_part: str | None = None  # "k" / "v" for the split kv_b form


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def spec_layer_base(cfg: Any) -> int:
    return int(cfg_get(cfg, "num_hidden_layers"))


def num_blocks(cfg: Any) -> int:
    return spec_layer_base(cfg) + int(cfg_get(cfg, "num_nextn_predict_layers", 0) or 0)


def _attention(cfg: Any, b: int, pre: str, hf: str) -> dict[str, Slot]:
    hidden = int(cfg_get(cfg, "hidden_size"))
    heads = int(cfg_get(cfg, "num_attention_heads"))
    nope = int(cfg_get(cfg, "qk_nope_head_dim"))
    rope = int(cfg_get(cfg, "qk_rope_head_dim"))
    v_dim = int(cfg_get(cfg, "v_head_dim"))
    kv_lora = int(cfg_get(cfg, "kv_lora_rank"))
    q_lora = cfg_get(cfg, "q_lora_rank")
    a = f"{hf}.self_attn"
    s: dict[str, Slot] = {
        f"{pre}.attn_norm.weight": Slot(f"{hf}.input_layernorm.weight", (hidden,), True),
        f"{pre}.attn_kv_a_mqa.weight": Slot(
            f"{a}.kv_a_proj_with_mqa.weight", (kv_lora + rope, hidden)
        ),
        f"{pre}.attn_kv_a_norm.weight": Slot(
            f"{a}.kv_a_layernorm.weight", (kv_lora,), True
        ),
        # Either the fused kv_b or the split k_b + v_b form fills kv_b_proj.
        f"{pre}.attn_kv_b.weight": Slot(
            f"{a}.kv_b_proj.weight", (heads * (nope + v_dim), kv_lora), optional=True
        ),
        f"{pre}.attn_k_b.weight": Slot(
            f"{a}.kv_b_proj.weight", (heads, kv_lora, nope), True, True, "k"
        ),
        f"{pre}.attn_v_b.weight": Slot(
            f"{a}.kv_b_proj.weight", (heads, v_dim, kv_lora), True, True, "v"
        ),
        f"{pre}.attn_output.weight": Slot(f"{a}.o_proj.weight", (hidden, heads * v_dim)),
    }
    if q_lora:
        q_lora = int(q_lora)
        s[f"{pre}.attn_q_a.weight"] = Slot(f"{a}.q_a_proj.weight", (q_lora, hidden))
        s[f"{pre}.attn_q_a_norm.weight"] = Slot(
            f"{a}.q_a_layernorm.weight", (q_lora,), True
        )
        s[f"{pre}.attn_q_b.weight"] = Slot(
            f"{a}.q_b_proj.weight", (heads * (nope + rope), q_lora)
        )
    else:
        s[f"{pre}.attn_q.weight"] = Slot(f"{a}.q_proj.weight", (heads * (nope + rope), hidden))
    if cfg_get(cfg, "index_topk"):
        # DSA lightning indexer; wk and weights_proj feed vLLM's unquantized
        # wk_weights_proj (quant_config=None), k_norm is an fp32 LayerNorm.
        ih, idim = int(cfg_get(cfg, "index_n_heads")), int(cfg_get(cfg, "index_head_dim"))
        i = f"{a}.indexer"
        s[f"{pre}.indexer.attn_q_b.weight"] = Slot(f"{i}.wq_b.weight", (ih * idim, int(q_lora)))
        s[f"{pre}.indexer.attn_k.weight"] = Slot(f"{i}.wk.weight", (idim, hidden), True)
        s[f"{pre}.indexer.k_norm.weight"] = Slot(f"{i}.k_norm.weight", (idim,), True)
        s[f"{pre}.indexer.k_norm.bias"] = Slot(f"{i}.k_norm.bias", (idim,), True)
        s[f"{pre}.indexer.proj.weight"] = Slot(f"{i}.weights_proj.weight", (ih, hidden), True)
    return s


def _mlp(cfg: Any, b: int, pre: str, hf: str) -> dict[str, Slot]:
    hidden = int(cfg_get(cfg, "hidden_size"))
    m = f"{hf}.mlp"
    s = {f"{pre}.ffn_norm.weight": Slot(f"{hf}.post_attention_layernorm.weight", (hidden,), True)}
    freq = int(cfg_get(cfg, "moe_layer_freq", 1) or 1)
    n_exp = cfg_get(cfg, "n_routed_experts")
    if not n_exp or b < int(cfg_get(cfg, "first_k_dense_replace", 0)) or b % freq:
        inter = int(cfg_get(cfg, "intermediate_size"))
        s[f"{pre}.ffn_gate.weight"] = Slot(f"{m}.gate_proj.weight", (inter, hidden))
        s[f"{pre}.ffn_up.weight"] = Slot(f"{m}.up_proj.weight", (inter, hidden))
        s[f"{pre}.ffn_down.weight"] = Slot(f"{m}.down_proj.weight", (hidden, inter))
        return s
    n_exp, inter = int(n_exp), int(cfg_get(cfg, "moe_intermediate_size"))
    # The router (GateLinear) and its bias are built without quant_config.
    s[f"{pre}.ffn_gate_inp.weight"] = Slot(f"{m}.gate.weight", (n_exp, hidden), True)
    if cfg_get(cfg, "topk_method") == "noaux_tc":
        s[f"{pre}.exp_probs_b.bias"] = Slot(
            f"{m}.gate.e_score_correction_bias", (n_exp,), True
        )
    # Stacked experts under expert 0; the adapter splits them per expert.
    e = f"{m}.experts.0"
    s[f"{pre}.ffn_gate_exps.weight"] = Slot(f"{e}.gate_proj.weight", (n_exp, inter, hidden))
    s[f"{pre}.ffn_up_exps.weight"] = Slot(f"{e}.up_proj.weight", (n_exp, inter, hidden))
    s[f"{pre}.ffn_down_exps.weight"] = Slot(f"{e}.down_proj.weight", (n_exp, hidden, inter))
    shared = int(cfg_get(cfg, "n_shared_experts", 0) or 0)
    if shared:
        sh, si = f"{m}.shared_experts", inter * shared
        s[f"{pre}.ffn_gate_shexp.weight"] = Slot(f"{sh}.gate_proj.weight", (si, hidden))
        s[f"{pre}.ffn_up_shexp.weight"] = Slot(f"{sh}.up_proj.weight", (si, hidden))
        s[f"{pre}.ffn_down_shexp.weight"] = Slot(f"{sh}.down_proj.weight", (hidden, si))
    return s


def _nextn(cfg: Any, pre: str, hf: str) -> dict[str, Slot]:
    hidden, vocab = int(cfg_get(cfg, "hidden_size")), int(cfg_get(cfg, "vocab_size"))
    n = f"{pre}.nextn"
    return {
        # eh_proj is a plain nn.Linear in vLLM's MTP layer.
        f"{n}.eh_proj.weight": Slot(f"{hf}.eh_proj.weight", (hidden, 2 * hidden), True),
        f"{n}.enorm.weight": Slot(f"{hf}.enorm.weight", (hidden,), True),
        f"{n}.hnorm.weight": Slot(f"{hf}.hnorm.weight", (hidden,), True),
        f"{n}.shared_head_norm.weight": Slot(f"{hf}.shared_head.norm.weight", (hidden,), True),
        # vLLM's MTP proposer shares these two from the target model.
        f"{n}.shared_head_head.weight": Slot(
            f"{hf}.shared_head.head.weight", (vocab, hidden), optional=True
        ),
        f"{n}.embed_tokens.weight": Slot(
            f"{hf}.embed_tokens.weight", (vocab, hidden), optional=True
        ),
    }


def build_layout(cfg: Any, spec_only: bool = False) -> dict[str, Slot]:
    """GGUF tensor name -> Slot for the whole model (MTP blocks included).

    ``spec_only`` keeps what vLLM's MTP draft loader reads: the nextn blocks
    and the token embedding it may copy.
    """
    hidden, vocab = int(cfg_get(cfg, "hidden_size")), int(cfg_get(cfg, "vocab_size"))
    tied = bool(cfg_get(cfg, "tie_word_embeddings", False))
    layout = {
        "token_embd.weight": Slot("model.embed_tokens.weight", (vocab, hidden)),
    }
    if not spec_only:
        layout["output_norm.weight"] = Slot("model.norm.weight", (hidden,), True)
        layout["output.weight"] = Slot("lm_head.weight", (vocab, hidden), optional=tied)
    base = spec_layer_base(cfg)
    for b in range(base if spec_only else 0, num_blocks(cfg)):
        pre, hf = f"blk.{b}", f"model.layers.{b}"
        layout.update(_attention(cfg, b, pre, hf))
        layout.update(_mlp(cfg, b, pre, hf))
        if b >= base:
            layout.update(_nextn(cfg, pre, hf))
    return layout


# vLLM fuses these checkpoint modules into one layer (stacked_params_mapping).
_FUSED_INTO = {"q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def module_names(hf_name: str, spec_base: int, draft: bool) -> list[str]:
    """Module prefixes a quant config must list to keep *hf_name* unquantized.

    The fused layer's own name is listed too: the MTP draft model has no
    packed_modules_mapping, so is_layer_skipped_gguf matches it by substring.
    MTP blocks exist only in the draft (the main model skips them). There vLLM
    names parameters ``model.layers.N.mtp_block.*`` but builds the layers with
    prefix ``model.layers.N`` (both are listed), keeps embed_tokens at the top
    level and prefixes the shared head ``model.layers.N.head``.
    """
    module = hf_name.rsplit(".", 1)[0]
    parent, _, leaf = module.rpartition(".")
    names = [module]
    if leaf in _FUSED_INTO:
        names.append(f"{parent}.{_FUSED_INTO[leaf]}")
    parts = module.split(".")
    if not (len(parts) > 3 and parts[:2] == ["model", "layers"] and int(parts[2]) >= spec_base):
        return names
    if not draft:
        return []
    layer = ".".join(parts[:3])
    if module.endswith(".embed_tokens"):
        return ["model.embed_tokens"]
    if module.endswith(".shared_head.head"):
        return [f"{layer}.head"]
    if leaf in ("eh_proj", "enorm", "hnorm") or ".shared_head." in module:
        return names
    return names + [n.replace(f"{layer}.", f"{layer}.mtp_block.", 1) for n in names]


@dataclass
class Audit:
    """Gaps between a GGUF tensor set and the layout; empty lists mean it loads."""

    unmapped: list[str]  # GGUF tensors that map to nothing
    unfilled: list[str]  # parameters nothing fills, with the tensor(s) expected
    shape_errors: list[str]

    @property
    def ok(self) -> bool:
        return not (self.unmapped or self.unfilled or self.shape_errors)

    def lines(self) -> list[str]:
        return (
            [f"unmapped GGUF tensor: {n}" for n in self.unmapped]
            + [f"unfilled parameter: {n}" for n in self.unfilled]
            + [f"shape mismatch: {n}" for n in self.shape_errors]
        )


def audit(
    layout: Mapping[str, Slot],
    present: Mapping[str, tuple[int, ...]],
    report_unmapped: bool = True,
) -> Audit:
    """Compare *present* (GGUF name -> numpy shape) with *layout*."""
    unmapped = sorted(n for n in present if n not in layout) if report_unmapped else []
    shape_errors = [
        f"{n}: file {list(present[n])}, expected {list(s.shape)} for {s.hf_name}"
        for n, s in layout.items()
        if n in present and tuple(present[n]) != s.shape
    ]
    groups: dict[str, list[tuple[str, Slot]]] = {}
    for name, slot in layout.items():
        groups.setdefault(slot.hf_name, []).append((name, slot))
    unfilled: list[str] = []
    for hf_name, members in groups.items():
        whole = [n for n, s in members if s.kv_part is None]
        split = {s.kv_part: n for n, s in members if s.kv_part}
        if any(n in present for n in whole):
            continue
        have = {part for part, n in split.items() if n in present}
        if split and have and have != set(split):
            gone = [split[p] for p in sorted(set(split) - have)]
            there = [split[p] for p in sorted(have)]
            unfilled.append(f"{hf_name} ({', '.join(there)} present without {', '.join(gone)})")
        elif not have and (split or not all(s.optional for _, s in members)):
            wanted = whole if not split else [*whole, " + ".join(split.values())]
            unfilled.append(f"{hf_name} (needs {' or '.join(wanted)})")
    return Audit(unmapped, unfilled, shape_errors)


def header_errors(fields: Mapping[str, Any], cfg: Any, path: str) -> list[str]:
    """Metadata that contradicts the HF config: architecture, head and block counts."""
    model_type = cfg_get(cfg, "model_type")
    arch = fields.get("general.architecture")
    allowed = MODEL_TYPE_ARCHES.get(str(model_type), ())
    if arch not in allowed:
        return [f"{path}: GGUF architecture is {arch!r}, but the config's model_type "
                f"{model_type!r} needs one of {list(allowed)}"]
    errors = []
    checks = {
        "attention.head_count": int(cfg_get(cfg, "num_attention_heads")),
        "block_count": num_blocks(cfg),
        "embedding_length": int(cfg_get(cfg, "hidden_size")),
    }
    for key, want in checks.items():
        got = fields.get(f"{arch}.{key}")
        if isinstance(got, int) and not isinstance(got, bool) and got != want:
            errors.append(f"{path}: {arch}.{key} is {got}, the config says {want}")
    return errors


def pairing_errors(types: Mapping[str, str]) -> list[str]:
    """Tensor-type combinations the plugin's kernels cannot run.

    GGUFMoEMethod fuses gate and up experts into one w13 buffer and computes it
    with a single quant type, so both must share their GGML type.
    """
    errors = []
    for name, gate_type in types.items():
        if not name.endswith(".ffn_gate_exps.weight"):
            continue
        up = name.replace(".ffn_gate_exps.", ".ffn_up_exps.")
        if up in types and types[up] != gate_type:
            errors.append(f"{name} is {gate_type} but {up} is {types[up]}; "
                          "fused MoE needs one type for gate and up")
    return errors
