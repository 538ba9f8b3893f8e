import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
from transformers import GlmMoeDsaConfig
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mod
torch.manual_seed(0)
T, H = 9, 3
cfg = GlmMoeDsaConfig(qk_rope_head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, num_hidden_layers=1)
hf_rope = mod.GlmMoeDsaRotaryEmbedding(cfg)
pos = torch.arange(T)[None]
q = torch.randn(1, T, H, 64); k = torch.randn(1, T, 1, 64)
cos, sin = hf_rope(q, pos)
qh, kh = mod.apply_rotary_pos_emb_interleave(q, k, cos, sin, unsqueeze_dim=2)
hf_scores = torch.einsum("bshd,btd->bsht", qh, kh[:, :, 0])
with set_current_vllm_config(VllmConfig()):
    for neox in (False, True):
        rope = get_rope(64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, is_neox_style=neox)
        qv, kv = rope.forward_native(pos[0], q[0].clone(), k[0].clone())
        vs = torch.einsum("shd,td->sht", qv.reshape(T, H, 64), kv.reshape(T, 64))
        print("is_neox_style", neox, "max |q.k(vllm) - q.k(hf interleaved)| =", (vs - hf_scores[0]).abs().max().item())
