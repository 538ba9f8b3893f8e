# SPDX-License-Identifier: Apache-2.0
"""Sparse MLA, the portable Triton family: the split kernel and the merge kernel.

Every part runs these (on SM120 they are the only kernels; on SM90 the lone-token
cells and the fallbacks). The API, the config tables and the choice between the
families are in triton_sparse_mla.py; the SM90 Gluon family in triton_sparse_mla_sm90.py.
The MLA shapes every family shares are defined here. Imports only triton.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (SM90+); Triton >= 3.4 has it
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton
    gdc_launch_dependents = gdc_wait = None
    _HAS_GDC = False

D_LATENT = 512  # V width and the no-rope part of K
D_ROPE = 64
D_QK = D_LATENT + D_ROPE


# The split count and head-block count change with the batch size; left
# unspecialized so one build serves every CUDA-graph batch size.
@triton.jit(do_not_specialize=["NUM_SPLITS", "NUM_HBLK"])
def _sparse_mla_split_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    o_ptr,
    lse_ptr,
    po_ptr,
    plse_ptr,
    qk_scale,  # sm_scale * log2(e) * kv_scale: softmax runs in base 2
    v_scale,
    H,
    TOPK,
    SPLIT_LEN,
    NUM_SPLITS,
    NUM_HBLK,
    PAGE,
    stride_qt,
    stride_qh,
    stride_kvb,
    stride_kvs,
    stride_it,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DV: tl.constexpr,
    DR: tl.constexpr,
    DIRECT: tl.constexpr,
    IDX_AHEAD: tl.constexpr,
    USE_PDL: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL_WAIT: tl.constexpr = False,
):
    if USE_PDL:  # let the merge kernel's programs launch now; they wait for this grid
        gdc_launch_dependents()
    if PDL_WAIT:  # launched as a programmatic dependent: the previous grid's writes first
        gdc_wait()
    # Head blocks of one (token, split) are adjacent program ids, so they run
    # together and all but the first read the gathered rows from L2.
    pid = tl.program_id(0)
    hb = pid % NUM_HBLK
    rest = pid // NUM_HBLK
    sp = rest % NUM_SPLITS
    t = (rest // NUM_SPLITS).to(tl.int64)

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_c = tl.arange(0, DV)
    offs_r = tl.arange(0, DR)
    q_rows = q_ptr + t * stride_qt + offs_h[:, None] * stride_qh
    q_c = tl.load(q_rows + offs_c[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_rows + DV + offs_r[None, :], mask=mask_h[:, None], other=0.0)
    if DOT_F32:  # the CPU interpreter computes bf16 tl.dot wrongly (triton 3.9)
        q_c = q_c.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)

    start = sp * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, TOPK)
    idx_row = idx_ptr + t * stride_it
    # IDX_AHEAD: the slots of tile i+1 are read during tile i, so the gather
    # address does not hang off a load in its own iteration; only then does
    # Triton's pipeliner double-buffer the gathered tiles (num_stages >= 3).
    # It costs registers, which the 64-head tiles cannot spare.
    if IDX_AHEAD:
        offs_n = start + tl.arange(0, BLOCK_N)
        slot_next = tl.load(idx_row + offs_n, mask=offs_n < end, other=-1)
    else:
        slot_next = tl.full([BLOCK_N], -1, dtype=tl.int32)
    for n0 in range(start, end, BLOCK_N):
        if IDX_AHEAD:
            slot = slot_next
            offs_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
            slot_next = tl.load(idx_row + offs_n, mask=offs_n < end, other=-1)
        else:
            offs_n = n0 + tl.arange(0, BLOCK_N)
            slot = tl.load(idx_row + offs_n, mask=offs_n < end, other=-1)
        valid = slot >= 0
        slot = tl.where(valid, slot, 0).to(tl.int64)
        blk = slot // PAGE
        rows = kv_ptr + blk * stride_kvb + (slot - blk * PAGE) * stride_kvs
        # Skipped slots are not read at all (prefill rows are mostly -1 early on).
        kv = tl.load(rows[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)
        kpe = tl.load(rows[:, None] + DV + offs_r[None, :], mask=valid[:, None], other=0.0)
        if kv_ptr.dtype.element_ty != q_ptr.dtype.element_ty:
            # fp8: one widened tile feeding both dots (as K^T and as V) is read into
            # registers synchronously; the pipeliner copies a tile asynchronously only
            # where its one use is a dot operand. So K's latent part is a load of its
            # own (the same rows again, from L1/L2: a .cg load, which CSE keeps apart).
            kv_k = tl.load(
                rows[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0,
                cache_modifier=".cg",
            )  # fmt: skip
            # (K as the A operand, the score tile transposed after, avoids the 8-bit
            # transposed load but was 1.45x slower on the stand-in: journal, "SM120 stand-in".)
            qk = tl.dot(q_c, tl.trans(kv_k.to(q_c.dtype)))
            kv = kv.to(q_c.dtype)
        else:
            kv = kv.to(q_c.dtype)
            qk = tl.dot(q_c, tl.trans(kv))
        qk = tl.dot(q_pe, tl.trans(kpe.to(q_c.dtype)), qk)
        qk = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row with nothing valid yet keeps m = -inf; subtract 0 instead so
        # exp2 sees -inf - 0 = -inf (weight 0) and never -inf - -inf = NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(kv.dtype), kv, acc)
        m_i = m_new

    has = l_i > 0.0
    out = acc * (v_scale / tl.where(has, l_i, 1.0))[:, None]
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if DIRECT:
        o_ptrs = o_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_c[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_h[:, None])
        tl.store(
            lse_ptr + t * stride_lt + offs_h * stride_lh, lse2 * 0.6931471805599453, mask=mask_h
        )
    else:
        # Workspace rows are (t, h, split); lse stays in base 2 for the merge.
        row = (t * H + offs_h) * NUM_SPLITS + sp
        po = out.to(po_ptr.dtype.element_ty)
        tl.store(po_ptr + row[:, None] * DV + offs_c[None, :], po, mask=mask_h[:, None])
        tl.store(plse_ptr + row, lse2, mask=mask_h)


@triton.jit
def _sparse_mla_merge_kernel(
    po_ptr,
    plse_ptr,
    o_ptr,
    lse_ptr,
    H,
    NUM_SPLITS,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the splits
        gdc_wait()
    pid = tl.program_id(0).to(tl.int64)  # t * H + h
    pd = tl.program_id(1)
    t = pid // H
    h = pid % H
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    lse = tl.load(plse_ptr + pid * NUM_SPLITS + offs_s, mask=mask_s, other=float("-inf"))
    # All splits load at once (a loop over splits would serialize their latency), and
    # before the lse reductions: their bar.syncs would otherwise hold these loads back,
    # one more L2 round trip after the lse's (journal, variant 66).
    offs_d = pd * BLOCK_D + tl.arange(0, BLOCK_D)
    po = tl.load(
        po_ptr + (pid * NUM_SPLITS + offs_s[:, None]) * DV + offs_d[None, :],
        mask=mask_s[:, None],
        other=0.0,
    ).to(tl.float32)
    m = tl.max(lse, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_use)
    denom = tl.sum(w, 0)
    out = tl.sum(po * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(o_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))
    if pd == 0:
        lse2 = m + tl.log2(tl.where(denom > 0.0, denom, 1.0))
        total = tl.where(denom > 0.0, lse2 * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + t * stride_lt + h * stride_lh, total)
