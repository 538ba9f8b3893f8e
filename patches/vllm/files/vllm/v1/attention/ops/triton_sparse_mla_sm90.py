# SPDX-License-Identifier: Apache-2.0
"""Sparse MLA, the SM90 (Hopper) family: a Gluon kernel with wgmma, producer warps,
2-CTA cluster merges and a lazy running max (docs/sparse-mla-kernel.md).

Only triton_sparse_mla.py chooses and launches it, on compute capability 9 with a
16-bit KV cache. It imports Triton's Gluon and the portable family's shared shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .triton_sparse_mla_triton import D_LATENT, D_ROPE

if TYPE_CHECKING:  # annotations only: the public module imports this one
    from .triton_sparse_mla import SparseMLAConfig

try:  # Gluon (explicit shared memory, cp.async and wgmma): the SM90 kernel below
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared as gl_fence_async_shared,
    )
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma as gl_wgmma
    from triton.experimental.gluon.language.nvidia.hopper import (
        warpgroup_mma_wait as gl_wgmma_wait,
    )

    # The CTA-wide barrier: thread_barrier in Triton 3.6, barrier from 3.7 (the image's).
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _HAS_GLUON = True
except (ImportError, AttributeError):  # pragma: no cover - Triton without (this) Gluon
    _HAS_GLUON = False

# cluster_merge's exchange buffer (static shared memory; its layout is in the kernel):
# barrier and lse, then half of o for up to 32 heads, then 1/l, in whole KiB.
_XCHG_DATA_BYTES = 16 + 4 * 32
_XCHG_INV_BYTES = _XCHG_DATA_BYTES + 32 * (D_LATENT // 2) * 4
_XCHG_BYTES = -(-(_XCHG_INV_BYTES + 4 * 32) // 1024) * 1024
# KV-major s_by_one: the first warpgroup's vote word (static shared memory, whole KiB so
# that Triton's dynamic shared memory stays 1 KiB-aligned, as for the exchange buffer).
_VOTE_BYTES = 1024
# ... and how far (log2 units) a score may rise above the running max before the max is
# updated: p = exp2(s - m) stays <= 2^8, far inside fp32 and bf16.
LAZY_MAX_SLACK = 8.0
# s_by_one: registers of the warpgroup that only accumulates half of o (128 of them);
# the first warpgroup gets what the producers and this one leave.
S_BY_ONE_O_REGS = 192


def _nvmma_swizzle(row_bytes: int) -> int:
    """Largest NVMMA shared-memory swizzle that a row of row_bytes fills (0: none)."""
    return next((w for w in (128, 64, 32) if row_bytes % w == 0), 0)


if _HAS_GLUON:

    # Per-head log2 and 1/x at the end of a program (lse, 1/l, the cluster merge's
    # weights) as one MUFU instruction each: gl.log2 compiles to a ~12-FMA software log2
    # and x / y to a full-range division, which at 32 heads (8 heads a thread) took
    # ~0.3 us before the first warpgroup's 1/l hand-over and ~0.45 us in the cluster
    # merge (H200, journal, variant 63). lg2.approx is within 2^-22 and rcp.approx within
    # 1 ulp; the inputs are >= 1 (a row's largest term is exp2(0)) or masked to 1.
    @gluon.jit
    def _lg2_approx(x):
        return gl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1
        )

    @gluon.jit
    def _rcp_approx(x):
        return gl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1
        )

    def _vote_asm(n: int) -> str:
        """One thread's n scores ($n..) against their heads' thresholds ($2n..): whether
        any is above, OR-ed over the first warpgroup's 128 threads (bar.red on its named
        barrier 0) and left in the vote word, which every thread then reads back. The
        speculative p ($3n..) is an input only so that its exp2s issue before the wait.
        Barrier 0 with 128 threads is the one Triton 3.6 gives the default partition of
        gl.warp_specialize (this warpgroup) for its thread_barrier."""
        cmp = "".join(
            f" setp.gt.f32 q, ${n + k}, ${2 * n + k}; or.pred p, p, q;\n" for k in range(n)
        )
        outs = "".join(f" mov.u32 ${k}, 0;" for k in range(n))
        return (
            "{ .reg .pred p, q; .reg .u32 v;\n setp.ne.u32 p, 0, 0;\n" + cmp
            + " bar.red.or.pred p, 0, 128, p;\n selp.u32 v, 1, 0, p;\n"
            " st.shared.u32 [sparse_mla_vote], v;\n" + outs + " }"
        )

    _VOTE_DECL_ASM: gl.constexpr = gl.constexpr(
        f".shared .align 1024 .b8 sparse_mla_vote[{_VOTE_BYTES}]; mov.u32 $0, 0;"
    )
    _VOTE4_ASM: gl.constexpr = gl.constexpr(_vote_asm(4))
    _VOTE8_ASM: gl.constexpr = gl.constexpr(_vote_asm(8))
    _VOTE16_ASM: gl.constexpr = gl.constexpr(_vote_asm(16))
    _VOTE4_CONS: gl.constexpr = gl.constexpr(",".join(["=r"] * 4 + ["f"] * 12))
    _VOTE8_CONS: gl.constexpr = gl.constexpr(",".join(["=r"] * 8 + ["f"] * 24))
    _VOTE16_CONS: gl.constexpr = gl.constexpr(",".join(["=r"] * 16 + ["f"] * 48))
    _LAZY_SLACK: gl.constexpr = gl.constexpr(LAZY_MAX_SLACK)

    @gluon.jit
    def _sm90_vote_above(s, thr, p, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, i):
        """KV-major s_by_one, first warpgroup: whether any of the tile's scores s [BLOCK_N,
        heads] is above its head's threshold thr, as one scalar every thread agrees on.
        Its bar.red is also the barrier that orders this warpgroup's stores before it."""
        N: gl.constexpr = BLOCK_N * BLOCK_H // 128  # a thread's share of s
        t = thr[None, :] + gl.zeros_like(s)
        if N == 4:
            gl.inline_asm_elementwise(
                _VOTE4_ASM, _VOTE4_CONS, [s, t, p], dtype=gl.int32, is_pure=False, pack=4
            )
        elif N == 8:
            gl.inline_asm_elementwise(
                _VOTE8_ASM, _VOTE8_CONS, [s, t, p], dtype=gl.int32, is_pure=False, pack=8
            )
        else:
            gl.static_assert(N == 16)
            gl.inline_asm_elementwise(
                _VOTE16_ASM, _VOTE16_CONS, [s, t, p], dtype=gl.int32, is_pure=False, pack=16
            )
        return gl.inline_asm_elementwise(
            "ld.shared.u32 $0, [sparse_mla_vote]; // $1", "=r,r", [i], dtype=gl.int32,
            is_pure=False, pack=1,
        )

    @gluon.jit
    def _sm90_kv_lazy_tile(
        s, ss, qk_scale, m_i, m_use, l_part, acc, i, p_smem, alpha_smem, p_empty,
        BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, O_LAYOUT: gl.constexpr,
    ):  # fmt: skip
        """KV-major s_by_one, first warpgroup: one tile's online softmax on sT [BLOCK_N,
        heads] with a lazy max, p and alpha stored for the p . v of both warpgroups.

        The exact max of a tile is a cross-warp reduction over its rows on this
        warpgroup's chain, which at 32 heads is as long as a tile's DRAM time. Instead the
        reference m_use (the running max m, or 0 while m is -inf) moves only when some
        score rises more than LAZY_MAX_SLACK above m: at tile 0 (or the first valid tile),
        and rarely after.
        p = exp2(s - m_use) is computed and stored with alpha = 1 at once, and the
        question whether any score rose is asked in the barrier that orders those stores
        (bar.red instead of bar.sync), so it costs no barrier of its own. Where one did,
        the max, p, alpha, the row sums and this warpgroup's oT are redone and p stored
        again before the second warpgroup is told; p stays <= 2^LAZY_MAX_SLACK. Tile 0
        takes the exact max before its p instead (nothing is held against the old max
        there), so the vote cannot fire at it."""
        s2 = gl.where((ss >= 0)[:, None], s * qk_scale, float("-inf"))
        if i == 0:  # the tile every CTA starts on: one p, one store
            m_i = gl.max(s2, 0)
            m_use = gl.where(m_i == float("-inf"), 0.0, m_i)
        p = gl.exp2(s2 - m_use[None, :])
        ones = gl.full([BLOCK_H], 1.0, gl.float32, layout=gl.SliceLayout(0, O_LAYOUT))
        # The second warpgroup is past tile i-1's p . v: p and alpha may be replaced.
        mbarrier.wait(p_empty, (i & 1) ^ 1, pred=i > 0)
        p_smem.store(p.to(p_smem.dtype))
        alpha_smem.store(ones)
        gl_fence_async_shared()
        if _sm90_vote_above(s2, m_i + _LAZY_SLACK, p, BLOCK_N, BLOCK_H, i) != 0:
            # The exact online-softmax step (alpha is 0 while m was -inf: l, oT are 0).
            m_new, alpha, p, l_part = _sm90_kv_online_softmax(
                s, ss, qk_scale, m_i, l_part, True
            )
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, O_LAYOUT))  # same layout
            acc = acc * alpha_o[None, :]
            m_i = m_new
            p_smem.store(p.to(p_smem.dtype))
            alpha_smem.store(alpha_o)
            gl_fence_async_shared()
            _cta_barrier()
        else:
            l_part = l_part + p
        return m_i, m_use, l_part, acc

    @gluon.jit
    def _sm90_lse2_inv(m_i, l_i, v_scale):
        """Per head, from the running max and the row sum: the lse (base 2; -inf where no
        slot was valid) and v_scale / l (v_scale where l = 0), in l_i's layout."""
        has = l_i > 0.0
        l_safe = gl.where(has, l_i, 1.0)
        lse2 = gl.where(has, m_i + _lg2_approx(l_safe), float("-inf"))
        return lse2, v_scale * _rcp_approx(l_safe)

    @gluon.jit
    def _sm90_issue_tile(
        kv_buf,
        kpe_buf,
        kv_ptr,
        slot_g,
        slot_r,
        PAGE,
        stride_kvb,
        stride_kvs,
        cols_g,
        cols_r,
        DV: gl.constexpr,
    ):
        """cp.async one tile of gathered rows (latent and rope parts) into shared memory.

        Slots < 0 copy nothing (the rows are zero-filled)."""
        # Slots are int32 (block * block_size + offset): divide in 32 bits, widen after.
        valid_g = slot_g >= 0
        sg = gl.where(valid_g, slot_g, 0)
        bg = sg // PAGE
        rows_g = kv_ptr + bg.to(gl.int64) * stride_kvb + (sg - bg * PAGE).to(gl.int64) * stride_kvs
        gl_cp.async_copy_global_to_shared(
            kv_buf, rows_g[:, None] + cols_g[None, :], mask=valid_g[:, None]
        )
        valid_r = slot_r >= 0
        sr = gl.where(valid_r, slot_r, 0)
        br = sr // PAGE
        rows_r = kv_ptr + br.to(gl.int64) * stride_kvb + (sr - br * PAGE).to(gl.int64) * stride_kvs
        rows_r = rows_r + DV
        gl_cp.async_copy_global_to_shared(
            kpe_buf, rows_r[:, None] + cols_r[None, :], mask=valid_r[:, None]
        )
        gl_cp.commit_group()

    @gluon.jit
    def _sm90_load_q(
        q_smem, qpe_smem, q_tok, h0, H, stride_qh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, NUM_WARPS: gl.constexpr,
    ):  # fmt: skip
        """Heads h0 .. h0 + BLOCK_H of one token's q into shared memory (zeros past H)."""
        g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NUM_WARPS, 1], [1, 0])
        r_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
        offs_hg = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, g_layout))
        cols_g = gl.arange(0, DV, layout=gl.SliceLayout(0, g_layout))
        q_c = gl.load(
            q_tok + offs_hg[:, None] * stride_qh + cols_g[None, :],
            mask=(offs_hg < H)[:, None],
            other=0.0,
        )
        q_smem.store(q_c)
        offs_hr = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, r_layout))
        cols_r = gl.arange(0, DR, layout=gl.SliceLayout(0, r_layout))
        q_pe = gl.load(
            q_tok + offs_hr[:, None] * stride_qh + DV + cols_r[None, :],
            mask=(offs_hr < H)[:, None],
            other=0.0,
        )
        qpe_smem.store(q_pe)

    @gluon.jit
    def _sm90_kv_state(
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr,
    ):  # fmt: skip
        """The KV-major loop's starting state: m, row sums (per row with LATE_SUM, else
        per head), oT, and the zero tile q.kT starts from."""
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
        if LATE_SUM:
            l_part = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
        else:
            l_part = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
        acc = gl.zeros([DV, BLOCK_H], gl.float32, layout=O_LAYOUT)
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
        return m_i, l_part, acc, s_zero

    @gluon.jit
    def _sm90_kv_online_softmax(s, ss, qk_scale, m_i, l_part, LATE_SUM: gl.constexpr):
        """KV-major online softmax of one tile's sT [BLOCK_N, heads] (rows with slot < 0
        at -inf): the new max, alpha, p (base 2) and the row sums (per row with
        LATE_SUM, else per head)."""
        s = gl.where((ss >= 0)[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        if LATE_SUM:  # noqa: SIM108 - constexpr branches
            l_part = l_part * alpha[None, :] + p
        else:
            l_part = l_part * alpha + gl.sum(p, 0)
        return m_new, alpha, p, l_part

    @gluon.jit
    def _sm90_softmax_pv(
        s, ss_cur, qk_scale, m_i, l_part, acc, kv_i, p_smem,
        O_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr,
    ):  # fmt: skip
        """One tile's online softmax on sT [BLOCK_N, BLOCK_H] and oT += kvT . pT."""
        m_new, alpha, p, l_part = _sm90_kv_online_softmax(
            s, ss_cur, qk_scale, m_i, l_part, LATE_SUM
        )
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, O_LAYOUT))
        acc = acc * alpha_o[None, :]
        p_smem.store(p.to(p_smem.dtype))
        gl_fence_async_shared()
        _cta_barrier()
        o_tok = gl_wgmma(kv_i.permute((1, 0)), p_smem, acc, is_async=True)
        acc = gl_wgmma_wait(0, deps=[o_tok])
        return m_new, l_part, acc

    @gluon.jit
    def _sm90_loop_inline(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, kv_ptr, idx_row, start, end, qk_scale,
        PAGE, stride_kvb, stride_kvs,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, NUM_WARPS: gl.constexpr, O_LAYOUT: gl.constexpr,
        S_LAYOUT: gl.constexpr, LATE_ISSUE: gl.constexpr, LATE_SUM: gl.constexpr,
    ):  # fmt: skip
        """The KV-major tile loop with the gathers issued by the same warps that run the
        MMAs: at the top of iteration i the gather of tile i + NBUF - 1 goes out into
        the buffer tile i-1 used (its slots read one iteration earlier), then tile i is
        awaited. Returns (m, row sums, oT)."""
        g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NUM_WARPS, 1], [1, 0])
        r_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
        cols_g = gl.arange(0, DV, layout=gl.SliceLayout(0, g_layout))
        cols_r = gl.arange(0, DR, layout=gl.SliceLayout(0, r_layout))
        rows_g = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
        rows_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, r_layout))
        rows_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
        n_tiles = gl.cdiv(end - start, BLOCK_N)

        for j in gl.static_range(NBUF - 1):
            n0 = start + j * BLOCK_N
            sg = gl.load(idx_row + n0 + rows_g, mask=n0 + rows_g < end, other=-1)
            sr = gl.load(idx_row + n0 + rows_r, mask=n0 + rows_r < end, other=-1)
            _sm90_issue_tile(
                kv_smem.index(j), kpe_smem.index(j), kv_ptr, sg, sr,
                PAGE, stride_kvb, stride_kvs, cols_g, cols_r, DV,
            )  # fmt: skip
        n0 = start + (NBUF - 1) * BLOCK_N
        sg_next = gl.load(idx_row + n0 + rows_g, mask=n0 + rows_g < end, other=-1)
        sr_next = gl.load(idx_row + n0 + rows_r, mask=n0 + rows_r < end, other=-1)
        ss_cur = gl.load(idx_row + start + rows_s, mask=start + rows_s < end, other=-1)

        m_i, l_part, acc, s_zero = _sm90_kv_state(
            BLOCK_H, BLOCK_N, DV, O_LAYOUT, S_LAYOUT, LATE_SUM
        )
        for i in range(0, n_tiles):
            nb = (i + NBUF - 1) % NBUF  # the buffer tile i-1 used
            if not LATE_ISSUE:
                # Every warp is past tile i-1's MMAs: its buffer may be refilled now,
                # so NBUF tiles are in flight while tile i is awaited.
                _cta_barrier()
                _sm90_issue_tile(
                    kv_smem.index(nb), kpe_smem.index(nb), kv_ptr, sg_next, sr_next,
                    PAGE, stride_kvb, stride_kvs, cols_g, cols_r, DV,
                )  # fmt: skip
            # Slots for the next issue and the next tile's mask: used one iteration on.
            n0 = start + (i + NBUF) * BLOCK_N
            sg_next2 = gl.load(idx_row + n0 + rows_g, mask=n0 + rows_g < end, other=-1)
            sr_next2 = gl.load(idx_row + n0 + rows_r, mask=n0 + rows_r < end, other=-1)
            n1 = start + (i + 1) * BLOCK_N
            ss_next = gl.load(idx_row + n1 + rows_s, mask=n1 + rows_s < end, other=-1)
            if LATE_ISSUE:
                gl_cp.wait_group(NBUF - 2)  # tile i has landed (nothing newer issued yet)
            else:
                gl_cp.wait_group(NBUF - 1)  # this thread's copies of tile i have landed
            gl_fence_async_shared()  # cp.async writes -> wgmma (async proxy) reads
            _cta_barrier()  # ... and every other thread's
            buf = i % NBUF
            kv_i = kv_smem.index(buf)
            s_tok = gl_wgmma(kv_i, q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = gl_wgmma(kpe_smem.index(buf), qpe_smem.permute((1, 0)), s_tok, is_async=True)
            if LATE_ISSUE:  # one barrier fewer a tile; the issue overlaps q.kT
                _sm90_issue_tile(
                    kv_smem.index(nb), kpe_smem.index(nb), kv_ptr, sg_next, sr_next,
                    PAGE, stride_kvb, stride_kvs, cols_g, cols_r, DV,
                )  # fmt: skip
            sg_next = sg_next2
            sr_next = sr_next2
            s = gl_wgmma_wait(0, deps=[s_tok])
            m_i, l_part, acc = _sm90_softmax_pv(
                s, ss_cur, qk_scale, m_i, l_part, acc, kv_i, p_smem, O_LAYOUT, LATE_SUM
            )
            ss_cur = ss_next
        gl_cp.wait_group(0)
        return m_i, l_part, acc

    @gluon.jit
    def _sm90_ws_gather(
        kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start, end,
        PAGE, stride_kvb, stride_kvs,
        BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, NBUF: gl.constexpr,
        P_WARPS: gl.constexpr, CLUSTER2: gl.constexpr = False,
    ):  # fmt: skip
        """Producer warps: copy tile i's slots and gather its rows into buffer i % NBUF
        as soon as the MMA warps release it, and let its full barrier complete when this
        thread's copies land (cp.async.mbarrier.arrive.noinc: the barrier counts the
        producer threads). The slots travel in shared memory so that the MMA warps have
        no global load in flight at their fences (fence.proxy.async is a MEMBAR)."""
        if CLUSTER2:  # every thread of the cluster arrives once (the MMA warps did)
            _sm90_per_thread(_CLUSTER_ARRIVE_ASM, P_WARPS)
        g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [P_WARPS, 1], [1, 0])
        r_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
        cols_g = gl.arange(0, DV, layout=gl.SliceLayout(0, g_layout))
        cols_r = gl.arange(0, DR, layout=gl.SliceLayout(0, r_layout))
        rows_g = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
        rows_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, r_layout))
        i_layout: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
        rows_i = gl.arange(0, BLOCK_N, layout=i_layout)
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        sg = gl.load(idx_row + start + rows_g, mask=start + rows_g < end, other=-1)
        sr = gl.load(idx_row + start + rows_r, mask=start + rows_r < end, other=-1)
        for i in range(0, n_tiles):
            # The next tile's slots load while this one waits for its buffer.
            n1 = start + (i + 1) * BLOCK_N
            sg_next = gl.load(idx_row + n1 + rows_g, mask=n1 + rows_g < end, other=-1)
            sr_next = gl.load(idx_row + n1 + rows_r, mask=n1 + rows_r < end, other=-1)
            b = i % NBUF
            mbarrier.wait(empty_bars.index(b), ((i // NBUF) & 1) ^ 1, pred=i >= NBUF)
            n0 = n1 - BLOCK_N  # rows past the split's end: zeros, masked by the MMA warps
            gl_cp.async_copy_global_to_shared(
                slot_smem.index(b), idx_row + n0 + rows_i, mask=n0 + rows_i < end
            )
            _sm90_issue_tile(
                kv_smem.index(b), kpe_smem.index(b), kv_ptr, sg, sr,
                PAGE, stride_kvb, stride_kvs, cols_g, cols_r, DV,
            )  # fmt: skip
            gl_cp.mbarrier_arrive(full_bars.index(b), increment_count=False)
            sg = sg_next
            sr = sr_next

    @gluon.jit
    def _sm90_kv_scores(
        q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end, s_zero,
        rows_s, BLOCK_N: gl.constexpr, NBUF: gl.constexpr, S_LAYOUT: gl.constexpr,
    ):  # fmt: skip
        """KV-major: wait for tile i from the producers; sT = kv . qT [BLOCK_N, heads]
        unscaled, and the tile's slots (-1 past the split's end)."""
        buf = i % NBUF
        mbarrier.wait(full_bars.index(buf), (i // NBUF) & 1)
        gl_fence_async_shared()  # the producers' cp.async writes -> wgmma reads
        s_tok = gl_wgmma(
            kv_smem.index(buf), q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        s_tok = gl_wgmma(kpe_smem.index(buf), qpe_smem.permute((1, 0)), s_tok, is_async=True)
        ss = slot_smem.index(buf).load(gl.SliceLayout(1, S_LAYOUT))
        ss = gl.where(start + i * BLOCK_N + rows_s < end, ss, -1)
        s = gl_wgmma_wait(0, deps=[s_tok])
        return s, ss

    @gluon.jit
    def _sm90_ws_loop_kv(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars, empty_bars,
        start, end, qk_scale,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, NBUF: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr,
    ):  # fmt: skip
        """KV-major MMA loop fed by producer warps: wait for tile i, run it, release it."""
        rows_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        m_i, l_part, acc, s_zero = _sm90_kv_state(
            BLOCK_H, BLOCK_N, DV, O_LAYOUT, S_LAYOUT, LATE_SUM
        )
        for i in range(0, n_tiles):
            buf = i % NBUF
            kv_i = kv_smem.index(buf)
            s, ss = _sm90_kv_scores(
                q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end,
                s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,
            )  # fmt: skip
            m_i, l_part, acc = _sm90_softmax_pv(
                s, ss, qk_scale, m_i, l_part, acc, kv_i, p_smem, O_LAYOUT, LATE_SUM
            )
            # Both warpgroups' p.V have read the buffer (and p): it may be refilled.
            _cta_barrier()
            mbarrier.arrive(empty_bars.index(buf))
        return m_i, l_part, acc

    @gluon.jit
    def _sm90_hm_scores(
        q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end, qk_scale,
        s_zero, cols_s, BLOCK_N: gl.constexpr, NBUF: gl.constexpr, S_LAYOUT: gl.constexpr,
    ):  # fmt: skip
        """Head-major: wait for tile i from the producers, s = q . kvT [BLOCK_H, BLOCK_N]
        scaled (base 2), the tile's empty slots and the rows past the split at -inf."""
        buf = i % NBUF
        mbarrier.wait(full_bars.index(buf), (i // NBUF) & 1)
        gl_fence_async_shared()  # the producers' cp.async writes -> wgmma reads
        kv_t = kv_smem.index(buf).permute((1, 0))
        s_tok = gl_wgmma(q_smem, kv_t, s_zero, use_acc=False, is_async=True)
        s_tok = gl_wgmma(qpe_smem, kpe_smem.index(buf).permute((1, 0)), s_tok, is_async=True)
        ss = slot_smem.index(buf).load(gl.SliceLayout(0, S_LAYOUT))
        ss = gl.where(start + i * BLOCK_N + cols_s < end, ss, -1)
        s = gl_wgmma_wait(0, deps=[s_tok])
        return gl.where((ss >= 0)[None, :], s * qk_scale, float("-inf"))

    @gluon.jit
    def _sm90_ws_loop_hm(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars, empty_bars,
        red_smem, start, end, qk_scale,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, NBUF: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, XCHG_MAX: gl.constexpr,
    ):  # fmt: skip
        """Head-major MMA loop (64-head blocks): s = q . kvT and o += p . v, heads as
        wgmma's M. The warpgroups split the tile's rows for s and v's 512 columns for o,
        so a head's row max is reduced within a thread and a quad, then once across the
        two warpgroups, and alpha is already in o's row layout."""
        cols_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
        l_part = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
        acc = gl.zeros([BLOCK_H, DV], gl.float32, layout=O_LAYOUT)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
        for i in range(0, n_tiles):
            buf = i % NBUF
            kv_i = kv_smem.index(buf)
            s = _sm90_hm_scores(
                q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end,
                qk_scale, s_zero, cols_s, BLOCK_N, NBUF, S_LAYOUT,
            )  # fmt: skip
            if XCHG_MAX:
                # Each warpgroup's max over its half of the rows (within a quad), stored;
                # one barrier; both halves read back in s's row layout. The p barrier
                # below orders this tile's reads before the next tile's store.
                red_smem.store(gl.max(gl.reshape(s, [BLOCK_H, 2, BLOCK_N // 2]), 2))
                _cta_barrier()
                # [BLOCK_H, 2] in s's layout: both halves in each thread, no shuffle.
                m_new = gl.maximum(m_i, gl.max(red_smem.load(S_LAYOUT), 1))
            else:
                m_new = gl.maximum(m_i, gl.max(s, 1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])
            l_part = l_part * alpha[:, None] + p
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
            acc = acc * alpha_o[:, None]
            p_smem.store(p.to(p_smem.dtype))
            gl_fence_async_shared()
            _cta_barrier()
            o_tok = gl_wgmma(p_smem, kv_i, acc, is_async=True)
            acc = gl_wgmma_wait(0, deps=[o_tok])
            _cta_barrier()  # both warpgroups' p.v have read the buffer (and p)
            mbarrier.arrive(empty_bars.index(buf))
            m_i = m_new
        return m_i, l_part, acc

    @gluon.jit
    def _sm90_ws_mma(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars, empty_bars,
        red_smem, start, end, qk_scale, q_tok, h0, H, stride_qh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, NUM_WARPS: gl.constexpr, O_LAYOUT: gl.constexpr,
        S_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr, HEAD_MAJOR: gl.constexpr,
        XCHG_MAX: gl.constexpr,
    ):  # fmt: skip
        """MMA warps (the default partition): q to shared memory, then the tile loop."""
        _sm90_load_q(q_smem, qpe_smem, q_tok, h0, H, stride_qh, BLOCK_H, DV, DR, NUM_WARPS)
        _cta_barrier()  # every warp's part of q is stored (fenced after the first wait)
        if HEAD_MAJOR:
            m_i, l_part, acc = _sm90_ws_loop_hm(
                q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars, empty_bars,
                red_smem, start, end, qk_scale, BLOCK_H, BLOCK_N, DV, NBUF, O_LAYOUT,
                S_LAYOUT, XCHG_MAX,
            )  # fmt: skip
        else:
            m_i, l_part, acc = _sm90_ws_loop_kv(
                q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars, empty_bars,
                start, end, qk_scale, BLOCK_H, BLOCK_N, DV, NBUF, O_LAYOUT, S_LAYOUT,
                LATE_SUM,
            )  # fmt: skip
        return m_i, l_part, acc

    # cluster_merge: a token's two splits run as a 2-CTA cluster and merge through
    # distributed shared memory. Gluon has no cluster operations, so this is inline PTX.
    # The exchange buffer is static shared memory declared in the kernel's first inline
    # asm (PTX cannot name a Gluon allocation's address). Layout: the mbarrier the
    # partner's 256 MMA threads arrive on (bytes 0-7), the partner's lse (from 16, up to
    # 32 heads), then its half of o, head-major ([BLOCK_H, 256] fp32). The size is a whole
    # number of KiB: Triton's dynamic shared memory follows it, and the wgmma tiles'
    # 128-byte swizzle needs 1 KiB-aligned buffers (every result was wrong without).
    _XCHG_DATA: gl.constexpr = gl.constexpr(_XCHG_DATA_BYTES)
    _XCHG_INV: gl.constexpr = gl.constexpr(_XCHG_INV_BYTES)  # s_by_one: the partner's 1/l
    # Once a thread, MMA warps before the loop: declare the buffer, thread 0 initialises
    # the barrier, every thread arrives on the cluster barrier (waited before sending).
    def _xchg_init_asm(senders: int) -> str:
        return (
            f".shared .align 1024 .b8 sparse_mla_xchg[{_XCHG_BYTES}];\n"
            "{ .reg .pred p; .reg .u32 a;\n"
            " setp.eq.u32 p, $1, 0;\n"
            " mov.u32 a, sparse_mla_xchg;\n"
            f" @p mbarrier.init.shared::cta.b64 [a], {senders};\n"
            " @p fence.mbarrier_init.release.cluster;\n"
            " barrier.cluster.arrive.release;\n"
            " mov.u32 $0, 0; }"
        )

    # 256 arrivals: the partner's two MMA warpgroups (s_by_one: one sends its half of o,
    # the first sends lse and 1/l; where the first also sends the half it arrives twice).
    _XCHG_INIT_ASM: gl.constexpr = gl.constexpr(_xchg_init_asm(256))
    # The producer warps' share of the cluster barrier (every thread of the cluster).
    _CLUSTER_ARRIVE_ASM: gl.constexpr = gl.constexpr(
        "barrier.cluster.arrive.release; mov.u32 $0, 0;"
    )
    _CLUSTER_WAIT_ASM: gl.constexpr = gl.constexpr(
        "barrier.cluster.wait.acquire; mov.u32 $0, 0;"
    )
    # a (an address in this CTA's buffer) -> the same address in the partner CTA.
    _TO_PARTNER = (
        " { .reg .u32 r; mov.u32 r, %cluster_ctarank; xor.b32 r, r, 1;\n"
        " mapa.shared::cluster.u32 a, a, r; }\n"
    )
    # pack 4: $4-$7 four consecutive values, $8 the first's byte offset in the partner's
    # buffer (16-byte aligned), $12 send or not: one 16-byte remote store. 4-byte remote
    # stores cost ~0.25 us each a thread (journal, variant 53).
    _XCHG_PUT4_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a;\n"
        " setp.ne.s32 p, $12, 0;\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $8;\n" + _TO_PARTNER +
        " @p st.shared::cluster.v4.f32 [a], {$4, $5, $6, $7};\n"
        " mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }"
    )
    # $1 value, $2 byte offset in the partner's buffer (the lse).
    _XCHG_PUT_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .u32 a;\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $2;\n" + _TO_PARTNER +
        " st.shared::cluster.f32 [a], $1;\n"
        " mov.u32 $0, 0; }"
    )
    # Each MMA thread arrives on the partner's barrier after its stores (release): once,
    # or for two sends at once.
    def _xchg_signal_asm(count: int) -> str:
        return (
            "{ .reg .u32 a;\n"
            " mov.u32 a, sparse_mla_xchg;\n" + _TO_PARTNER +
            f" mbarrier.arrive.release.cluster.shared::cluster.b64 _, [a], {count};\n"
            " mov.u32 $0, 0; }"
        )

    _XCHG_SIGNAL_ASM: gl.constexpr = gl.constexpr(_xchg_signal_asm(1))
    _XCHG_SIGNAL2_ASM: gl.constexpr = gl.constexpr(_xchg_signal_asm(2))
    # ... and waits on its own until the partner's 256 have arrived (acquire).
    _XCHG_WAIT_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred done; .reg .u32 a;\n"
        " mov.u32 a, sparse_mla_xchg;\n"
        " xchgWait:\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [a], 0;\n"
        " @!done bra xchgWait;\n"
        " mov.u32 $0, 0; }"
    )
    # pack 4: $4 the first's byte offset in this CTA's buffer, $8 load or not (else 0).
    _XCHG_GET4_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a;\n"
        " setp.ne.s32 p, $8, 0;\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $4;\n"
        " mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;\n"
        " @p ld.shared.v4.f32 {$0, $1, $2, $3}, [a]; }"
    )
    # $1 byte offset in this CTA's buffer (the lse).
    _XCHG_GET_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .u32 a;\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $1;\n"
        " ld.shared.f32 $0, [a]; }"
    )

    @gluon.jit
    def _sm90_per_thread(asm: gl.constexpr, NUM_WARPS: gl.constexpr):
        """Run an inline-PTX statement once in every thread of NUM_WARPS warps."""
        tid = gl.arange(0, NUM_WARPS * 32, layout=gl.BlockedLayout([1], [32], [NUM_WARPS], [0]))
        return gl.inline_asm_elementwise(
            asm, "=r,r", [tid], dtype=gl.int32, is_pure=False, pack=1
        )

    @gluon.jit
    def _sm90_merge2(out, o_other, lse_me, lse_other):
        """cluster_merge: o from this split's and the partner's normalised halves (heads
        along out's axis 1), and the merged lse (base 2, -inf where both are empty)."""
        m = gl.maximum(lse_me, lse_other)
        m_use = gl.where(m == float("-inf"), 0.0, m)  # both splits empty: weights 0
        w_me = gl.exp2(lse_me - m_use)
        w_other = gl.exp2(lse_other - m_use)
        den = w_me + w_other
        inv_den = _rcp_approx(gl.where(den > 0.0, den, 1.0))
        o = out * (w_me * inv_den)[None, :] + o_other * (w_other * inv_den)[None, :]
        lse_tot = gl.where(
            den > 0.0, m_use + _lg2_approx(gl.where(den > 0.0, den, 1.0)), float("-inf")
        )
        return o, lse_tot

    @gluon.jit
    def _sm90_cluster_epilogue(
        m_i, l_part, acc, t, sp, H, v_scale, o_ptr, lse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, NUM_WARPS: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr,
    ):  # fmt: skip
        """cluster_merge (KV-major, up to 32 heads): split sp of a token keeps columns
        [sp * DV/2, (sp + 1) * DV/2) of o. It sends the other half of its normalised
        partial o and its lse into the partner CTA's shared memory, waits for the
        partner's, merges its half through the two lse and stores it (lse from split 0)."""
        # oT [DV, BLOCK_H] in 4-column runs a thread (one head block: hb = 0; below 64
        # heads the row sums are kept per row).
        out, lse2, _, head_ix, col_ix = _sm90_normalise(
            m_i, l_part, acc, 0, v_scale, BLOCK_H, DV, NUM_WARPS, O_LAYOUT, S_LAYOUT,
            True, False,
        )  # fmt: skip
        h_l: gl.constexpr = gl.SliceLayout(0, out.type.layout)
        offs_h = gl.arange(0, BLOCK_H, layout=h_l)
        HALF: gl.constexpr = DV // 2
        mine = (col_ix // HALF) == sp
        keep = gl.where(mine, 1, 0) + gl.zeros_like(head_ix + col_ix)
        # Head-major, so a thread's 4 consecutive columns are one 16-byte run.
        off = _XCHG_DATA + ((col_ix % HALF) + head_ix * HALF) * 4
        lse_me = gl.convert_layout(lse2, h_l)
        off_l = 16 + offs_h * 4
        # The partner's barrier is initialised (its thread 0 arrived after doing so).
        _sm90_per_thread(_CLUSTER_WAIT_ASM, NUM_WARPS)
        gl.inline_asm_elementwise(
            _XCHG_PUT4_ASM, "=r,=r,=r,=r,f,f,f,f,r,r,r,r,r,r,r,r", [out, off, 1 - keep],
            dtype=gl.int32, is_pure=False, pack=4,
        )  # fmt: skip
        gl.inline_asm_elementwise(
            _XCHG_PUT_ASM, "=r,f,r", [lse_me, off_l], dtype=gl.int32, is_pure=False, pack=1
        )
        _sm90_per_thread(_XCHG_SIGNAL_ASM, NUM_WARPS)
        _sm90_per_thread(_XCHG_WAIT_ASM, NUM_WARPS)
        o_other = gl.inline_asm_elementwise(
            _XCHG_GET4_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r", [off, keep], dtype=gl.float32,
            is_pure=False, pack=4,
        )  # fmt: skip
        lse_other = gl.inline_asm_elementwise(
            _XCHG_GET_ASM, "=f,r", [off_l], dtype=gl.float32, is_pure=False, pack=1
        )
        o, lse_tot = _sm90_merge2(out, o_other, lse_me, lse_other)
        heads_ok = offs_h < H
        o_ptrs = o_ptr + t * stride_ot + head_ix * stride_oh + col_ix
        gl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=mine & (head_ix < H))
        gl.store(
            lse_ptr + t * stride_lt + offs_h * stride_lh, lse_tot * 0.6931471805599453,
            mask=heads_ok & (sp == 0),
        )

    @gluon.jit
    def _sm90_store(
        out, lse2, head_ix, col_ix, mask_o, offs_hl, t, sp, H, NUM_SPLITS,
        o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
        DV: gl.constexpr, DIRECT: gl.constexpr, WITH_LSE: gl.constexpr,
    ):  # fmt: skip
        """Store a program's o (or split-K partial o) and, WITH_LSE, its lse. head_ix /
        col_ix index out's elements by head and column (broadcast to out's shape); lse2
        is base 2."""
        if DIRECT:
            o_ptrs = o_ptr + t * stride_ot + head_ix * stride_oh + col_ix
            gl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_o)
            if WITH_LSE:
                gl.store(
                    lse_ptr + t * stride_lt + offs_hl * stride_lh,
                    lse2 * 0.6931471805599453,
                    mask=offs_hl < H,
                )
        else:
            row = (t * H + head_ix) * NUM_SPLITS + sp
            gl.store(po_ptr + row * DV + col_ix, out.to(po_ptr.dtype.element_ty), mask=mask_o)
            if WITH_LSE:
                row_l = (t * H + offs_hl) * NUM_SPLITS + sp
                gl.store(plse_ptr + row_l, lse2, mask=offs_hl < H)

    @gluon.jit
    def _sm90_hm1_s_wg(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, alpha_smem, lse_smem,
        full_bars, empty_bars, p_full, p_empty, start, end, qk_scale, v_scale, q_tok, hb, H,
        stride_qh, t, sp, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr,
        DIRECT: gl.constexpr, CLUSTER2: gl.constexpr,
    ):  # fmt: skip
        """s_by_one, first warpgroup: q to shared memory; per tile s = q . kvT for all 64
        rows, the softmax (row max and sums within the warpgroup), p and alpha handed to
        the second warpgroup (p_full / p_empty), o[:, :256] += p . v; at the end 1/l
        handed over the same way, and this half of o and lse stored. lse_smem and
        CLUSTER2 only share the KV-major partitions' signature (no clusters here)."""
        _sm90_load_q(q_smem, qpe_smem, q_tok, hb * BLOCK_H, H, stride_qh, BLOCK_H, DV, DR, 4)
        _cta_barrier()  # every warp's part of q is stored (fenced after the first wait)
        cols_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
        acc = gl.zeros([BLOCK_H, DV // 2], gl.float32, layout=O_LAYOUT)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_LAYOUT)
        for i in range(0, n_tiles):
            buf = i % NBUF
            kv_i = kv_smem.index(buf)
            s = _sm90_hm_scores(
                q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end,
                qk_scale, s_zero, cols_s, BLOCK_N, NBUF, S_LAYOUT,
            )  # fmt: skip
            m_new = gl.maximum(m_i, gl.max(s, 1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
            acc = acc * alpha_o[:, None]
            # The second warpgroup is past tile i-1's p . v: p and alpha may be replaced.
            mbarrier.wait(p_empty, (i & 1) ^ 1, pred=i > 0)
            p_smem.store(p.to(p_smem.dtype))
            alpha_smem.store(alpha_o)
            gl_fence_async_shared()
            _cta_barrier()  # all of p (and alpha) is stored
            mbarrier.arrive(p_full)
            o_tok = gl_wgmma(p_smem, kv_i.slice(0, DV // 2, 1), acc, is_async=True)
            acc = gl_wgmma_wait(0, deps=[o_tok])
            mbarrier.arrive(empty_bars.index(buf))
            m_i = m_new
        lse2, inv = _sm90_lse2_inv(m_i, l_i, v_scale)
        inv = gl.convert_layout(inv, gl.SliceLayout(1, O_LAYOUT))
        mbarrier.wait(p_empty, (n_tiles & 1) ^ 1)  # the last tile's alpha has been read
        alpha_smem.store(inv)
        _cta_barrier()
        mbarrier.arrive(p_full)
        _sm90_hm1_store(
            acc * inv[:, None], lse2, 0, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr,
            plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
            BLOCK_H, DV, O_LAYOUT, S_LAYOUT, DIRECT, True, q_smem.slice(0, DV // 2, 1),
        )  # fmt: skip

    @gluon.jit
    def _sm90_hm1_o_wg(
        q_smem, kv_smem, p_smem, alpha_smem, lse_smem, empty_bars, p_full, p_empty, start,
        end, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, NBUF: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, DIRECT: gl.constexpr,
        CLUSTER2: gl.constexpr,
    ):  # fmt: skip
        """s_by_one, second warpgroup: per tile, once p and alpha are handed over,
        o[:, 256:] = o * alpha + p . v; at the end o scaled by the 1/l handed over."""
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        acc = gl.zeros([BLOCK_H, DV // 2], gl.float32, layout=O_LAYOUT)
        for i in range(0, n_tiles):
            buf = i % NBUF
            mbarrier.wait(p_full, i & 1)
            gl_fence_async_shared()  # p, and the tile the first warpgroup saw land
            alpha = alpha_smem.load(gl.SliceLayout(1, O_LAYOUT))
            acc = acc * alpha[:, None]
            o_tok = gl_wgmma(p_smem, kv_smem.index(buf).slice(DV // 2, DV // 2, 1), acc,
                             is_async=True)  # fmt: skip
            acc = gl_wgmma_wait(0, deps=[o_tok])
            _cta_barrier()  # every thread has read alpha
            mbarrier.arrive(p_empty)
            mbarrier.arrive(empty_bars.index(buf))
        mbarrier.wait(p_full, n_tiles & 1)
        inv = alpha_smem.load(gl.SliceLayout(1, O_LAYOUT))
        _sm90_hm1_store(
            acc * inv[:, None], inv, DV // 2, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr,
            po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
            BLOCK_H, DV, O_LAYOUT, S_LAYOUT, DIRECT, False, q_smem.slice(DV // 2, DV // 2, 1),
        )  # fmt: skip

    @gluon.jit
    def _sm90_hm1_store(
        out, lse2, c0, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr,
        S_LAYOUT: gl.constexpr, DIRECT: gl.constexpr, WITH_LSE: gl.constexpr,
        stage_smem,
    ):  # fmt: skip
        """One warpgroup's half of o (columns c0 ..): in o's dtype through its half of
        q's buffer (free once the last s is computed) into 16-byte runs, or partials
        straight from the MMA layout."""
        if DIRECT:
            stage_smem.store(out.to(stage_smem.dtype))
            _cta_barrier()
            st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
            out = stage_smem.load(st_layout)
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_layout))
            offs_c = c0 + gl.arange(0, DV // 2, layout=gl.SliceLayout(0, st_layout))
        else:
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_LAYOUT))
            offs_c = c0 + gl.arange(0, DV // 2, layout=gl.SliceLayout(0, O_LAYOUT))
        head_ix = offs_h[:, None]
        offs_hl = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, S_LAYOUT))
        _sm90_store(
            out, lse2, head_ix, offs_c[None, :], head_ix < H, offs_hl, t, sp, H, NUM_SPLITS,
            o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
            DV, DIRECT, WITH_LSE,
        )  # fmt: skip

    @gluon.jit
    def _sm90_kv1_s_wg(
        q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, alpha_smem, lse_smem,
        full_bars, empty_bars, p_full, p_empty, start, end, qk_scale, v_scale, q_tok, hb, H,
        stride_qh, t, sp, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr,
        DIRECT: gl.constexpr, CLUSTER2: gl.constexpr,
    ):  # fmt: skip
        """s_by_one KV-major (up to 32 heads), first warpgroup: per tile sT = kv . qT for
        every head (kv read from shared memory once, not once per warpgroup), the softmax
        with a lazy max (_sm90_kv_lazy_tile), p and alpha handed to the second warpgroup,
        oT[:256] += kv[:, :256]T . pT; at the end 1/l and lse handed over the same way
        (where the second warpgroup keeps its half) and this half of o finished.
        cluster_merge: lse and 1/l also go to the partner; split 1 sends this half there,
        unscaled, as soon as the loop ends."""
        _sm90_per_thread(_VOTE_DECL_ASM, 4)
        _sm90_load_q(q_smem, qpe_smem, q_tok, hb * BLOCK_H, H, stride_qh, BLOCK_H, DV, DR, 4)
        _cta_barrier()  # every warp's part of q is stored (fenced after the first wait)
        rows_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
        m_use = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
        l_part = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, S_LAYOUT))
        acc = gl.zeros([DV // 2, BLOCK_H], gl.float32, layout=O_LAYOUT)
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_LAYOUT)
        # The row sums' one cross-warp reduction takes ~0.7 us at 32 heads (H200) and
        # delays the lse and 1/l the cluster merge and the second warpgroup wait for.
        # From 32 heads it is issued in the last tile beside that tile's p . v (32x128
        # -0.5 us, 32x32 -0.2, 32x64 -0.1); at 8-16 heads that cost 0.1-0.2 us (journal,
        # variant 65), so there it stays after the loop.
        SUM_IN_LOOP: gl.constexpr = BLOCK_H >= 32
        for i in range(0, n_tiles):
            buf = i % NBUF
            kv_i = kv_smem.index(buf)
            s, ss = _sm90_kv_scores(
                q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, full_bars, i, start, end,
                s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,
            )  # fmt: skip
            m_i, m_use, l_part, acc = _sm90_kv_lazy_tile(
                s, ss, qk_scale, m_i, m_use, l_part, acc, i, p_smem, alpha_smem, p_empty,
                BLOCK_N, BLOCK_H, O_LAYOUT,
            )  # fmt: skip
            mbarrier.arrive(p_full)  # all of p and alpha is stored
            kv_t = kv_i.slice(0, DV // 2, 1).permute((1, 0))
            o_tok = gl_wgmma(kv_t, p_smem, acc, is_async=True)
            if SUM_IN_LOOP:  # noqa: SIM102 - a constexpr branch around a runtime one
                if i == n_tiles - 1:
                    l_i = gl.sum(l_part, 0)
            acc = gl_wgmma_wait(0, deps=[o_tok])
            mbarrier.arrive(empty_bars.index(buf))
        if CLUSTER2:  # the partner's barrier is ready; in split 1 this half goes at once
            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)
            if sp == 1:  # unscaled: the partner scales it by the 1/l sent below
                _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)
        if not SUM_IN_LOOP:
            l_i = gl.sum(l_part, 0)
        lse2, inv = _sm90_lse2_inv(m_i, l_i, v_scale)
        inv = gl.convert_layout(inv, gl.SliceLayout(0, O_LAYOUT))
        lse2 = gl.convert_layout(lse2, gl.SliceLayout(0, O_LAYOUT))
        if CLUSTER2:
            _sm90_kv1_send_stats(lse2, inv, BLOCK_H, O_LAYOUT)
        if not CLUSTER2 or sp == 1:  # the second warpgroup keeps its half: hand 1/l over
            mbarrier.wait(p_empty, (n_tiles & 1) ^ 1)  # the last tile's alpha has been read
            alpha_smem.store(inv)
            lse_smem.store(lse2)
            _cta_barrier()
            mbarrier.arrive(p_full)
        if CLUSTER2:  # after the hand-over, which overlaps the remote stores' drain
            if sp == 1:
                _sm90_per_thread(_XCHG_SIGNAL2_ASM, 4)
            else:
                _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)
        if not CLUSTER2 or sp == 0:
            _sm90_kv1_finish(
                acc * inv[None, :], lse2, 0, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr,
                plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh, BLOCK_H, DV, O_LAYOUT,
                DIRECT, CLUSTER2, q_smem.slice(0, DV // 2, 1),
            )  # fmt: skip

    @gluon.jit
    def _sm90_kv1_o_wg(
        q_smem, kv_smem, p_smem, alpha_smem, lse_smem, empty_bars, p_full, p_empty, start,
        end, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, NBUF: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, DIRECT: gl.constexpr,
        CLUSTER2: gl.constexpr,
    ):  # fmt: skip
        """s_by_one KV-major, second warpgroup: per tile, once p and alpha are handed
        over, oT[256:] = oT * alpha + kv[:, 256:]T . pT; at the end this half of o scaled
        by the 1/l handed over, and finished (cluster_merge, split 0: sent to the partner
        unscaled as soon as the loop ends)."""
        if CLUSTER2:  # every thread of the cluster arrives once
            _sm90_per_thread(_CLUSTER_ARRIVE_ASM, 4)
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        acc = gl.zeros([DV // 2, BLOCK_H], gl.float32, layout=O_LAYOUT)
        for i in range(0, n_tiles):
            buf = i % NBUF
            mbarrier.wait(p_full, i & 1)
            gl_fence_async_shared()  # p, and the tile the first warpgroup saw land
            alpha = alpha_smem.load(gl.SliceLayout(0, O_LAYOUT))
            acc = acc * alpha[None, :]
            kv_t = kv_smem.index(buf).slice(DV // 2, DV // 2, 1).permute((1, 0))
            o_tok = gl_wgmma(kv_t, p_smem, acc, is_async=True)
            acc = gl_wgmma_wait(0, deps=[o_tok])
            _cta_barrier()  # every thread has read alpha
            mbarrier.arrive(p_empty)
            mbarrier.arrive(empty_bars.index(buf))
        if CLUSTER2 and sp == 0:  # split 0 keeps the first half: send this one, unscaled
            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)  # the partner's barrier is ready
            _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)
            _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)
        else:
            mbarrier.wait(p_full, n_tiles & 1)
            inv = alpha_smem.load(gl.SliceLayout(0, O_LAYOUT))
            lse2 = lse_smem.load(gl.SliceLayout(0, O_LAYOUT))
            _sm90_kv1_finish(
                acc * inv[None, :], lse2, 1, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr,
                plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh, BLOCK_H, DV, O_LAYOUT,
                DIRECT, CLUSTER2, q_smem.slice(DV // 2, DV // 2, 1),
            )  # fmt: skip

    @gluon.jit
    def _sm90_kv1_xchg_offsets(BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr):
        """cluster_merge, s_by_one: byte offsets of a warpgroup's half of oT [DV/2, BLOCK_H]
        in the exchange buffer. Sender and keeper are the same warpgroup of the two CTAs,
        so the same layout: each 4-element register group (rows r and r + 8, two heads)
        has its own 16-byte slot, and a warp's 32 lanes write 512 consecutive bytes."""
        rows = gl.arange(0, DV // 2, layout=gl.SliceLayout(1, O_LAYOUT))[:, None]
        heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, O_LAYOUT))[None, :]
        lane = (rows % 8) * 4 + (heads % 8) // 2
        return _XCHG_DATA + (((rows // 16) * (BLOCK_H // 8) + heads // 8) * 32 + lane) * 16

    @gluon.jit
    def _sm90_kv1_send_half(
        acc, BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr
    ):  # fmt: skip
        """cluster_merge, s_by_one: this warpgroup's half of oT, not yet divided by l, into
        the partner's buffer as soon as the loop ends (the partner scales it by the 1/l
        that comes with the lse)."""
        off = _sm90_kv1_xchg_offsets(BLOCK_H, DV, O_LAYOUT)
        gl.inline_asm_elementwise(
            _XCHG_PUT4_ASM, "=r,=r,=r,=r,f,f,f,f,r,r,r,r,r,r,r,r", [acc, off, gl.full_like(off, 1)],
            dtype=gl.int32, is_pure=False, pack=4,
        )  # fmt: skip

    @gluon.jit
    def _sm90_kv1_send_stats(lse2, inv, BLOCK_H: gl.constexpr, O_LAYOUT: gl.constexpr):
        """cluster_merge, s_by_one: this split's lse (base 2) and 1/l (times v_scale) per
        head into the partner's buffer."""
        off = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, O_LAYOUT)) * 4
        gl.inline_asm_elementwise(
            _XCHG_PUT_ASM, "=r,f,r", [lse2, 16 + off], dtype=gl.int32, is_pure=False, pack=1
        )
        gl.inline_asm_elementwise(
            _XCHG_PUT_ASM, "=r,f,r", [inv, _XCHG_INV + off], dtype=gl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip

    @gluon.jit
    def _sm90_kv1_store_o(
        o, c0, hb, t, H, o_ptr, stride_ot, stride_oh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, stage_smem,
    ):  # fmt: skip
        """One warpgroup's half of o (oT [256, BLOCK_H], columns c0 ..) in o's dtype
        through its half of q's buffer (free after the last q . kT) into 16-byte runs."""
        stage_smem.store(gl.permute(o.to(stage_smem.dtype), (1, 0)))
        _cta_barrier()
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        v = stage_smem.load(st_layout)
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_layout))
        offs_c = c0 + gl.arange(0, DV // 2, layout=gl.SliceLayout(0, st_layout))
        o_ptrs = o_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_c[None, :]
        gl.store(o_ptrs, v.to(o_ptr.dtype.element_ty), mask=(offs_h < H)[:, None])

    @gluon.jit
    def _sm90_kv1_finish(
        out, lse2, HALF: gl.constexpr, hb, t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr,
        plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr,
        DIRECT: gl.constexpr, CLUSTER2: gl.constexpr, stage_smem,
    ):  # fmt: skip
        """s_by_one KV-major: warpgroup HALF's normalised half of oT (o's columns
        [HALF * 256, HALF * 256 + 256)) stored, or as split-K partials, or with
        cluster_merge merged with the partner CTA's same warpgroup's half (split s keeps
        columns [256 s, 256 s + 256): only its warpgroup s gets here; the other sent its
        half at its loop end). The lse goes with the first warpgroup's part."""
        c0: gl.constexpr = HALF * (DV // 2)
        h_l: gl.constexpr = gl.SliceLayout(0, O_LAYOUT)
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=h_l)
        if CLUSTER2:  # called in the warpgroup that keeps (HALF == sp): merge and store
            off = _sm90_kv1_xchg_offsets(BLOCK_H, DV, O_LAYOUT)
            off_l = gl.arange(0, BLOCK_H, layout=h_l) * 4
            _sm90_per_thread(_XCHG_WAIT_ASM, 4)
            o_other = gl.inline_asm_elementwise(
                _XCHG_GET4_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r", [off, gl.full_like(off, 1)],
                dtype=gl.float32, is_pure=False, pack=4,
            )  # fmt: skip
            lse_other = gl.inline_asm_elementwise(
                _XCHG_GET_ASM, "=f,r", [16 + off_l], dtype=gl.float32, is_pure=False, pack=1
            )
            inv_other = gl.inline_asm_elementwise(
                _XCHG_GET_ASM, "=f,r", [_XCHG_INV + off_l], dtype=gl.float32, is_pure=False,
                pack=1,
            )  # fmt: skip
            o, lse_tot = _sm90_merge2(out, o_other * inv_other[None, :], lse2, lse_other)
            _sm90_kv1_store_o(o, c0, hb, t, H, o_ptr, stride_ot, stride_oh, BLOCK_H, DV, stage_smem)
            if HALF == 0:  # split 0 writes the lse
                gl.store(
                    lse_ptr + t * stride_lt + offs_h * stride_lh, lse_tot * 0.6931471805599453,
                    mask=offs_h < H,
                )  # fmt: skip
        elif DIRECT:
            _sm90_kv1_store_o(
                out, c0, hb, t, H, o_ptr, stride_ot, stride_oh, BLOCK_H, DV, stage_smem
            )
            if HALF == 0:
                gl.store(
                    lse_ptr + t * stride_lt + offs_h * stride_lh, lse2 * 0.6931471805599453,
                    mask=offs_h < H,
                )
        else:  # fp32 partials straight from the MMA layout
            cols = c0 + gl.arange(0, DV // 2, layout=gl.SliceLayout(1, O_LAYOUT))
            _sm90_store(
                out, lse2, offs_h[None, :], cols[:, None], (offs_h < H)[None, :], offs_h,
                t, sp, H, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
                stride_ot, stride_oh, stride_lt, stride_lh, DV, False, HALF == 0,
            )  # fmt: skip

    @gluon.jit
    def _sm90_normalise(
        m_i, l_part, acc, hb, v_scale,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, NUM_WARPS: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr,
        HEAD_MAJOR: gl.constexpr,
    ):  # fmt: skip
        """A program's o scaled by 1/l in a blocked layout (16-byte runs along the 512
        columns), its lse (base 2), the heads of the lse, and head / column indices of
        out's elements (broadcast to its shape)."""
        # Head-major: o [BLOCK_H, DV], m and l per row; KV-major: oT [DV, BLOCK_H].
        # The tile-row axis of sT / s (and o's column axis): per-head vectors slice it away.
        ROWS: gl.constexpr = 1 if HEAD_MAJOR else 0
        if LATE_SUM:  # noqa: SIM108
            l_i = gl.sum(l_part, ROWS)
        else:
            l_i = l_part
        offs_hl = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(ROWS, S_LAYOUT))
        lse2, inv = _sm90_lse2_inv(m_i, l_i, v_scale)
        inv = gl.convert_layout(inv, gl.SliceLayout(ROWS, O_LAYOUT))
        if HEAD_MAJOR:
            st_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NUM_WARPS, 1], [1, 0])
            out = gl.convert_layout(acc * inv[:, None], st_layout)
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_layout))
            offs_c = gl.arange(0, DV, layout=gl.SliceLayout(0, st_layout))
            head_ix = offs_h[:, None]
            col_ix = offs_c[None, :]
        else:
            st_layout: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, NUM_WARPS], [0, 1])
            out = gl.convert_layout(acc * inv[None, :], st_layout)
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, st_layout))
            offs_c = gl.arange(0, DV, layout=gl.SliceLayout(1, st_layout))
            head_ix = offs_h[None, :]
            col_ix = offs_c[:, None]
        return out, lse2, offs_hl, head_ix, col_ix

    @gluon.jit
    def _sm90_epilogue(
        m_i, l_part, acc, hb, t, sp, H, NUM_SPLITS, v_scale,
        o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, DV: gl.constexpr, NUM_WARPS: gl.constexpr,
        O_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LATE_SUM: gl.constexpr,
        HEAD_MAJOR: gl.constexpr, DIRECT: gl.constexpr,
    ):  # fmt: skip
        """A program's o scaled by 1/l, and lse, stored (o or split-K partials)."""
        out, lse2, offs_hl, head_ix, col_ix = _sm90_normalise(
            m_i, l_part, acc, hb, v_scale, BLOCK_H, DV, NUM_WARPS, O_LAYOUT, S_LAYOUT,
            LATE_SUM, HEAD_MAJOR,
        )  # fmt: skip
        _sm90_store(
            out, lse2, head_ix, col_ix, head_ix < H, offs_hl, t, sp, H, NUM_SPLITS,
            o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
            DV, DIRECT, True,
        )  # fmt: skip

    # SM90 split kernel in Gluon. KV-major: sT = kv . qT and oT += kvT . pT on
    # wgmma, so the 64 gathered rows are the MMA's M and q and p are B operands the
    # tensor cores read from shared memory once a tile (the Triton kernel's
    # mma.sync has every warp re-read its q fragments per tile). The pipeline is
    # written out, either in the MMA warps (_sm90_loop_inline) or, with P_WARPS,
    # in producer warps of their own that keep the NBUF buffers filled while the
    # MMA warps compute (_sm90_ws_gather / _sm90_ws_mma, mbarrier handshakes);
    # with HEAD_MAJOR the MMA warps run 64-head blocks with heads as M instead.
    # Triton's pipeliner, given the same KV-major loop, issued the next gather
    # after both MMAs and read its slots right before it, exposing both latencies.
    # O_LAYOUT / S_LAYOUT (the MMA accumulators' layouts) come from _sm90_constexprs.
    @gluon.jit(do_not_specialize=["NUM_SPLITS", "NUM_HBLK"])
    def _sparse_mla_split_kernel_sm90(
        q_ptr,
        kv_ptr,
        idx_ptr,
        o_ptr,
        lse_ptr,
        po_ptr,
        plse_ptr,
        qk_scale,
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
        BLOCK_H: gl.constexpr,
        BLOCK_N: gl.constexpr,
        DV: gl.constexpr,
        DR: gl.constexpr,
        DIRECT: gl.constexpr,
        NBUF: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        P_SWIZZLE: gl.constexpr,
        USE_PDL: gl.constexpr,
        O_LAYOUT: gl.constexpr,
        S_LAYOUT: gl.constexpr,
        LATE_ISSUE: gl.constexpr,
        LATE_SUM: gl.constexpr,
        P_WARPS: gl.constexpr,
        P_REGS: gl.constexpr,
        HEAD_MAJOR: gl.constexpr,
        XCHG_MAX: gl.constexpr,
        S_BY_ONE: gl.constexpr,
        O_REGS: gl.constexpr,
        CLUSTER2: gl.constexpr,
    ):
        if USE_PDL:  # as gdc_launch_dependents: the merge's programs may launch now
            gl.inline_asm_elementwise(
                "griddepcontrol.launch_dependents; // dummy $0",
                "=r",
                [],
                dtype=gl.int32,
                is_pure=False,
                pack=1,
            )
        # Launched as a programmatic dependent (pdl_wait in _launch): no global access
        # before the previous grid has completed and its writes are visible. The worker
        # partitions start after these warps reach warp_specialize. A no-op otherwise.
        gl.inline_asm_elementwise(
            "griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )
        sl128: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=16, rank=2
        )
        p_sl: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=P_SWIZZLE, element_bitwidth=16, rank=2
        )
        dtype: gl.constexpr = q_ptr.dtype.element_ty

        pid = gl.program_id(0)
        hb = pid % NUM_HBLK
        rest = pid // NUM_HBLK
        sp = rest % NUM_SPLITS
        t = (rest // NUM_SPLITS).to(gl.int64)
        if CLUSTER2:  # the exchange buffer's barrier, then this thread's cluster arrive
            _sm90_per_thread(_XCHG_INIT_ASM, NUM_WARPS)

        # q -> shared memory once ([BLOCK_H, 576] K-major: wgmma's B after a permute).
        # With producer warps the MMA warps load it, so the first gathers go out at once.
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DV], sl128)
        qpe_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DR], sl128)
        if P_WARPS == 0:
            _sm90_load_q(
                q_smem, qpe_smem, q_ptr + t * stride_qt, hb * BLOCK_H, H, stride_qh,
                BLOCK_H, DV, DR, NUM_WARPS,
            )  # fmt: skip
        kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, DV], sl128)
        kpe_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, DR], sl128)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H], p_sl)

        start = sp * SPLIT_LEN
        end = gl.minimum(start + SPLIT_LEN, TOPK)
        idx_row = idx_ptr + t * stride_it
        if P_WARPS > 0:
            full_bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
            empty_bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
            slot_smem = gl.allocate_shared_memory(
                gl.int32, [NBUF, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0])
            )
            # Head-major with XCHG_MAX: each warpgroup's row max for this tile.
            RED_H: gl.constexpr = BLOCK_H if XCHG_MAX else 1
            red_smem = gl.allocate_shared_memory(
                gl.float32, [RED_H, 2], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            )
            for j in gl.static_range(NBUF):
                mbarrier.init(full_bars.index(j), count=P_WARPS * 32)
                mbarrier.init(empty_bars.index(j), count=1 + S_BY_ONE)
            if S_BY_ONE:  # three one-warpgroup partitions; each stores its own part
                alpha_smem = gl.allocate_shared_memory(
                    gl.float32, [BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0])
                )
                p_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
                mbarrier.init(p_bars.index(0), count=1)  # p and alpha handed over
                mbarrier.init(p_bars.index(1), count=1)  # ... and read
                if HEAD_MAJOR:  # 1/l alone is handed over at the end (no clusters here)
                    lse_smem = alpha_smem
                else:  # KV-major: the lse too, with 1/l
                    lse_smem = gl.allocate_shared_memory(
                        gl.float32, [BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0])
                    )
                gl.warp_specialize(
                    [
                        (
                            _sm90_hm1_s_wg if HEAD_MAJOR else _sm90_kv1_s_wg,
                            (q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, alpha_smem,
                             lse_smem, full_bars, empty_bars, p_bars.index(0), p_bars.index(1),
                             start, end, qk_scale, v_scale, q_ptr + t * stride_qt, hb, H,
                             stride_qh, t, sp, NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr,
                             stride_ot, stride_oh, stride_lt, stride_lh, BLOCK_H, BLOCK_N, DV,
                             DR, NBUF, O_LAYOUT, S_LAYOUT, DIRECT, CLUSTER2),
                        ),
                        (
                            _sm90_hm1_o_wg if HEAD_MAJOR else _sm90_kv1_o_wg,
                            (q_smem, kv_smem, p_smem, alpha_smem, lse_smem, empty_bars,
                             p_bars.index(0), p_bars.index(1), start, end, hb, t, sp, H,
                             NUM_SPLITS, o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh,
                             stride_lt, stride_lh, BLOCK_H, BLOCK_N, DV, NBUF, O_LAYOUT,
                             S_LAYOUT, DIRECT, CLUSTER2),
                        ),
                        (
                            _sm90_ws_gather,
                            (kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr,
                             idx_row, start, end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR,
                             NBUF, P_WARPS, CLUSTER2),
                        ),
                    ],
                    [4, P_WARPS],
                    [O_REGS, P_REGS],
                )  # fmt: skip
            else:
                m_i, l_part, acc = gl.warp_specialize(
                    [
                        (
                            _sm90_ws_mma,
                            (q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, slot_smem, full_bars,
                             empty_bars, red_smem, start, end, qk_scale, q_ptr + t * stride_qt,
                             hb * BLOCK_H, H, stride_qh, BLOCK_H, BLOCK_N, DV, DR, NBUF,
                             NUM_WARPS, O_LAYOUT, S_LAYOUT, LATE_SUM, HEAD_MAJOR, XCHG_MAX),
                        ),
                        (
                            _sm90_ws_gather,
                            (kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row,
                             start, end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR, NBUF,
                             P_WARPS, CLUSTER2),
                        ),
                    ],
                    [P_WARPS],
                    [P_REGS],
                )  # fmt: skip
        else:
            m_i, l_part, acc = _sm90_loop_inline(
                q_smem, qpe_smem, kv_smem, kpe_smem, p_smem, kv_ptr, idx_row, start, end,
                qk_scale, PAGE, stride_kvb, stride_kvs,
                BLOCK_H, BLOCK_N, DV, DR, NBUF, NUM_WARPS, O_LAYOUT, S_LAYOUT, LATE_ISSUE,
                LATE_SUM,
            )  # fmt: skip

        if CLUSTER2 and not S_BY_ONE:
            _sm90_cluster_epilogue(
                m_i, l_part, acc, t, sp, H, v_scale, o_ptr, lse_ptr,
                stride_ot, stride_oh, stride_lt, stride_lh,
                BLOCK_H, DV, NUM_WARPS, O_LAYOUT, S_LAYOUT,
            )  # fmt: skip
        elif not S_BY_ONE:  # (its partitions store their own parts)
            _sm90_epilogue(
                m_i, l_part, acc, hb, t, sp, H, NUM_SPLITS, v_scale,
                o_ptr, lse_ptr, po_ptr, plse_ptr, stride_ot, stride_oh, stride_lt, stride_lh,
                BLOCK_H, DV, NUM_WARPS, O_LAYOUT, S_LAYOUT, LATE_SUM, HEAD_MAJOR, DIRECT,
            )  # fmt: skip

    def _sm90_constexprs(
        cfg: SparseMLAConfig, direct: bool, pdl: bool, cluster: bool = False
    ) -> dict[str, object]:
        """The Gluon kernel's compile-time arguments for a config, the MMA layouts
        included (one definition for every tile loop and the epilogue)."""
        wg = cfg.num_warps // 4
        if cfg.s_by_one and not cfg.head_major:  # sT [64, H] and each half of oT [256, H]
            s_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cfg.block_h, 16]
            )
            o_layout = s_layout
        elif cfg.s_by_one:  # one warpgroup a partition: s [64, 64], half of o [64, 256]
            s_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cfg.block_n, 16]
            )
            o_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D_LATENT // 2, 16]
            )
        elif cfg.head_major:  # heads as M; the warpgroups split s's rows and o's columns
            s_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, cfg.block_n // wg, 16]
            )
            o_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, D_LATENT // wg, 16]
            )
        else:
            # oT: the warpgroups split its 512 rows, each with every head as N (one read
            # of kvT a tile). sT: the warpgroups split the heads, or (dup_s) each computes
            # all of sT: twice the q.kT work, but alpha is then already in oT's layout and
            # needs no exchange through shared memory.
            o_layout = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[cfg.num_warps, 1], instr_shape=[16, cfg.block_h, 16]
            )
            s_layout = o_layout
            if not cfg.dup_s:
                s_layout = gl.NVMMADistributedLayout(
                    version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, cfg.block_h // wg, 16]
                )
        return {
            "BLOCK_H": cfg.block_h,
            "BLOCK_N": cfg.block_n,
            "DV": D_LATENT,
            "DR": D_ROPE,
            "DIRECT": direct,
            "NBUF": cfg.num_stages,
            "NUM_WARPS": cfg.num_warps,
            "P_SWIZZLE": _nvmma_swizzle(2 * cfg.block_h),
            "USE_PDL": pdl,
            "O_LAYOUT": o_layout,
            "S_LAYOUT": s_layout,
            "LATE_ISSUE": cfg.late_issue,
            # Row sums per row until the end (no cross-warp reduction per tile), except
            # at 64 heads without producer warps, where those registers are missing.
            "LATE_SUM": cfg.block_h < 64 or cfg.sum_late or cfg.head_major,
            "P_WARPS": cfg.producer_warps,
            "P_REGS": cfg.producer_regs,
            "HEAD_MAJOR": cfg.head_major,
            "XCHG_MAX": cfg.xchg_max,
            "S_BY_ONE": cfg.s_by_one,
            "O_REGS": S_BY_ONE_O_REGS,
            "CLUSTER2": cluster,
        }
