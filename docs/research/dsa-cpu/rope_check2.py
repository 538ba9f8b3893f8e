import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
torch.manual_seed(0); T, H = 7, 4
with set_current_vllm_config(VllmConfig()):
    rope = get_rope(64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, is_neox_style=False)
    pos = torch.arange(T) + 3
    def run(name, q, k):
        qn, kn = rope.forward_native(pos, q.clone(), k.clone())
        qc, kc = rope.forward_cpu(pos, q.clone() if q.is_contiguous() else q, k.clone() if k.is_contiguous() else k)
        print(f"{name:44s} q err {(qc.reshape(qn.shape)-qn).abs().max():.2e}  k err {(kc.reshape(kn.shape)-kn).abs().max():.2e}")
    run("contiguous q [T,H*64], k [T,64]", torch.randn(T, H * 64), torch.randn(T, 64))
    run("contiguous q [T,H,64], k [T,1,64]", torch.randn(T, H, 64), torch.randn(T, 1, 64))
    big = torch.randn(T, H, 128); kb = torch.randn(T, 704)
    run("MLA: q[...,64:] of [T,H,128], k_pe [T,1,64]/704", big[..., 64:], kb[:, 640:].unsqueeze(1))
    big2 = torch.randn(T, H, 128); kb2 = torch.randn(T, 128)
    run("indexer: q[...,:64] of [T,H,128], k [T,1,64]/128", big2[..., :64], kb2[:, :64].unsqueeze(1))
