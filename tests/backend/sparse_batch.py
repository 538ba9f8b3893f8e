"""A DSA batch as vLLM hands it to a sparse-MLA backend, built with torch only.

Shared by the CPU-tier checks (real vLLM, Triton interpreted) and the GPU test
(no vLLM on the device), so both feed the backend the same layouts:

- requests reordered decode-first, as the runner does for sparse MLA: plain
  decodes, MTP verification rows (query_len > 1), then a chunked and a fresh
  prefill;
- a block table of shuffled physical blocks (unused entries 0, as vLLM pads);
- a paged MLA cache [num_blocks, block_size, 576] whose block stride is wider
  than block_size rows, as when other layers' pages sit in between;
- the indexer's top-k buffer: per query token, positions in its own request
  that the token may see (causal), shuffled, -1 where fewer than top-k exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

D_QK = 576
D_V = 512


@dataclass
class SparseBatch:
    query_lens: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    kv_cache: torch.Tensor  # [num_blocks, block_size, 576], block stride > block_size rows
    topk: torch.Tensor  # int32 [num_tokens, topk] request-local positions, -1 = none
    req_id_per_token: torch.Tensor  # int32 [num_tokens]
    q: torch.Tensor  # [num_tokens, heads, 576]

    @property
    def block_size(self) -> int:
        return self.kv_cache.shape[1]

    @property
    def query_start_loc(self) -> torch.Tensor:
        lens = torch.tensor([0, *self.query_lens], dtype=torch.int32)
        return torch.cumsum(lens, 0, dtype=torch.int32)


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    heads: int,
    topk: int,
    block_size: int = 64,
    spare_blocks: int = 3,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> SparseBatch:
    g = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_req) + 1  # a padded column the remap must not read
    num_blocks = sum(blocks_per_req) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for r, n in enumerate(blocks_per_req):
        block_table[r, :n] = perm[used : used + n]
        used += n

    # Twice the rows per block, then the first half: block stride 2 * block_size.
    backing = torch.randn(num_blocks, 2 * block_size, D_QK, generator=g).to(dtype)
    kv_cache = backing[:, :block_size]

    rows, reqs = [], []
    for r, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for i in range(ql):
            visible = sl - ql + i + 1  # causal: positions [0, visible)
            pos = torch.randperm(visible, generator=g)[:topk]  # all of them when visible <= topk
            row = torch.full((topk,), -1, dtype=torch.int32)
            row[: pos.numel()] = pos.to(torch.int32)
            rows.append(row)
            reqs.append(r)
    q = (torch.randn(len(rows), heads, D_QK, generator=g) * 0.5).to(dtype)
    return SparseBatch(
        query_lens=query_lens,
        seq_lens=seq_lens,
        block_table=block_table,
        kv_cache=kv_cache,
        topk=torch.stack(rows),
        req_id_per_token=torch.tensor(reqs, dtype=torch.int32),
        q=q,
    )


def expected_slots(batch: SparseBatch, block_stride_rows: int) -> torch.Tensor:
    """Global row of every top-k entry, worked out one entry at a time."""
    out = torch.full_like(batch.topk, -1)
    bs = batch.block_size
    for t in range(batch.topk.shape[0]):
        r = int(batch.req_id_per_token[t])
        for j, p in enumerate(batch.topk[t].tolist()):
            if p >= 0:
                out[t, j] = int(batch.block_table[r, p // bs]) * block_stride_rows + p % bs
    return out


def reference_attention(
    batch: SparseBatch, scale: float, kv_scale: float = 1.0, kv_cache: torch.Tensor | None = None
) -> torch.Tensor:
    """float64 softmax(q k^T) v over each token's selected positions: [T, H, 512]."""
    cache = batch.kv_cache if kv_cache is None else kv_cache
    flat = cache.to(torch.float64).reshape(-1, D_QK) * kv_scale  # compact rows: block * bs + off
    slots = expected_slots(batch, batch.block_size)
    out = torch.zeros(batch.q.shape[0], batch.q.shape[1], D_V, dtype=torch.float64)
    for t in range(batch.q.shape[0]):
        sel = slots[t][slots[t] >= 0].long()
        k = flat[sel]
        s = batch.q[t].to(torch.float64) @ k.T * scale
        out[t] = torch.softmax(s, dim=-1) @ k[:, :D_V]
    return out
