# SPDX-License-Identifier: Apache-2.0
"""Sparse MLA, the SM120 family: a Gluon kernel built from the Ampere-family operations
that SM120 (RTX PRO 6000 Blackwell) has: producer warps gathering by cp.async into a
ring of mbarrier-guarded stages, mma.sync (m16n8k16) fed by ldmatrix (docs/sparse-mla-kernel.md).

Why a kernel of its own: the portable Triton kernel issues its gathers and both products
from one partition with at most two tiles in flight, and at SM120's one program a SM the
gathers wait on the products. Here the producers refill each stage as soon as the MMA
warps release it, so the stages stay in flight while the products run.

Two ways to divide a tile among the MMA warps: by s's columns (_sm120_mma: every warp
reads all of q from shared memory, p crosses through shared memory) or, with KSPLIT,
by q.kT's columns (_sm120_mma_k: each warp holds a quarter of q, the quarters' shares
of s are summed through shared memory, p stays in registers).

Only triton_sparse_mla.py chooses and launches it. Imports Triton's Gluon only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .triton_sparse_mla_triton import D_LATENT, D_ROPE

if TYPE_CHECKING:  # annotations only: the public module imports this one
    from .triton_sparse_mla import SparseMLAConfig

try:  # Gluon's Ampere-family operations (Triton >= 3.5)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_cp
    from triton.experimental.gluon.language.nvidia.ampere import mbarrier, mma_v2

    # The CTA-wide barrier: thread_barrier in Triton 3.6, barrier from 3.7 (the image's).
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # cp.async into shared memory: async_copy_global_to_shared up to 3.8, async_load after.
    _cp_async = getattr(gl_cp, "async_load", None) or gl_cp.async_copy_global_to_shared
    # A shared-memory view with another dtype: _reinterpret up to 3.8, reinterpret after.
    _VIEW_NEW = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
    _HAS_GLUON_SM120 = True
except (ImportError, AttributeError):  # pragma: no cover - Triton without (this) Gluon
    _HAS_GLUON_SM120 = False

# q.kT in chunks of this many latent columns: one chunk's operands in registers at a time.
QK_CHUNK = 64
# The MMA's k: p.V runs over the tile's rows in steps of this many.
MMA_K = 16


if _HAS_GLUON_SM120:

    @gluon.jit
    def _sm120_rows(base, slots, PAGE, stride_kvb, stride_kvs):
        """Where each slot's row starts (slots < 0 point at row 0) and which are valid.
        Slots are int32 (block * block_size + offset): divide in 32 bits, widen after."""
        valid = slots >= 0
        s = gl.where(valid, slots, 0)
        blk = s // PAGE
        off = (s - blk * PAGE).to(gl.int64) * stride_kvs
        return base + blk.to(gl.int64) * stride_kvb + off, valid

    @gluon.jit
    def _sm120_gather(
        kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start, end,
        PAGE, stride_kvb, stride_kvs,
        BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, NBUF: gl.constexpr,
        P_WARPS: gl.constexpr, KS: gl.constexpr,
    ):  # fmt: skip
        """Producer warps: by cp.async from a cache in q's dtype, through registers
        (widened) from an fp8 one. KS > 0: K-split stages (_sm120_gather_cp)."""
        if kv_ptr.dtype.element_ty == kv_smem.dtype:
            _sm120_gather_cp(
                kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start,
                end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR, NBUF, P_WARPS, KS,
            )  # fmt: skip
        else:
            _sm120_gather_widen(
                kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start,
                end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR, NBUF, P_WARPS, KS,
            )  # fmt: skip

    @gluon.jit
    def _sm120_part_cols(
        BLOCK_N: gl.constexpr, KS: gl.constexpr, W: gl.constexpr, BASE: gl.constexpr,
        L3: gl.constexpr,
    ):  # fmt: skip
        """A K-split tile's pieces in layout L3 ([KS, BLOCK_N, W]): the rows' index, and
        each element's column BASE + k * W + c (part k's slice of W columns)."""
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        parts = gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        cols = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        return rows, BASE + (parts * W)[:, None, None] + cols[None, None, :]

    @gluon.jit
    def _sm120_gather_cp(
        kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start, end,
        PAGE, stride_kvb, stride_kvs,
        BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, NBUF: gl.constexpr,
        P_WARPS: gl.constexpr, KS: gl.constexpr,
    ):  # fmt: skip
        """Producer warps, cp.async: tile i's slots and rows into stage i % NBUF once the
        MMA warps have released it; each thread's copies complete the stage's full barrier
        (cp.async.mbarrier.arrive.noinc: the barrier counts the producer threads). Slots
        < 0 copy nothing; the MMA warps mask those rows' scores. KS > 0: K-split stages,
        latent [KS, BLOCK_N, DV // KS] and rope [KS, BLOCK_N, DR // KS], part k holding
        every row's k-th slice of the columns (the k-th MMA warp's operands)."""
        i_layout: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
        if KS:  # a warp's lanes cover one part's columns of consecutive rows
            DQ: gl.constexpr = DV // KS
            DQR: gl.constexpr = DR // KS
            g3: gl.constexpr = gl.BlockedLayout(
                [1, 1, 8], [1, 32 // (DQ // 8), DQ // 8], [1, P_WARPS, 1], [2, 1, 0]
            )
            r3: gl.constexpr = gl.BlockedLayout(
                [1, 1, 8], [1, 32 // (DQR // 8), DQR // 8], [1, P_WARPS, 1], [2, 1, 0]
            )
            rows_g, col_g = _sm120_part_cols(BLOCK_N, KS, DQ, 0, g3)
            rows_r, col_r = _sm120_part_cols(BLOCK_N, KS, DQR, DV, r3)
        else:
            g_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [P_WARPS, 1], [1, 0])
            r_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
            rows_g = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
            rows_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, r_layout))
            col_g = gl.arange(0, DV, layout=gl.SliceLayout(0, g_layout))[None, :]
            col_r = DV + gl.arange(0, DR, layout=gl.SliceLayout(0, r_layout))[None, :]
        rows_i = gl.arange(0, BLOCK_N, layout=i_layout)
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        sg = gl.load(idx_row + start + rows_g, mask=start + rows_g < end, other=-1)
        sr = gl.load(idx_row + start + rows_r, mask=start + rows_r < end, other=-1)
        for i in range(0, n_tiles):
            # The next tile's slots load while this one waits for its stage.
            n1 = start + (i + 1) * BLOCK_N
            sg_next = gl.load(idx_row + n1 + rows_g, mask=n1 + rows_g < end, other=-1)
            sr_next = gl.load(idx_row + n1 + rows_r, mask=n1 + rows_r < end, other=-1)
            b = i % NBUF
            mbarrier.wait(empty_bars.index(b), ((i // NBUF) & 1) ^ 1, pred=i >= NBUF)
            n0 = n1 - BLOCK_N
            _cp_async(
                slot_smem.index(b), idx_row + n0 + rows_i, mask=n0 + rows_i < end
            )
            row_g, vg = _sm120_rows(kv_ptr, sg, PAGE, stride_kvb, stride_kvs)
            if KS:
                _cp_async(kv_smem.index(b), row_g[None, :, None] + col_g, mask=vg[None, :, None])
            else:
                _cp_async(kv_smem.index(b), row_g[:, None] + col_g, mask=vg[:, None])
            row_r, vr = _sm120_rows(kv_ptr, sr, PAGE, stride_kvb, stride_kvs)
            if KS:
                _cp_async(kpe_smem.index(b), row_r[None, :, None] + col_r, mask=vr[None, :, None])
            else:
                _cp_async(kpe_smem.index(b), row_r[:, None] + col_r, mask=vr[:, None])
            gl_cp.mbarrier_arrive(full_bars.index(b), increment_count=False)
            sg = sg_next
            sr = sr_next

    @gluon.jit
    def _sm120_fetch(kv_words, sg, sr, col_g, col_r, PAGE, stride_kvb, stride_kvs):
        """One tile's fp8 rows into registers as 32-bit words (four values a word): the
        latent part (slots sg) and the rope part (slots sr) at word columns col_g and
        col_r, [cols] or, K-split, [KS, 1, cols]; rows of slot < 0 read as zeros.
        Strides are in words."""
        row_g, vg = _sm120_rows(kv_words, sg, PAGE, stride_kvb, stride_kvs)
        row_r, vr = _sm120_rows(kv_words, sr, PAGE, stride_kvb, stride_kvs)
        if len(col_g.shape) == 3:
            x_g = gl.load(row_g[None, :, None] + col_g, mask=vg[None, :, None], other=0)
            x_r = gl.load(row_r[None, :, None] + col_r, mask=vr[None, :, None], other=0)
        else:
            x_g = gl.load(row_g[:, None] + col_g[None, :], mask=vg[:, None], other=0)
            x_r = gl.load(row_r[:, None] + col_r[None, :], mask=vr[:, None], other=0)
        return x_g, x_r

    @gluon.jit
    def _sm120_widen(x, TO_BF16: gl.constexpr):
        """Words of four e4m3 values [R, W] -> words of two 16-bit values [R, 2W], in
        order, exactly. fp16: cvt.rn.f16x2.e4m3x2. bf16: each byte placed in a 16-bit
        half, its exponent and mantissa shifted under bf16's (sign kept), then one
        multiply by 2^120 rebiases normals and subnormals alike: integer-rate
        instructions, where the cvt route through f16 and f32 takes eight a word at the
        conversion unit's lower rate.
        (e4m3's NaN, never in a cache, would come out as a finite number.)"""
        if TO_BF16:
            lo, hi = gl.inline_asm_elementwise(
                """{
                .reg .b32 a, b, sa, sb, k;
                prmt.b32 a, $2, 0, 0x1404;
                prmt.b32 b, $2, 0, 0x3424;
                and.b32 sa, a, 0x80008000;
                and.b32 sb, b, 0x80008000;
                shr.b32 a, a, 4;
                shr.b32 b, b, 4;
                and.b32 a, a, 0x07f007f0;
                and.b32 b, b, 0x07f007f0;
                or.b32 $0, a, sa;
                or.b32 $1, b, sb;
                mov.b32 k, 0x7b807b80;
                mul.rn.bf16x2 $0, $0, k;
                mul.rn.bf16x2 $1, $1, k;
                }""",
                "=r,=r,r", [x], dtype=(gl.int32, gl.int32), is_pure=True, pack=1,
            )  # fmt: skip
        else:
            lo, hi = gl.inline_asm_elementwise(
                """{
                .reg .b16 a, b;
                mov.b32 {a, b}, $2;
                cvt.rn.f16x2.e4m3x2 $0, a;
                cvt.rn.f16x2.e4m3x2 $1, b;
                }""",
                "=r,=r,r", [x], dtype=(gl.int32, gl.int32), is_pure=True, pack=1,
            )  # fmt: skip
        if len(x.shape) == 3:
            out = gl.reshape(gl.join(lo, hi), [x.shape[0], x.shape[1], 2 * x.shape[2]])
        else:
            out = gl.reshape(gl.join(lo, hi), [x.shape[0], 2 * x.shape[1]])
        return out

    @gluon.jit
    def _sm120_words(stage):
        """A 16-bit stage viewed as 32-bit words: the same bytes, swizzled in the same
        16-byte units (this Triton's name for the view)."""
        sl: gl.constexpr = stage.layout
        layout: gl.constexpr = gl.SwizzledSharedLayout(
            sl.vec // 2, sl.per_phase, sl.max_phase, sl.order
        )
        if len(stage.shape) == 3:  # K-split stages
            shape: gl.constexpr = [stage.shape[0], stage.shape[1], stage.shape[2] // 2]
        else:
            shape: gl.constexpr = [stage.shape[0], stage.shape[1] // 2]
        if _VIEW_NEW:
            view = stage.reinterpret(gl.int32, shape, layout)
        else:
            view = stage._reinterpret(gl.int32, shape, layout)
        return view

    @gluon.jit
    def _sm120_gather_widen(
        kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row, start, end,
        PAGE, stride_kvb, stride_kvs,
        BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, NBUF: gl.constexpr,
        P_WARPS: gl.constexpr, KS: gl.constexpr,
    ):  # fmt: skip
        """Producer warps over an e4m3 cache: the stages hold the tiles widened to q's
        dtype, so the MMA warps run exactly as over a 16-bit cache. cp.async cannot widen:
        the rows come through registers as 32-bit words (an fp8 value a register would
        spill). Tile i + 1's rows are in flight while tile i is widened and stored, and
        its slots two tiles ahead. A stage is complete once every
        producer thread has passed the partition's barrier (the full barrier counts one
        arrival). KS > 0: K-split stages, laid out as _sm120_gather_cp's."""
        # Two words (8 fp8) a thread and a row piece: widened, a warp's 16-byte stores
        # then cover 512 contiguous bytes (16-byte pieces would be 32 bytes apart: twice
        # the store wavefronts).
        i_layout: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
        if KS:  # [KS, BLOCK_N, words]: a warp covers two parts of a row (256 bytes read)
            WG: gl.constexpr = DV // KS // 4  # words of a part's latent slice
            WR: gl.constexpr = DR // KS // 4
            g_layout: gl.constexpr = gl.BlockedLayout(
                [1, 1, 2], [32 // (WG // 2), 1, WG // 2], [1, P_WARPS, 1], [2, 1, 0]
            )
            r_layout: gl.constexpr = gl.BlockedLayout(
                [1, 1, 2], [KS, 32 // KS // (WR // 2), WR // 2], [1, P_WARPS, 1], [2, 0, 1]
            )
            rows_g, col_g = _sm120_part_cols(BLOCK_N, KS, WG, 0, g_layout)
            rows_r, col_r = _sm120_part_cols(BLOCK_N, KS, WR, DV // 4, r_layout)
        else:
            g_layout: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [P_WARPS, 1], [1, 0])
            r_layout: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [P_WARPS, 1], [1, 0])
            rows_g = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
            rows_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, r_layout))
            col_g = gl.arange(0, DV // 4, layout=gl.SliceLayout(0, g_layout))
            col_r = DV // 4 + gl.arange(0, DR // 4, layout=gl.SliceLayout(0, r_layout))
        to_bf16: gl.constexpr = kv_smem.dtype == gl.bfloat16
        kv_words = kv_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
        stride_b = stride_kvb // 4
        stride_s = stride_kvs // 4
        rows_i = gl.arange(0, BLOCK_N, layout=i_layout)
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        sg = gl.load(idx_row + start + rows_g, mask=start + rows_g < end, other=-1)
        sr = gl.load(idx_row + start + rows_r, mask=start + rows_r < end, other=-1)
        x_g, x_r = _sm120_fetch(kv_words, sg, sr, col_g, col_r, PAGE, stride_b, stride_s)
        n1 = start + BLOCK_N
        sg = gl.load(idx_row + n1 + rows_g, mask=n1 + rows_g < end, other=-1)
        sr = gl.load(idx_row + n1 + rows_r, mask=n1 + rows_r < end, other=-1)
        for i in range(0, n_tiles):
            n0 = start + i * BLOCK_N
            x_s = gl.load(idx_row + n0 + rows_i, mask=n0 + rows_i < end, other=-1)
            # Tile i + 1's rows (zeros past the end), then tile i + 2's slots.
            y_g, y_r = _sm120_fetch(kv_words, sg, sr, col_g, col_r, PAGE, stride_b, stride_s)
            n2 = n0 + 2 * BLOCK_N
            sg = gl.load(idx_row + n2 + rows_g, mask=n2 + rows_g < end, other=-1)
            sr = gl.load(idx_row + n2 + rows_r, mask=n2 + rows_r < end, other=-1)
            b = i % NBUF
            mbarrier.wait(empty_bars.index(b), ((i // NBUF) & 1) ^ 1, pred=i >= NBUF)
            _sm120_words(kv_smem.index(b)).store(_sm120_widen(x_g, to_bf16))
            _sm120_words(kpe_smem.index(b)).store(_sm120_widen(x_r, to_bf16))
            slot_smem.index(b).store(x_s)
            _cta_barrier()  # every producer thread's stores are done
            mbarrier.arrive(full_bars.index(b))
            x_g = y_g
            x_r = y_r

    @gluon.jit
    def _sm120_load_q(
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
            mask=(offs_hg < H)[:, None], other=0.0,
        )  # fmt: skip
        q_smem.store(q_c)
        offs_hr = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, r_layout))
        cols_r = gl.arange(0, DR, layout=gl.SliceLayout(0, r_layout))
        q_pe = gl.load(
            q_tok + offs_hr[:, None] * stride_qh + DV + cols_r[None, :],
            mask=(offs_hr < H)[:, None], other=0.0,
        )  # fmt: skip
        qpe_smem.store(q_pe)
        _cta_barrier()

    @gluon.jit
    def _sm120_q_operand(
        q_tok, h0, H, stride_qh, col0, BLOCK_H: gl.constexpr, KC: gl.constexpr,
        A: gl.constexpr,
    ):  # fmt: skip
        """Columns col0 .. col0 + KC of the head block's q, loaded from global memory
        straight into the MMA's A-operand registers (zeros past H)."""
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, A))
        cols = col0 + gl.arange(0, KC, layout=gl.SliceLayout(0, A))
        return gl.load(
            q_tok + offs_h[:, None] * stride_qh + cols[None, :],
            mask=(offs_h < H)[:, None], other=0.0,
        )  # fmt: skip

    @gluon.jit
    def _sm120_q_chunks(
        q_tok, h0, H, stride_qh, BLOCK_H: gl.constexpr, KC: gl.constexpr, A: gl.constexpr
    ):
        """q's latent part as eight KC-column A operands in registers (KC = 64)."""
        return (
            _sm120_q_operand(q_tok, h0, H, stride_qh, 0 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 1 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 2 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 3 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 4 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 5 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 6 * KC, BLOCK_H, KC, A),
            _sm120_q_operand(q_tok, h0, H, stride_qh, 7 * KC, BLOCK_H, KC, A),
        )

    @gluon.jit
    def _sm120_softmax_step(s, slots, cols, end, qk_scale, m_i, l_part):
        """One tile of the online softmax in base 2: s scaled, its columns whose slot is
        < 0 or that lie past `end` masked; p, alpha (o's rescale), the new row max, and
        the row sums kept per element (no reduction across warps per tile)."""
        ok = (slots >= 0) & (cols < end)
        s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        # A row with nothing valid yet keeps m = -inf; subtract 0 instead (no NaN).
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        return p, alpha, m_new, l_part * alpha[:, None] + p

    @gluon.jit
    def _sm120_mma(
        q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, p_smem, full_bars, empty_bars,
        start, end, qk_scale, q_tok, h0, H, stride_qh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, NUM_WARPS: gl.constexpr, KC: gl.constexpr, MK: gl.constexpr,
        HOLD_Q: gl.constexpr, CHAINS: gl.constexpr, L: gl.constexpr,
    ):  # fmt: skip
        """MMA warps, head-major: per tile s = q.kvT [BLOCK_H, BLOCK_N] in KC-column
        chunks, the online softmax in base 2, and o += p.V over the rows in MK steps.
        s and o share one MMA layout, so alpha needs no conversion. q is loaded here, so
        the producers' first gathers go out meanwhile; HOLD_Q keeps it in registers (144
        a thread at 16 heads) instead of re-reading it from shared memory every tile."""
        A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L, k_width=2)
        B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=L, k_width=2)
        if HOLD_Q:  # no q in shared memory at all
            gl.static_assert(KC * 8 == DV)
            q_regs = _sm120_q_chunks(q_tok, h0, H, stride_qh, BLOCK_H, KC, A)
            qpe_regs = _sm120_q_operand(q_tok, h0, H, stride_qh, DV, BLOCK_H, DR, A)
        else:
            _sm120_load_q(q_smem, qpe_smem, q_tok, h0, H, stride_qh, BLOCK_H, DV, DR, NUM_WARPS)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, L))
        # Row sums per element until the end: no reduction across the warps per tile.
        l_part = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=L)
        acc = gl.zeros([BLOCK_H, DV], gl.float32, layout=L)
        cols_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        for i in range(0, n_tiles):
            b = i % NBUF
            mbarrier.wait(full_bars.index(b), (i // NBUF) & 1)
            kv = kv_smem.index(b)
            # A warp's s is one m16n8 tile, so one accumulator would chain all 36 of
            # q.kT's MMAs, each waiting for the last: chunk c goes to chain c % CHAINS.
            s0 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=L)
            s1 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=L)
            s2 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=L)
            s3 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=L)
            for c in gl.static_range(DV // KC + 1):
                if c == DV // KC:  # the rope part
                    kb = kpe_smem.index(b).permute((1, 0)).load(B)
                    if HOLD_Q:  # noqa: SIM108 - constexpr branches
                        qa = qpe_regs
                    else:
                        qa = qpe_smem.load(A)
                else:
                    kb = kv.slice(c * KC, KC, dim=1).permute((1, 0)).load(B)
                    if HOLD_Q:  # noqa: SIM108 - constexpr branches
                        qa = q_regs[c]
                    else:
                        qa = q_smem.slice(c * KC, KC, dim=1).load(A)
                if c % CHAINS == 0:
                    s0 = mma_v2(qa, kb, s0)
                elif c % CHAINS == 1:
                    s1 = mma_v2(qa, kb, s1)
                elif c % CHAINS == 2:
                    s2 = mma_v2(qa, kb, s2)
                else:
                    s3 = mma_v2(qa, kb, s3)
            s = s0
            if CHAINS > 1:
                s = s + s1
            if CHAINS > 2:
                s = s + s2
            if CHAINS > 3:
                s = s + s3
            ss = slot_smem.index(b).load(gl.SliceLayout(0, L))
            p, alpha, m_new, l_part = _sm120_softmax_step(
                s, ss, start + i * BLOCK_N + cols_s, end, qk_scale, m_i, l_part
            )
            acc = acc * alpha[:, None]
            # Every warp needs all of p as its A operand: through shared memory (the
            # previous tile's p was read before the barrier that ended its step).
            p_smem.store(p.to(p_smem.dtype))
            _cta_barrier()
            for kc in gl.static_range(0, BLOCK_N, MK):
                pa = p_smem.slice(kc, MK, dim=1).load(A)
                acc = mma_v2(pa, kv.slice(kc, MK, dim=0).load(B), acc)
            m_i = m_new
            _cta_barrier()  # every MMA warp is done with the stage (and with p)
            mbarrier.arrive(empty_bars.index(b))
        return m_i, gl.sum(l_part, 1), acc

    @gluon.jit
    def _sm120_q_parts(
        q_tok, h0, H, stride_qh, col0, PART: gl.constexpr, W: gl.constexpr,
        BLOCK_H: gl.constexpr, KS: gl.constexpr, A3: gl.constexpr,
    ):  # fmt: skip
        """[KS, BLOCK_H, W]: part k is q's columns col0 + k * PART .. + W of the head
        block, loaded from global memory into A-operand registers (zeros past H)."""
        parts = gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, A3)))
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, gl.SliceLayout(2, A3)))
        cols = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, A3)))
        ptrs = (
            q_tok + offs_h[None, :, None] * stride_qh
            + (col0 + parts * PART)[:, None, None] + cols[None, None, :]
        )  # fmt: skip
        return gl.load(ptrs, mask=(offs_h < H)[None, :, None], other=0.0)

    @gluon.jit
    def _sm120_mma_k(
        kv_smem, kpe_smem, slot_smem, red_smem, full_bars, empty_bars,
        start, end, qk_scale, q_tok, h0, H, stride_qh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, KS: gl.constexpr, L3: gl.constexpr,
    ):  # fmt: skip
        """MMA warps, K-split: MMA warp k (of KS along L3's first dimension) holds q's
        k-th column slice in registers and computes that slice's share of s = q.kvT as a
        batched MMA (one accumulator per warp: BLOCK_N / 8 independent chains); the KS
        shares are summed across the warps through shared memory, so every warp has all
        of s. Each warp then runs the online softmax on all of s (no row max crosses a
        warp), and o's k-th column slice += p.V_k with p straight from registers. q is
        never re-read, p never stored: per tile, shared memory serves the tile once and
        the shares."""
        A3: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L3, k_width=2)
        B3: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=L3, k_width=2)
        S2: gl.constexpr = gl.SliceLayout(0, L3)  # [BLOCK_H, BLOCK_N], in every warp
        DQ: gl.constexpr = DV // KS
        QC: gl.constexpr = DQ // 4  # q.kT over each part in four column chunks
        q_regs = (
            _sm120_q_parts(q_tok, h0, H, stride_qh, 0 * QC, DQ, QC, BLOCK_H, KS, A3),
            _sm120_q_parts(q_tok, h0, H, stride_qh, 1 * QC, DQ, QC, BLOCK_H, KS, A3),
            _sm120_q_parts(q_tok, h0, H, stride_qh, 2 * QC, DQ, QC, BLOCK_H, KS, A3),
            _sm120_q_parts(q_tok, h0, H, stride_qh, 3 * QC, DQ, QC, BLOCK_H, KS, A3),
        )
        qpe = _sm120_q_parts(q_tok, h0, H, stride_qh, DV, DR // KS, DR // KS, BLOCK_H, KS, A3)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S2))
        l_part = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S2)
        acc = gl.zeros([KS, BLOCK_H, DQ], gl.float32, layout=L3)
        cols_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S2))
        red2 = red_smem.reshape([KS * BLOCK_H, BLOCK_N])  # share k: rows k * BLOCK_H ..
        n_tiles = gl.cdiv(end - start, BLOCK_N)
        for i in range(0, n_tiles):
            b = i % NBUF
            mbarrier.wait(full_bars.index(b), (i // NBUF) & 1)
            kv = kv_smem.index(b)  # [KS, BLOCK_N, DQ]
            s3 = gl.zeros([KS, BLOCK_H, BLOCK_N], gl.float32, layout=L3)
            for c in gl.static_range(4):
                kb = kv.slice(c * QC, QC, dim=2).permute((0, 2, 1)).load(B3)
                s3 = mma_v2(q_regs[c], kb, s3)
            s3 = mma_v2(qpe, kpe_smem.index(b).permute((0, 2, 1)).load(B3), s3)
            # Triton's cross-warp sum would take a barrier pair per piece: one store and
            # one barrier instead (the previous tile's shares were read before its last one).
            red_smem.store(s3)
            _cta_barrier()
            s = red2.slice(0, BLOCK_H).load(S2)
            for k in gl.static_range(1, KS):
                s += red2.slice(k * BLOCK_H, BLOCK_H).load(S2)
            ss = slot_smem.index(b).load(gl.SliceLayout(0, S2))
            p, alpha, m_new, l_part = _sm120_softmax_step(
                s, ss, start + i * BLOCK_N + cols_s, end, qk_scale, m_i, l_part
            )
            acc = acc * gl.expand_dims(gl.expand_dims(alpha, 1), 0)
            p3 = gl.expand_dims(p.to(kv_smem.dtype), 0)
            pa = gl.convert_layout(gl.broadcast(p3, s3)[0], A3)  # every warp: all of p
            acc = mma_v2(pa, kv.load(B3), acc)
            m_i = m_new
            _cta_barrier()  # every MMA warp is done with the stage
            mbarrier.arrive(empty_bars.index(b))
        return m_i, gl.sum(l_part, 1), acc

    @gluon.jit
    def _sm120_row_program(
        q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, p_smem, full_bars, empty_bars,
        kv_ptr, idx_row, start, end, qk_scale, v_scale, q_tok, h0, H, stride_qh,
        PAGE, stride_kvb, stride_kvs, o_tok, stride_oh, lse_tok, stride_lh, po_ptr, plse_ptr,
        row0, sp, NUM_SPLITS,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, NUM_WARPS: gl.constexpr, P_WARPS: gl.constexpr,
        P_REGS: gl.constexpr, KC: gl.constexpr, MK: gl.constexpr, HOLD_Q: gl.constexpr,
        CHAINS: gl.constexpr, DIRECT: gl.constexpr, L: gl.constexpr,
    ):  # fmt: skip
        """The row-split program's pipeline and its stores (DIRECT: o and lse; else the
        partials, rows (t, h, split))."""
        m_i, l_i, acc = gl.warp_specialize(
            [
                (
                    _sm120_mma,
                    (q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, p_smem, full_bars,
                     empty_bars, start, end, qk_scale, q_tok, h0, H,
                     stride_qh, BLOCK_H, BLOCK_N, DV, DR, NBUF, NUM_WARPS, KC, MK, HOLD_Q, CHAINS,
                     L),
                ),
                (
                    _sm120_gather,
                    (kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row,
                     start, end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR, NBUF, P_WARPS,
                     0),
                ),
            ],
            [P_WARPS],
            [P_REGS],
        )  # fmt: skip

        has = l_i > 0.0
        out = acc * (v_scale / gl.where(has, l_i, 1.0))[:, None]
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, L))
        offs_c = gl.arange(0, DV, layout=gl.SliceLayout(0, L))
        mask_h = offs_h < H
        if DIRECT:
            o_ptrs = o_tok + offs_h[:, None] * stride_oh + offs_c[None, :]
            gl.store(o_ptrs, out.to(o_tok.dtype.element_ty), mask=mask_h[:, None])
            gl.store(
                lse_tok + offs_h * stride_lh, lse2 * 0.6931471805599453,
                mask=mask_h,
            )  # fmt: skip
        else:  # workspace rows are (t, h, split); lse stays in base 2 for the merge
            row = (row0 + offs_h) * NUM_SPLITS + sp
            po = out.to(po_ptr.dtype.element_ty)
            gl.store(po_ptr + row[:, None] * DV + offs_c[None, :], po, mask=mask_h[:, None])
            gl.store(plse_ptr + row, lse2, mask=mask_h)

    @gluon.jit
    def _sm120_k_program(
        kv_smem, kpe_smem, slot_smem, red_smem, full_bars, empty_bars, kv_ptr, idx_row, start, end,
        qk_scale, v_scale, q_tok, h0, H, stride_qh, PAGE, stride_kvb, stride_kvs,
        o_tok, stride_oh, lse_tok, stride_lh, po_ptr, plse_ptr, row0, sp, NUM_SPLITS,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        NBUF: gl.constexpr, P_WARPS: gl.constexpr, P_REGS: gl.constexpr,
        DIRECT: gl.constexpr, L3: gl.constexpr,
    ):  # fmt: skip
        """The K-split program's pipeline and its stores: o's column slice k from MMA warp
        k (DIRECT: o and lse; else the partials, rows (t, h, split))."""
        KS: gl.constexpr = L3.warps_per_cta[0]
        DQ: gl.constexpr = DV // KS
        m_i, l_i, acc = gl.warp_specialize(
            [
                (
                    _sm120_mma_k,
                    (kv_smem, kpe_smem, slot_smem, red_smem, full_bars, empty_bars, start, end,
                     qk_scale, q_tok, h0, H, stride_qh, BLOCK_H, BLOCK_N, DV, DR, NBUF, KS, L3),
                ),
                (
                    _sm120_gather,
                    (kv_smem, kpe_smem, slot_smem, full_bars, empty_bars, kv_ptr, idx_row,
                     start, end, PAGE, stride_kvb, stride_kvs, BLOCK_N, DV, DR, NBUF, P_WARPS,
                     KS),
                ),
            ],
            [P_WARPS],
            [P_REGS],
        )  # fmt: skip
        has = l_i > 0.0
        inv = v_scale / gl.where(has, l_i, 1.0)
        out = acc * gl.expand_dims(gl.expand_dims(inv, 1), 0)
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        parts = gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        offs_h3 = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        offs_c = gl.arange(0, DQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        col = (parts * DQ)[:, None, None] + offs_c[None, None, :]
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gl.SliceLayout(0, L3)))
        if DIRECT:
            o_ptrs = o_tok + offs_h3[None, :, None] * stride_oh + col
            gl.store(o_ptrs, out.to(o_tok.dtype.element_ty), mask=(offs_h3 < H)[None, :, None])
            gl.store(lse_tok + offs_h * stride_lh, lse2 * 0.6931471805599453, mask=offs_h < H)
        else:  # workspace rows are (t, h, split); lse stays in base 2 for the merge
            row3 = (row0 + offs_h3) * NUM_SPLITS + sp
            po = out.to(po_ptr.dtype.element_ty)
            gl.store(
                po_ptr + row3[None, :, None] * DV + col, po, mask=(offs_h3 < H)[None, :, None]
            )  # fmt: skip
            gl.store(plse_ptr + (row0 + offs_h) * NUM_SPLITS + sp, lse2, mask=offs_h < H)

    @gluon.jit(do_not_specialize=["NUM_SPLITS", "NUM_HBLK"])
    def _sparse_mla_split_kernel_sm120(
        q_ptr, kv_ptr, idx_ptr, o_ptr, lse_ptr, po_ptr, plse_ptr, qk_scale, v_scale,
        H, TOPK, SPLIT_LEN, NUM_SPLITS, NUM_HBLK, PAGE,
        stride_qt, stride_qh, stride_kvb, stride_kvs, stride_it,
        stride_ot, stride_oh, stride_lt, stride_lh,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
        DIRECT: gl.constexpr, NBUF: gl.constexpr, NUM_WARPS: gl.constexpr,
        P_WARPS: gl.constexpr, P_REGS: gl.constexpr, KC: gl.constexpr, MK: gl.constexpr,
        HOLD_Q: gl.constexpr, CHAINS: gl.constexpr, USE_PDL: gl.constexpr, L: gl.constexpr,
        KSPLIT: gl.constexpr,
    ):  # fmt: skip
        """One (token, head block, split) program: the portable split kernel's contract
        (DIRECT: o and lse; else fp32 partials and base-2 lse for the merge kernel)."""
        if USE_PDL:  # the merge's programs may launch now; they wait for this grid
            gl.inline_asm_elementwise(
                "griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                dtype=gl.int32, is_pure=False, pack=1,
            )  # fmt: skip
        # Launched as a programmatic dependent: nothing global before the previous grid
        # is done. A no-op otherwise.
        gl.inline_asm_elementwise(
            "griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )
        pid = gl.program_id(0)
        hb = pid % NUM_HBLK
        rest = pid // NUM_HBLK
        sp = rest % NUM_SPLITS
        t = (rest // NUM_SPLITS).to(gl.int64)
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        # 16-byte vectors XOR-swizzled over 8 rows: ldmatrix (plain and transposed) and
        # the 16-byte cp.async writes meet no bank conflicts.
        sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
        if KSPLIT:  # part k of a stage: the k-th MMA warp's column slice of every row
            KS: gl.constexpr = L.warps_per_cta[0]  # _sm120_constexprs: 4 a 16-head group
            kv_smem = gl.allocate_shared_memory(
                dtype, [NBUF, KS, BLOCK_N, DV // KS], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0])
            )  # fmt: skip
            # 32-byte rows: 16-byte vectors swapped every four rows (no ldmatrix conflicts)
            kpe_smem = gl.allocate_shared_memory(
                dtype, [NBUF, KS, BLOCK_N, DR // KS], gl.SwizzledSharedLayout(8, 4, 2, [2, 1, 0])
            )  # fmt: skip
            # The MMA warps' shares of s, summed by every warp (one barrier). A quad of
            # lanes stores and loads one 32-byte piece of a row, eight rows at once:
            # XOR-swizzled in those pieces across the rows that share a 128-byte line,
            # the eight land on distinct banks (unswizzled: 8-way conflicts).
            R: gl.constexpr = 32 // BLOCK_N  # rows a 128-byte line
            red_layout: gl.constexpr = gl.SwizzledSharedLayout(8, R, BLOCK_N // 8, [2, 1, 0])
            p_smem = gl.allocate_shared_memory(gl.float32, [KS, BLOCK_H, BLOCK_N], red_layout)
        else:
            kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, DV], sl)
            kpe_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, DR], sl)
        # q and p in shared memory unless HOLD_Q or KSPLIT (then token allocations)
        QH: gl.constexpr = 1 if HOLD_Q or KSPLIT else BLOCK_H
        q_smem = gl.allocate_shared_memory(dtype, [QH, DV], sl)
        qpe_smem = gl.allocate_shared_memory(dtype, [QH, DR], sl)
        if not KSPLIT:
            p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], sl)
        slot_smem = gl.allocate_shared_memory(
            gl.int32, [NBUF, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )
        full_bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        empty_bars = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        # An fp8 cache is widened by the producers on its way into the stages.
        WIDEN: gl.constexpr = kv_ptr.dtype.element_ty != dtype
        for j in gl.static_range(NBUF):
            if WIDEN:  # one arrival after the producers' barrier
                mbarrier.init(full_bars.index(j), count=1)
            else:  # each producer thread's cp.async arrival
                mbarrier.init(full_bars.index(j), count=P_WARPS * 32)
            mbarrier.init(empty_bars.index(j), count=1)

        start = sp * SPLIT_LEN
        end = gl.minimum(start + SPLIT_LEN, TOPK)
        idx_row = idx_ptr + t * stride_it
        if KSPLIT:
            _sm120_k_program(
                kv_smem, kpe_smem, slot_smem, p_smem, full_bars, empty_bars, kv_ptr, idx_row, start,
                end, qk_scale, v_scale, q_ptr + t * stride_qt, hb * BLOCK_H, H, stride_qh,
                PAGE, stride_kvb, stride_kvs, o_ptr + t * stride_ot, stride_oh,
                lse_ptr + t * stride_lt, stride_lh, po_ptr, plse_ptr, t * H, sp, NUM_SPLITS,
                BLOCK_H, BLOCK_N, DV, DR, NBUF, P_WARPS, P_REGS, DIRECT, L,
            )  # fmt: skip
        else:
            _sm120_row_program(
                q_smem, qpe_smem, kv_smem, kpe_smem, slot_smem, p_smem, full_bars, empty_bars,
                kv_ptr, idx_row, start, end, qk_scale, v_scale, q_ptr + t * stride_qt,
                hb * BLOCK_H, H, stride_qh, PAGE, stride_kvb, stride_kvs,
                o_ptr + t * stride_ot, stride_oh, lse_ptr + t * stride_lt, stride_lh, po_ptr,
                plse_ptr, t * H, sp, NUM_SPLITS, BLOCK_H, BLOCK_N, DV, DR, NBUF, NUM_WARPS,
                P_WARPS, P_REGS, KC, MK, HOLD_Q, CHAINS, DIRECT, L,
            )  # fmt: skip

    def _sm120_constexprs(cfg: SparseMLAConfig, direct: bool, pdl: bool) -> dict[str, object]:
        """The SM120 kernel's compile-time arguments: 16-head groups of 4 warps stacked
        along the heads, each warp a quarter of s's columns and of o's (k_split: of
        q.kT's columns and of o's)."""
        groups = cfg.block_h // 16
        if cfg.k_split:  # 4 MMA warps along q.kT's columns (and o's) per 16-head group
            layout = gl.NVMMADistributedLayout(
                version=[2, 0], warps_per_cta=[4, groups, 1], instr_shape=[1, 16, 8]
            )
        else:
            layout = gl.NVMMADistributedLayout(
                version=[2, 0], warps_per_cta=[groups, cfg.num_warps // groups],
                instr_shape=[16, 8],
            )  # fmt: skip
        return {
            "BLOCK_H": cfg.block_h,
            "BLOCK_N": cfg.block_n,
            "DV": D_LATENT,
            "DR": D_ROPE,
            "DIRECT": direct,
            "NBUF": cfg.num_stages,
            "NUM_WARPS": cfg.num_warps,
            "P_WARPS": cfg.producer_warps,
            "P_REGS": cfg.producer_regs,
            "KC": QK_CHUNK,
            "MK": MMA_K,
            "HOLD_Q": cfg.hold_q,
            "CHAINS": cfg.qk_chains,
            "USE_PDL": pdl,
            "L": layout,
            "KSPLIT": cfg.k_split,
        }
