"""Save the hf_tiny model (seed 0, float32) as a checkpoint vLLM can load, plus HF greedy tokens."""
import json, sys, torch
sys.path.insert(0, "/tmp/dsa-research")
import hf_tiny
torch.set_num_threads(1)
out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dsa-research/tiny_hf"
plen = int(sys.argv[2]) if len(sys.argv) > 2 else 40
import os
over = {}
if os.environ.get("TOPK"): over["index_topk"] = int(os.environ["TOPK"])
if os.environ.get("NHEADS"): over["index_n_heads"] = int(os.environ["NHEADS"])
if os.environ.get("FP8EMU"):
    # Emulate vLLM's indexer numerics: q per (token, head) and k per token quantized to
    # fp8 e4m3 with power-of-two (ue8m0) scales over 128-wide groups, then dequantized.
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mod
    def fq(x, eps):
        g = x.float().unflatten(-1, (-1, 128))
        sc = torch.exp2(torch.ceil(torch.log2(g.abs().amax(-1, keepdim=True).clamp(min=eps) / 448.0)))
        return ((g / sc).clamp(-448, 448).to(torch.float8_e4m3fn).float() * sc).flatten(-2).to(x.dtype)
    orig_cat = torch.cat
    orig_fwd = mod.GlmMoeDsaIndexer.forward
    def fwd(self, *a, **k):
        def cat(ts, dim=0, **kw):
            out = orig_cat(ts, dim=dim, **kw)
            if out.shape[-1] == self.head_dim:
                out = fq(out, 1e-4 if out.shape[-2] == 1 else 1e-10)  # k [B,S,1,D] / q [B,S,H,D]
            return out
        torch.cat = cat
        try:
            return orig_fwd(self, *a, **k)
        finally:
            torch.cat = orig_cat
    mod.GlmMoeDsaIndexer.forward = fwd
model = hf_tiny.build(**over)
model.config.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid",
                     "indexer_rope_interleave": True, "num_nextn_predict_layers": 0})
# non-trivial router bias so the noaux_tc path matters
with torch.no_grad():
    for l in model.model.layers:
        g = getattr(l.mlp, "gate", None)
        if g is not None:
            g.e_score_correction_bias.uniform_(-0.05, 0.05)
model.save_pretrained(out, safe_serialization=True)
torch.manual_seed(1)
prompt = torch.randint(1, 512, (1, plen))
toks, wall = hf_tiny.generate(model, prompt)
json.dump({"prompt": prompt[0].tolist(), "hf_tokens": toks}, open(out + "/hf_ref.json", "w"))
print("saved", out, "hf tokens", toks, f"{wall:.2f}s")
from safetensors import safe_open
with safe_open(out + "/model.safetensors", "pt") as f:
    ks = sorted(f.keys())
print(len(ks), "tensors;", [k for k in ks if "layers.1." in k][:40])
