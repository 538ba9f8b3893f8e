"""Patched copies of the sparse-MLA kernel module: phase stamps, ablations, exchange forms.

Each variant rewrites the kernel's source at anchors that must occur exactly once in
the named function (else a KeyError names the anchor), and loads the result as a module
of its own, so that Triton compiles it apart from the real kernel. Most touch only the
KV-major s_by_one path: 8-32 heads from 32 tokens, the launch choice at batch 64 (two
splits merged in a 2-CTA cluster) and batch 128 (one split). Patching runs anywhere
(tests/kernels/test_kernel_variants.py); the modules run on an SM90 GPU.

  stamps    globaltimer stamps per CTA at the phase boundaries, into the workspace
  noq       ablation (wrong results): the first warpgroup does not load q
  nostore   ablation (wrong results): o is staged but not stored
  noxfer    ablation (wrong results): the cluster sender stores nothing (signal, wait stay)
  erel      ablation (wrong results): each warpgroup releases a KV buffer before its p.v
  bf16x     the cluster exchange in bf16 (8 bytes a 4-register group instead of 16)
  stats_first  split 1's first warpgroup computes lse and 1/l before sending its half
  no_pdl_wait  the split kernel launched in plain stream order (no programmatic dependency)
  pdl_trigger  every grid lets its dependents launch at its start (in the bench: the next call)
  no_merge_pdl  the merge kernel launched in stream order (the split grid does not trigger it)
  stagger   the producers issue tile 1 once tile 0 has landed (no start-up DRAM bubble)
  pull      the s_by_one cluster exchange read by the keeper from the partner (local stores)
  sentinel  the s_by_one exchange with no fence: the keeper spins until no sentinel is left
  qk2, qk2i  KV-major q.kT as two accumulator chains (qk2i: a k-step of each in turn)
  x16, x16u  the s_by_one exchange in fp16 with a power-of-two scale a 16-value pack
             (x16: o divided by l before it is sent; x16u: unscaled, at the loop end)
  nopv0, halfqk, pv1all  ablations (wrong results) of the tile loop's MMA work
  novote    ablation (random data only): the lazy max moves at tile 0 only, no vote
  noexact   ablation (wrong lse): the lazy max never moves, not even at tile 0

The t_* ablations touch the Triton split kernel (the lone token at 8-16 heads) and its merge:
  t_noq     no q loaded          t_nostore  no partial o stored
  t_nokv    no KV row gathered   t_nomerge  no merge kernel
  t_p16     (not an ablation) the partial o in bf16

Variants combine with '+', applied left to right: e.g. 'stamps+bf16x'.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "kernels"))
from kernel_loader import KERNEL_DIR, KERNEL_FILES, load_package  # noqa: E402

# The kernel's files as one text: the variants' anchors are found in whichever file holds
# them (a function anchor in the function, wherever it lives), and load() splits it again.
_MARK = "# ---- kernel file: {} ----\n"

# Stamp slots (int32 words; 32 a CTA at (2 * token + split) * 32 in the workspace).
STAMP_WORDS = 32
SLOTS = {
    "s_start": 0,  # first warpgroup, before q's load
    "s_q": 1,  # q in shared memory
    "s_tile0": 2,  # tile 0's scores done (its gather landed)
    "s_loop": 3,  # after the last tile's p.v
    "s_xchg": 4,  # keeper: the partner's half and lse arrived
    "s_end": 5,  # after the store
    "s_merged": 6,  # keeper: merged
    "s_fin": 7,  # finish entered (the second warpgroup: 1/l and lse handed over)
    "o_start": 8,
    "o_p0": 9,  # second warpgroup: tile 0's p handed over
    "o_loop": 10,
    "o_xchg": 12,
    "o_end": 13,
    "o_merged": 14,
    "o_fin": 15,
    "s_tile1": 11,  # tile 1's scores done
    "s_p0": 16,  # first warpgroup: tile 0's p handed over (p_full)
    "s_tile2": 17,  # tile 2's scores done (its gather went out when tile 0 was released)
    "s_last_top": 21,  # top of the last tile's iteration
    "s_last_scored": 20,  # the last tile's scores done
    "s_cw": 22,  # after the loop: the cluster barrier waited (the partner's mbarrier is ready)
    "s_put": 23,  # sender: its half of o stored to the partner
    "s_stats": 24,  # first warpgroup: 1/l and lse computed (after the loop)
    "s_pe": 25,  # first warpgroup: the second is past the last tile's p.v (p_empty)
    "o_pf": 26,  # second warpgroup: 1/l and lse handed over (p_full)
    "o_cw": 30,
    "o_put": 31,
    "s_sent": 27,  # first warpgroup: its sends signalled (lse and 1/l, and in split 1 o)
    "o_sent": 28,  # second warpgroup (split 0): its half signalled
}

_STAMP_FN = '''
    @gluon.jit
    def _stamp(po_ptr, t, sp, K: gl.constexpr):
        """Thread 0 of a warpgroup writes the low word of %globaltimer (ns) to slot K."""
        tid = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
        v = gl.inline_asm_elementwise(
            "mov.u32 $0, %globaltimer_lo; // $1", "=r,r", [tid], dtype=gl.int32,
            is_pure=False, pack=1,
        )
        base = po_ptr + (t * 2 + sp) * 32 + K
        gl.store(base + tid * 0, v.to(gl.float32, bitcast=True), mask=tid == 0)

'''

_BF16X_ASM = '''    _XCHG_PUT4H_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a; .reg .b32 h0, h1;\\n"
        " setp.ne.s32 p, $12, 0;\\n"
        " cvt.rn.bf16x2.f32 h0, $5, $4; cvt.rn.bf16x2.f32 h1, $7, $6;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $8;\\n" + _TO_PARTNER +
        " @p st.shared::cluster.v2.b32 [a], {h0, h1};\\n"
        " mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }"
    )
    _XCHG_GET4H_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a; .reg .b32 h0, h1;\\n"
        " setp.ne.s32 p, $8, 0;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $4;\\n"
        " mov.b32 h0, 0; mov.b32 h1, 0;\\n"
        " @p ld.shared.v2.b32 {h0, h1}, [a];\\n"
        " shl.b32 $0, h0, 16; and.b32 $1, h0, 0xffff0000;\\n"
        " shl.b32 $2, h1, 16; and.b32 $3, h1, 0xffff0000; }"
    )

'''

def _span(src: str, fn: str | None) -> tuple[int, int]:
    if fn is None:
        return 0, len(src)
    head = f"    def {fn}("
    a = src.find(head)
    if a < 0:
        raise KeyError(f"kernel function {fn} not found")
    b = src.find("    @gluon.jit", a)
    return a, (b if b > 0 else len(src))


def _sub(src: str, fn: str | None, old: str, new: str, count: int = 1) -> str:
    """Replace old (which must occur count times in function fn, or the module) by new."""
    a, b = _span(src, fn)
    n = src[a:b].count(old)
    if n != count:
        want = "" if count == 1 else f", not {count}"
        raise KeyError(
            f"anchor in {fn or 'the module'} found {n} times{want}: {old.strip()[:70]!r}"
        )
    return src[:a] + src[a:b].replace(old, new) + src[b:]


def _before_fn(src: str, fn: str, text: str) -> str:
    head = f"    @gluon.jit\n    def {fn}("
    return _sub(src, None, head, text + head)


# Slots written in _sm90_kv1_finish, which both warpgroups run: s_* + 8 * HALF.
_PER_HALF = ("s_xchg", "s_end", "s_merged", "s_fin")


def _stamp(slot: str, indent: int, cond: str = "") -> str:
    pad = " " * indent
    call = f"_stamp(po_ptr, t, sp, {SLOTS[slot]})"
    if slot in _PER_HALF:  # per warpgroup HALF in finish
        call = f"_stamp(po_ptr, t, sp, {SLOTS[slot]} + 8 * HALF)"
    return f"{pad}if {cond}:\n{pad}    {call}\n" if cond else f"{pad}{call}\n"


_S, _O, _F = "_sm90_kv1_s_wg", "_sm90_kv1_o_wg", "_sm90_kv1_finish"
_LAST = "i == n_tiles - 1"
# Where the stamps go: (function, anchor, slot, indent, before the anchor, condition).
# The anchor's own indent is the stamp's unless the stamp goes one level deeper. After the
# loop (cluster_merge) split 1's first warpgroup sends its half at once and the first
# warpgroup of both splits sends lse and 1/l; the keeper's stamps are in _sm90_kv1_finish
# (s_* + 8 * HALF: the o_* slots for the second warpgroup), written after these where both
# run.
_STAMP_POINTS: tuple[tuple[str, str, str, int, bool, str], ...] = (
    (_S, "        _sm90_load_q(q_smem, qpe_smem, q_tok, hb * BLOCK_H", "s_start", 8, True, ""),
    (_S, "        _cta_barrier()  # every warp's part of q is stored", "s_q", 8, True, ""),
    (_S, "            buf = i % NBUF\n", "s_last_top", 12, False, _LAST),
    (_S, "s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,\n            )  # fmt: skip\n",
     "s_last_scored", 12, False, _LAST),
    (_S, "s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,\n            )  # fmt: skip\n",
     "s_tile0", 12, False, "i == 0"),
    (_S, "s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,\n            )  # fmt: skip\n",
     "s_tile1", 12, False, "i == 1"),
    (_S, "s_zero, rows_s, BLOCK_N, NBUF, S_LAYOUT,\n            )  # fmt: skip\n",
     "s_tile2", 12, False, "i == 2"),
    (_S, "            mbarrier.arrive(p_full)  # all of p and alpha is stored\n", "s_p0", 12,
     False, "i == 0"),
    (_S, "        if CLUSTER2:  # the partner's barrier is ready; in split 1 this half goes",
     "s_loop", 8, True, ""),
    (_S, "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)\n", "s_cw", 12, False, ""),
    (_S, "                _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)\n", "s_put", 16, False,
     ""),
    (_S, "        lse2 = gl.convert_layout(lse2, gl.SliceLayout(0, O_LAYOUT))\n", "s_stats", 8,
     False, ""),
    (_S, " " * 12 + "mbarrier.wait(p_empty, (n_tiles & 1) ^ 1)  # the last tile's alpha has been"
     " read\n", "s_pe", 12, False, ""),
    (_S, "                _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)\n", "s_sent", 12, False, ""),
    (_O, "        n_tiles = gl.cdiv(end - start, BLOCK_N)\n", "o_start", 8, False, ""),
    (_O, "            mbarrier.wait(p_full, i & 1)\n", "o_p0", 12, False, "i == 0"),
    (_O, "        if CLUSTER2 and sp == 0:  # split 0 keeps the first half", "o_loop", 8, True,
     ""),
    (_O, "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)  # the partner's barrier is ready\n",
     "o_cw", 12, False, ""),
    (_O, "            _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)\n", "o_put", 12, False, ""),
    (_O, "            _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)\n", "o_sent", 12, False, ""),
    (_O, "            mbarrier.wait(p_full, n_tiles & 1)\n", "o_pf", 12, False, ""),
    (_F, "        c0: gl.constexpr = HALF * (DV // 2)\n", "s_fin", 8, False, ""),
    (_F, "            _sm90_per_thread(_XCHG_WAIT_ASM, 4)\n", "s_xchg", 12, False, ""),
    (_F, "o, lse_tot = _sm90_merge2(out, o_other * inv_other[None, :], lse2, lse_other)\n",
     "s_merged", 12, False, ""),
)  # fmt: skip


def stamps(src: str) -> str:
    src = _before_fn(src, _S, _STAMP_FN)
    for fn, anchor, slot, indent, before, cond in _STAMP_POINTS:
        stamp = _stamp(slot, indent, cond)
        src = _sub(src, fn, anchor, stamp + anchor if before else anchor + stamp)
    a, b = _span(src, _F)  # s_end: the finish's last statement
    src = src[:a] + src[a:b].rstrip("\n") + "\n" + _stamp("s_end", 8) + "\n" + src[b:]
    # Stamps go to the workspace, which the direct and cluster paths leave unused.
    return _sub(
        src, None, "po = plse = lse  # unused placeholders",
        "po = plse = workspace if workspace is not None else lse",
    )  # fmt: skip


def noq(src: str) -> str:
    line = (
        "        _sm90_load_q(q_smem, qpe_smem, q_tok, hb * BLOCK_H, H, stride_qh, BLOCK_H, DV,"
        " DR, 4)\n"
    )
    return _sub(src, "_sm90_kv1_s_wg", line, "")


def nostore(src: str) -> str:
    mask = "mask=(offs_h < H)[:, None])"
    return _sub(src, "_sm90_kv1_store_o", mask, "mask=(offs_h < 0)[:, None])")


def noxfer(src: str) -> str:
    f = "_sm90_kv1_send_half"
    return _sub(src, f, "[acc, off, gl.full_like(off, 1)]", "[acc, off, gl.full_like(off, 0)]")


def erel(src: str) -> str:
    f = "_sm90_kv1_o_wg"
    rel = "            mbarrier.arrive(empty_bars.index(buf))\n"
    done = "            mbarrier.arrive(p_empty)\n"
    src = _sub(src, f, done + rel, done)
    p0 = "            mbarrier.wait(p_full, i & 1)\n"
    src = _sub(src, f, p0, p0 + rel)
    f = "_sm90_kv1_s_wg"
    pv = "            acc = gl_wgmma_wait(0, deps=[o_tok])\n"
    src = _sub(src, f, pv + rel, pv)
    soft = "            m_i, m_use, l_part, acc = _sm90_kv_lazy_tile("
    return _sub(src, f, soft, rel + soft)


def bf16x(src: str) -> str:
    src = _before_fn(src, "_sm90_per_thread", _BF16X_ASM)
    f = "_sm90_kv1_xchg_offsets"
    src = _sub(src, f, "+ heads // 8) * 32 + lane) * 16", "+ heads // 8) * 32 + lane) * 8")
    src = _sub(src, "_sm90_kv1_send_half", "_XCHG_PUT4_ASM, ", "_XCHG_PUT4H_ASM, ")
    get = '_XCHG_GET4_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r", [off, gl.full_like(off, 1)],\n'
    get += " " * 16 + "dtype=gl.float32, is_pure=False, pack=4,\n" + " " * 12 + ")  # fmt: skip"
    new = '_XCHG_GET4H_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [off, gl.full_like(off, 1)],\n'
    new += " " * 16 + "dtype=gl.int32, is_pure=False, pack=4,\n"
    new += " " * 12 + ").to(gl.float32, bitcast=True)  # fmt: skip"
    return _sub(src, "_sm90_kv1_finish", get, new)


def stats_first(src: str) -> str:
    """cluster_merge, split 1's first warpgroup: lse and 1/l computed before its half of o
    goes out (the remote stores then do not contend with the reduction's shuffles and
    shared memory), then the half, then lse and 1/l."""
    f = "_sm90_kv1_s_wg"
    half = (
        "            if sp == 1:  # unscaled: the partner scales it by the 1/l sent below\n"
        "                _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)\n"
    )
    src = _sub(src, f, half, "")
    stats = "            _sm90_kv1_send_stats(lse2, inv, BLOCK_H, O_LAYOUT)\n"
    return _sub(src, f, stats, half.replace("below", "here") + stats)


def nopv0(src: str) -> str:
    """Ablation: the first warpgroup skips its half of p . v in the tile loop (the chain
    of sT, softmax and p without the first warpgroup's o MMAs)."""
    f = "_sm90_kv1_s_wg"
    mma = "            o_tok = gl_wgmma(kv_t, p_smem, acc, is_async=True)\n"
    src = _sub(src, f, mma, "")
    return _sub(src, f, "            acc = gl_wgmma_wait(0, deps=[o_tok])\n", "")


def pv1all(src: str) -> str:
    """Ablation: the second warpgroup computes both halves of p . v (the first half into a
    second accumulator it then drops) and the first warpgroup none (nopv0): the tile loop
    with all of p . v off the first warpgroup's chain, no fourth warpgroup."""
    src = nopv0(src)
    f = "_sm90_kv1_o_wg"
    old = "        acc = gl.zeros([DV // 2, BLOCK_H], gl.float32, layout=O_LAYOUT)\n"
    src = _sub(src, f, old, old + old.replace("acc =", "acc0 ="))
    old = "            acc = acc * alpha[None, :]\n"
    src = _sub(src, f, old, old + "            acc0 = acc0 * alpha[None, :]\n")
    old = "            acc = gl_wgmma_wait(0, deps=[o_tok])\n"
    new = (
        "            kv_0 = kv_smem.index(buf).slice(0, DV // 2, 1).permute((1, 0))\n"
        "            o_tok0 = gl_wgmma(kv_0, p_smem, acc0, is_async=True)\n"
        "            acc, acc0 = gl_wgmma_wait(0, deps=[o_tok, o_tok0])\n"
    )
    return _sub(src, f, old, new)


def halfqk(src: str) -> str:
    """Ablation: q . kT over half the latent columns (20 of 36 k-steps a tile)."""
    f = "_sm90_kv_scores"
    old = "            kv_smem.index(buf), q_smem.permute((1, 0)), s_zero,"
    new = (
        "            kv_smem.index(buf).slice(0, 256, 1), q_smem.slice(0, 256, 1).permute((1, 0)),"
        " s_zero,"
    )
    return _sub(src, f, old, new)


def novote(src: str) -> str:
    """Ablation (valid only where no score rises LAZY_MAX_SLACK above the first tile's
    max, as in the bench's random data): the lazy max moves at tile 0 only (its exact
    max), without the vote (a bar.red a tile). What the vote costs the tile chain.
    Before the lazy max (commit 9a797aa) the fixmax and noalpha ablations fixed the max
    at 8 and dropped the rescale: 32x64 -1.19 / -1.35 us."""
    old = "        if _sm90_vote_above(s2, m_i + _LAZY_SLACK, p, BLOCK_N, BLOCK_H, i) != 0:\n"
    return _sub(src, "_sm90_kv_lazy_tile", old, "        if False:\n")


def noexact(src: str) -> str:
    """Ablation (wrong lse, so wrong results): the lazy max never moves, not even at the
    first tile (p = exp2(s), which the bench's random scores keep finite). What the
    first tile's exact max costs (before variant 72 also a second p and store there)."""
    old = "        if _sm90_vote_above(s2, m_i + _LAZY_SLACK, p, BLOCK_N, BLOCK_H, i) != 0:\n"
    new = old.replace("if ", "").replace(" != 0:", "") + "        if False:\n"
    src = _sub(src, "_sm90_kv_lazy_tile", old, new)
    old = "        if i == 0:  # the tile every CTA starts on: one p, one store\n"
    return _sub(src, "_sm90_kv_lazy_tile", old, "        if False:\n")


# The lone-token Triton build (h16_n16 at batch 1, 8-16 heads): what each part costs.
def t_noq(src: str) -> str:
    """Ablation: the Triton split kernel loads no q (its MMAs run on zeros)."""
    for part in ("offs_c[None, :]", "DV + offs_r[None, :]"):
        old = f"    q_c = tl.load(q_rows + {part}, mask=mask_h[:, None], other=0.0)\n"
        if part != "offs_c[None, :]":
            old = old.replace("q_c =", "q_pe =")
        src = _sub(src, None, old, old.replace("mask_h[:, None]", "(offs_h < 0)[:, None]"))
    return src


def t_nostore(src: str) -> str:
    """Ablation: the Triton split kernel stores no partial o (the lse still goes)."""
    old = "tl.store(po_ptr + row[:, None] * DV + offs_c[None, :], po, mask=mask_h[:, None])"
    return _sub(src, None, old, old.replace("mask_h[:, None]", "(offs_h < 0)[:, None]"))


def t_nokv(src: str) -> str:
    """Ablation: the Triton split kernel reads its slots but gathers no KV row."""
    old = "kv = tl.load(rows[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)"
    src = _sub(src, None, old, old.replace("valid[:, None]", "(slot < 0)[:, None]"))
    old = "kpe = tl.load(rows[:, None] + DV + offs_r[None, :], mask=valid[:, None], other=0.0)"
    return _sub(src, None, old, old.replace("valid[:, None]", "(slot < 0)[:, None]"))


def t_nomerge(src: str) -> str:
    """Ablation: split-K partials are left unmerged (no merge kernel launched)."""
    old = "    if not direct and not cluster:\n        block_s, block_d, merge_warps = "
    return _sub(src, None, old, old.replace("not direct and not cluster", "False"))


def t_p16(src: str) -> str:
    """The Triton build's split-K partial o in bf16 (half the bytes written and merged)."""
    old = "        po = workspace[:n_po]\n"
    new = (
        "        po = workspace[:n_po]\n"
        "        if not cfg.gluon:\n"
        "            po = workspace[: n_po // 2].view(torch.bfloat16)\n"
    )
    return _sub(src, None, old, new)


VARIANTS: dict[str, Callable[[str], str]] = {
    "stamps": stamps, "noq": noq, "nostore": nostore, "noxfer": noxfer, "erel": erel,
    "bf16x": bf16x, "stats_first": stats_first,
    "t_noq": t_noq, "t_nostore": t_nostore, "t_nokv": t_nokv, "t_nomerge": t_nomerge,
    "t_p16": t_p16, "nopv0": nopv0, "halfqk": halfqk, "pv1all": pv1all,
    "novote": novote, "noexact": noexact,
}  # fmt: skip
WRONG_RESULTS = {
    "noq", "nostore", "noxfer", "erel", "nopv0", "halfqk", "pv1all", "novote", "noexact",
    "t_noq", "t_nostore", "t_nokv", "t_nomerge",
}  # fmt: skip


def bundle(directory: Path = KERNEL_DIR) -> str:
    """The kernel's files as one text, each after its marker, the Gluon family last."""
    return "".join(_MARK.format(f) + (directory / f).read_text() for f in KERNEL_FILES)


def files(text: str) -> dict[str, str]:
    """A bundle's files by name (each one parses on its own)."""
    out: dict[str, str] = {}
    for f in reversed(KERNEL_FILES):
        text, sep, body = text.rpartition(_MARK.format(f))
        if not sep:
            raise KeyError(f"kernel file {f} is missing from the bundle")
        out[f] = body
    return dict(reversed(out.items()))


def source(name: str) -> str:
    """The kernel source (a bundle) with variant(s) name ('base', or names joined by '+')."""
    src = bundle()
    for part in name.split("+"):
        if part == "base":
            continue
        if part not in VARIANTS:
            raise KeyError(f"unknown kernel variant {part!r}; known: base, {', '.join(VARIANTS)}")
        src = VARIANTS[part](src)
    return src


_DIR = Path(tempfile.gettempdir()) / "sparse_mla_variants"


def load_file(path: Path) -> ModuleType:
    """Import another copy of the kernel: a directory holding its files (e.g. an earlier
    revision's, `git archive REV patches/vllm/files/vllm/v1/attention/ops`), or the one
    file of a revision from before the split (`git show REV:...triton_sparse_mla.py`)."""
    tag = "file_" + "".join(c if c.isalnum() else "_" for c in path.name)
    if path.is_dir():
        return load(tag, bundle(path))
    if not path.is_file():
        raise FileNotFoundError(f"kernel file {path} does not exist")
    modname = "sparse_mla_" + tag
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod  # dataclasses look the module up while building
    spec.loader.exec_module(mod)
    return mod


def load(name: str, text: str | None = None) -> ModuleType:
    """Import the patched source (or the bundle `text`) as a package of its own, its files
    written out (Triton and Gluon read a kernel's source back from its file)."""
    package = "sparse_mla_" + name.replace("+", "_")
    directory = _DIR / package
    directory.mkdir(parents=True, exist_ok=True)
    for f, body in files(source(name) if text is None else text).items():
        (directory / f).write_text(body)
    return load_package(package, directory)



def no_pdl_wait(src: str) -> str:
    """The split kernel launched in plain stream order, as before PDL_WAIT."""
    pdl = "    pdl = not direct and not cluster and pdl_wait\n"
    src = _sub(src, None, pdl, pdl + "    pdl_wait = False\n")  # the merge's own PDL stays
    wait = (
        "        gl.inline_asm_elementwise(\n"
        '            "griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,'
        " pack=1\n        )\n"
    )
    return _sub(src, "_sparse_mla_split_kernel_sm90", wait, "")


def pdl_trigger(src: str) -> str:
    """Every split and merge grid lets its dependents launch at its start. In the bench a
    call's dependent is the next call, so this times the overlap of back-to-back calls;
    in a model it helps only a following kernel that is itself launched with PDL."""
    old = "    if USE_PDL:  # let the merge kernel's programs launch now; they wait for this grid\n"
    src = _sub(src, None, old, "    if True:\n")
    old = "    if USE_PDL:  # launched early (programmatic dependent launch): wait for the splits\n"
    wait = old + "        gdc_wait()\n"
    src = _sub(src, None, wait, wait + "    gdc_launch_dependents()\n")
    old = "        if USE_PDL:  # as gdc_launch_dependents: the merge's programs may launch now\n"
    return _sub(src, "_sparse_mla_split_kernel_sm90", old, "        if True:\n")


VARIANTS["no_pdl_wait"] = no_pdl_wait
VARIANTS["pdl_trigger"] = pdl_trigger


def no_merge_pdl(src: str) -> str:
    """The split kernel still a programmatic dependent, but its merge kernel launched
    in stream order (the split grid does not let it launch early)."""
    pdl = "    pdl = not direct and not cluster and pdl_wait\n"
    return _sub(src, None, pdl, "    pdl = False\n")


VARIANTS["no_merge_pdl"] = no_merge_pdl


def stagger(src: str) -> str:
    """The producer warps issue tile 1's gather only once tile 0 has landed (they wait on
    its full barrier too), so that a CTA's first gather comes back in about half the time
    and its first tile is processed while tile 1 is in flight. Today every CTA asks for
    two tiles at once, both land together (~5 us, all the DRAM traffic of the start), and
    no new gather goes out until tile 0 is processed and released: the DRAM then waits
    for the CTAs. Not an ablation: results stand."""
    old = "            b = i % NBUF\n            mbarrier.wait(empty_bars.index(b),"
    new = (
        "            b = i % NBUF\n"
        "            mbarrier.wait(full_bars.index(0), 0, pred=i == 1)\n"
        "            mbarrier.wait(empty_bars.index(b),"
    )
    return _sub(src, "_sm90_ws_gather", old, new)


VARIANTS["stagger"] = stagger



_PULL_ASM = '''    # pull: each CTA leaves its outgoing half of o, lse and 1/l in its own buffer
    # (local stores); the partner's keeper reads them there (ld.shared::cluster) once signalled,
    # then arrives on this CTA's second barrier (bytes 8-15), which this CTA's keeper
    # waits on before it exits, so that the buffer outlives the partner's reads.
    _XCHG_PUT4L_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a;\\n"
        " setp.ne.s32 p, $12, 0;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $8;\\n"
        " @p st.shared.v4.f32 [a], {$4, $5, $6, $7};\\n"
        " mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }"
    )
    _XCHG_PUTL_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .u32 a;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $2;\\n"
        " st.shared.f32 [a], $1;\\n"
        " mov.u32 $0, 0; }"
    )
    _XCHG_GET4R_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred p; .reg .u32 a;\\n"
        " setp.ne.s32 p, $8, 0;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $4;\\n" + _TO_PARTNER +
        " mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;\\n"
        " @p ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [a]; }"
    )
    _XCHG_GETR_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .u32 a;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $1;\\n" + _TO_PARTNER +
        " ld.shared::cluster.f32 $0, [a]; }"
    )
    _XCHG_DONE_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .u32 a;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, 8;\\n" + _TO_PARTNER +
        " mbarrier.arrive.release.cta.shared::cluster.b64 _, [a];\\n"
        " mov.u32 $0, 0; }"
    )
    _XCHG_DONE_WAIT_ASM: gl.constexpr = gl.constexpr(
        "{ .reg .pred done; .reg .u32 a;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, 8;\\n"
        " doneWait:\\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [a], 0;\\n"
        " @!done bra doneWait;\\n"
        " mov.u32 $0, 0; }"
    )

'''


def pull(src: str) -> str:
    """The s_by_one cluster exchange pulled instead of pushed: a sender stores its half of
    o (and lse, 1/l) into its own buffer and signals (the release fence then waits for
    local stores only, not for 32 KiB of remote ones); the keeper reads the partner's
    buffer with ld.shared::cluster, then tells the partner it may exit. Not an ablation:
    results stand."""
    old = "    @gluon.jit\n    def _sm90_per_thread("
    src = _sub(src, None, old, _PULL_ASM + old)
    old = '            f" @p mbarrier.init.shared::cta.b64 [a], {senders};\\n"\n'
    new = old + '            " @p mbarrier.init.shared::cta.b64 [a+8], 128;\\n"\n'
    src = _sub(src, None, old, new)
    src = _sub(src, "_sm90_kv1_send_half", "_XCHG_PUT4_ASM,", "_XCHG_PUT4L_ASM,")
    src = _sub(src, "_sm90_kv1_send_stats", "_XCHG_PUT_ASM,", "_XCHG_PUTL_ASM,", 2)
    src = _sub(src, "_sm90_kv1_finish", "_XCHG_GET4_ASM,", "_XCHG_GET4R_ASM,")
    src = _sub(src, "_sm90_kv1_finish", "_XCHG_GET_ASM,", "_XCHG_GETR_ASM,", 2)
    old = (
        "                    lse_ptr + t * stride_lt + offs_h * stride_lh,"
        " lse_tot * 0.6931471805599453,\n"
        "                    mask=offs_h < H,\n"
        "                )  # fmt: skip\n"
    )
    new = (
        old + "            _sm90_per_thread(_XCHG_DONE_ASM, 4)  # this CTA has read the partner's\n"
        "            _sm90_per_thread(_XCHG_DONE_WAIT_ASM, 4)  # the partner has read this one's\n"
    )
    return _sub(src, "_sm90_kv1_finish", old, new)


VARIANTS["pull"] = pull


# An fp32 pattern no arithmetic yields (a signalling NaN; NaN results are 0x7fffffff).
_SENTINEL = "0x7FBADBAD"
_SENTINEL_ASM = f'''    # sentinel: the keeper spins on its own buffer until no word it reads holds
    # the sentinel that the MMA threads wrote over the buffer at init (before their
    # cluster arrive, whose release orders the fill before the partner's remote stores).
    _XCHG_GET4S_ASM: gl.constexpr = gl.constexpr(
        "{{ .reg .pred p, w; .reg .u32 a; .reg .b32 x;\\n"
        " setp.ne.s32 p, $8, 0;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $4;\\n"
        " mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;\\n"
        " @!p bra getDone;\\n"
        " getSpin:\\n"
        " ld.volatile.shared.v4.f32 {{$0, $1, $2, $3}}, [a];\\n"
        " mov.b32 x, $0; setp.eq.b32 w, x, {_SENTINEL};\\n"
        " mov.b32 x, $1; setp.eq.or.b32 w, x, {_SENTINEL}, w;\\n"
        " mov.b32 x, $2; setp.eq.or.b32 w, x, {_SENTINEL}, w;\\n"
        " mov.b32 x, $3; setp.eq.or.b32 w, x, {_SENTINEL}, w;\\n"
        " @w bra getSpin;\\n"
        " getDone: }}"
    )
    _XCHG_GETS_ASM: gl.constexpr = gl.constexpr(
        "{{ .reg .pred w; .reg .u32 a; .reg .b32 x;\\n"
        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $1;\\n"
        " getSpin1:\\n"
        " ld.volatile.shared.f32 $0, [a];\\n"
        " mov.b32 x, $0; setp.eq.b32 w, x, {_SENTINEL};\\n"
        " @w bra getSpin1; }}"
    )

'''


def sentinel(src: str) -> str:
    """The s_by_one cluster exchange without the release fence and barrier: at init every
    MMA thread fills the exchange buffer with a sentinel word no result can equal; the
    senders' remote stores are not followed by a fence (MEMBAR.ALL.GPU, ~0.5 us) and an
    arrive; the keeper spins on each slot it reads until it holds no sentinel. Not an
    ablation: results stand."""
    old = "    @gluon.jit\n    def _sm90_per_thread("
    src = _sub(src, None, old, _SENTINEL_ASM + old)
    old = '            " @p fence.mbarrier_init.release.cluster;\\n"\n'
    new = old + (
        f'            " {{ .reg .u32 f, e, s; mov.u32 s, {_SENTINEL};\\n"\n'
        '            " mad.lo.u32 f, $1, 16, a; add.u32 f, f, 16;\\n"\n'
        '            f" add.u32 e, a, {_XCHG_BYTES};\\n"\n'
        '            " xchgFill: setp.lt.u32 p, f, e; @!p bra xchgFilled;\\n"\n'
        # 2048: 128 threads cover the buffer; where more run, slots are filled twice
        '            " st.shared.v4.b32 [f], {s, s, s, s}; add.u32 f, f, 2048;\\n"\n'
        '            " bra xchgFill;\\n"\n'
        '            " xchgFilled: }\\n"\n'
    )
    src = _sub(src, None, old, new)
    src = _sub(src, "_sm90_kv1_finish", "_XCHG_GET4_ASM,", "_XCHG_GET4S_ASM,")
    src = _sub(src, "_sm90_kv1_finish", "_XCHG_GET_ASM,", "_XCHG_GETS_ASM,", 2)
    wait = "            _sm90_per_thread(_XCHG_WAIT_ASM, 4)\n"
    src = _sub(src, "_sm90_kv1_finish", wait, "")
    for fn in ("_sm90_kv1_s_wg", "_sm90_kv1_o_wg"):
        for sig in ("_XCHG_SIGNAL_ASM", "_XCHG_SIGNAL2_ASM"):
            a, b = _span(src, fn)
            body = src[a:b].replace(f"_sm90_per_thread({sig}, 4)", "pass")
            src = src[:a] + body + src[b:]
    return src


VARIANTS["sentinel"] = sentinel


def _qk_two_chains(interleave: bool) -> Callable[[str], str]:
    def patch(src: str) -> str:
        old = (
            "        s_tok = gl_wgmma(\n"
            "            kv_smem.index(buf), q_smem.permute((1, 0)), s_zero, use_acc=False,"
            " is_async=True\n"
            "        )\n"
            "        s_tok = gl_wgmma(kpe_smem.index(buf), qpe_smem.permute((1, 0)), s_tok,"
            " is_async=True)\n"
        )
        kv = "kv_smem.index(buf)"
        if interleave:  # one k-step of each chain in turn
            new = (
                "        s_a = s_zero\n        s_b = s_zero\n"
                "        for k in gl.static_range(16):\n"
                f"            s_a = gl_wgmma({kv}.slice(16 * k, 16, 1),"
                " q_smem.slice(16 * k, 16, 1).permute((1, 0)), s_a, use_acc=k > 0,"
                " is_async=True)\n"
                f"            s_b = gl_wgmma({kv}.slice(256 + 16 * k, 16, 1),"
                " q_smem.slice(256 + 16 * k, 16, 1).permute((1, 0)), s_b, use_acc=k > 0,"
                " is_async=True)\n"
            )
        else:
            new = (
                f"        s_a = gl_wgmma({kv}.slice(0, 256, 1),"
                " q_smem.slice(0, 256, 1).permute((1, 0)), s_zero, use_acc=False,"
                " is_async=True)\n"
                f"        s_b = gl_wgmma({kv}.slice(256, 256, 1),"
                " q_smem.slice(256, 256, 1).permute((1, 0)), s_zero, use_acc=False,"
                " is_async=True)\n"
            )
        new += (
            "        s_b = gl_wgmma(kpe_smem.index(buf), qpe_smem.permute((1, 0)), s_b,"
            " is_async=True)\n"
        )
        src = _sub(src, "_sm90_kv_scores", old, new)
        old = "        s = gl_wgmma_wait(0, deps=[s_tok])\n"
        new = "        s_a, s_b = gl_wgmma_wait(0, deps=[s_a, s_b])\n        s = s_a + s_b\n"
        return _sub(src, "_sm90_kv_scores", old, new)

    return patch


VARIANTS["qk2"] = _qk_two_chains(False)
VARIANTS["qk2i"] = _qk_two_chains(True)


def _x16_put_asm() -> str:
    m = "".join(f" abs.f32 x, ${k}; max.f32 m, m, x;\\n" for k in range(17, 32))
    cv = "".join(
        f" mul.f32 y0, ${16 + 2 * i}, x; mul.f32 y1, ${17 + 2 * i}, x;"
        f" cvt.rn.f16x2.f32 h{i}, y1, y0;\\n"
        for i in range(8)
    )
    outs = " ".join(f"mov.u32 ${k}, 0;" for k in range(16))
    return (
        '"{ .reg .f32 m, x, y0, y1; .reg .b32 e, s, b, h0, h1, h2, h3, h4, h5, h6, h7;'
        ' .reg .u32 a;\\n"\n'
        f'        " abs.f32 m, $16;\\n{m}"\n'
        '        " mov.b32 e, m; shr.u32 e, e, 23; mov.u32 s, 268; sub.u32 s, s, e;'
        ' min.u32 s, s, 253;\\n"\n'
        '        " shl.b32 b, s, 23; mov.b32 x, b;\\n"\n'
        f'        "{cv}"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $32;\\n" + _TO_PARTNER +\n'
        '        " st.shared::cluster.v4.b32 [a], {h0, h1, h2, h3};\\n"\n'
        '        " st.shared::cluster.v4.b32 [a+2048], {h4, h5, h6, h7};\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $48;\\n" + _TO_PARTNER +\n'
        '        " st.shared::cluster.b32 [a], s;\\n"\n'
        f'        " {outs} }}"'
    )


def _x16_get_asm() -> str:
    cv = "".join(
        f" mov.b32 {{lo, hi}}, h{i}; cvt.f32.f16 ${2 * i}, lo; cvt.f32.f16 ${2 * i + 1}, hi;"
        f" mul.f32 ${2 * i}, ${2 * i}, x; mul.f32 ${2 * i + 1}, ${2 * i + 1}, x;\\n"
        for i in range(8)
    )
    return (
        '"{ .reg .u32 a, s, b; .reg .b32 h0, h1, h2, h3, h4, h5, h6, h7; .reg .f32 x;'
        ' .reg .b16 lo, hi;\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $16;\\n"\n'
        '        " ld.shared.v4.b32 {h0, h1, h2, h3}, [a];\\n"\n'
        '        " ld.shared.v4.b32 {h4, h5, h6, h7}, [a+2048];\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $32;\\n"\n'
        '        " ld.shared.b32 s, [a];\\n"\n'
        '        " mov.u32 b, 254; sub.u32 b, b, s; shl.b32 b, b, 23; mov.b32 x, b;\\n"\n'
        f'        "{cv} }}"'
    )


_X16_CODE = f'''    # x16: the exchanged half of o normalised (divided by l), in fp16, 16 values
    # (two 16-byte chunks, 2048 bytes apart) a scale: each pack's largest magnitude is scaled
    # into [2^14, 2^15) by a power of two whose biased exponent goes beside it.
    _X16_EXP: gl.constexpr = gl.constexpr(_XCHG_DATA_BYTES + 16384)
    _X16_PUT_ASM: gl.constexpr = gl.constexpr(
        {_x16_put_asm()}
    )
    _X16_PUT_CONS: gl.constexpr = gl.constexpr(",".join(["=r"] * 16 + ["f"] * 16 + ["r"] * 32))
    _X16_GET_ASM: gl.constexpr = gl.constexpr(
        {_x16_get_asm()}
    )
    _X16_GET_CONS: gl.constexpr = gl.constexpr(",".join(["=f"] * 16 + ["r"] * 32))

    @gluon.jit
    def _sm90_kv1_x16_offsets(BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr):
        """x16: per element, its pack's chunk offset and scale offset in the buffer (the
        pack of 16 consecutive registers: m-block major, then 8-head blocks)."""
        rows = gl.arange(0, DV // 2, layout=gl.SliceLayout(1, O_LAYOUT))[:, None]
        heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, O_LAYOUT))[None, :]
        t = ((rows % 64) // 16) * 32 + (rows % 8) * 4 + (heads % 8) // 2
        j = ((rows // 64) * (BLOCK_H // 8) * 4) // 16
        return _XCHG_DATA + ((2 * j) * 128 + t) * 16, _X16_EXP + (j * 128 + t) * 4

    @gluon.jit
    def _sm90_kv1_send_half16(
        o, BLOCK_H: gl.constexpr, DV: gl.constexpr, O_LAYOUT: gl.constexpr
    ):  # fmt: skip
        off, eoff = _sm90_kv1_x16_offsets(BLOCK_H, DV, O_LAYOUT)
        gl.inline_asm_elementwise(
            _X16_PUT_ASM, _X16_PUT_CONS, [o, off, eoff], dtype=gl.int32, is_pure=False, pack=16
        )

'''


def x16(src: str) -> str:
    """The s_by_one cluster exchange sends the half of o already divided by l, in fp16
    with a power-of-two scale a 16-value pack (half the bytes of fp32, ~11 bits kept
    against the pack's largest value, no range limit). Split 1's first warpgroup
    computes lse and 1/l before sending; split 0's second waits for 1/l from its first.
    Not an ablation: results stand (within fp16's precision)."""
    src = _keeper16(src, _X16_CODE)
    f = "_sm90_kv1_s_wg"
    old = (
        "        if CLUSTER2:  # the partner's barrier is ready;"
        " in split 1 this half goes at once\n"
        "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)\n"
        "            if sp == 1:  # unscaled: the partner scales it by the 1/l sent below\n"
        "                _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)\n"
    )
    src = _sub(src, f, old, "")
    old = (
        "        if CLUSTER2:\n"
        "            _sm90_kv1_send_stats(lse2, inv, BLOCK_H, O_LAYOUT)\n"
        "        if not CLUSTER2 or sp == 1:"
        "  # the second warpgroup keeps its half: hand 1/l over\n"
    )
    new = (
        "        if CLUSTER2:\n"
        "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)\n"
        "            if sp == 1:\n"
        "                _sm90_kv1_send_half16(acc * inv[None, :], BLOCK_H, DV, O_LAYOUT)\n"
        "            _sm90_kv1_send_stats(lse2, inv, BLOCK_H, O_LAYOUT)\n"
        "        if True:  # both splits' second warpgroups need 1/l\n"
    )
    src = _sub(src, f, old, new)
    f = "_sm90_kv1_o_wg"
    old = (
        "        if CLUSTER2 and sp == 0:"
        "  # split 0 keeps the first half: send this one, unscaled\n"
        "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)  # the partner's barrier is ready\n"
        "            _sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)\n"
        "            _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)\n"
        "        else:\n"
        "            mbarrier.wait(p_full, n_tiles & 1)\n"
        "            inv = alpha_smem.load(gl.SliceLayout(0, O_LAYOUT))\n"
        "            lse2 = lse_smem.load(gl.SliceLayout(0, O_LAYOUT))\n"
    )
    new = (
        "        mbarrier.wait(p_full, n_tiles & 1)\n"
        "        inv = alpha_smem.load(gl.SliceLayout(0, O_LAYOUT))\n"
        "        lse2 = lse_smem.load(gl.SliceLayout(0, O_LAYOUT))\n"
        "        if CLUSTER2 and sp == 0:\n"
        "            _sm90_per_thread(_CLUSTER_WAIT_ASM, 4)  # the partner's barrier is ready\n"
        "            _sm90_kv1_send_half16(acc * inv[None, :], BLOCK_H, DV, O_LAYOUT)\n"
        "            _sm90_per_thread(_XCHG_SIGNAL_ASM, 4)\n"
        "        else:\n"
    )
    src = _sub(src, f, old, new)
    old = "_sm90_merge2(out, o_other * inv_other[None, :], lse2, lse_other)"
    new = "_sm90_merge2(out, o_other, lse2, lse_other)"
    return _sub(src, "_sm90_kv1_finish", old, new)


VARIANTS["x16"] = x16


def x16u(src: str) -> str:
    """As x16, but the half goes unscaled at the loop end as today (the keeper still
    multiplies it by the partner's 1/l): the pack's power-of-two scale covers the row
    sums' range, and fp16's own exponent keeps each value within 2^28 of its pack's
    largest at 11 bits. Not an ablation: results stand (within that precision)."""
    return _unscaled16(src, _X16_CODE)


def _unscaled16(src: str, code: str) -> str:
    src = _keeper16(src, code)
    for fn in ("_sm90_kv1_s_wg", "_sm90_kv1_o_wg"):
        old = "_sm90_kv1_send_half(acc, BLOCK_H, DV, O_LAYOUT)"
        src = _sub(src, fn, old, "_sm90_kv1_send_half16(acc, BLOCK_H, DV, O_LAYOUT)")
    return src


def _keeper16(src: str, code: str) -> str:
    """The fp16 exchange's code (code: _X16_CODE or _X16P_CODE) added, and the keeper
    reading the partner's half through it."""
    anchor = "    @gluon.jit\n    def _sm90_kv1_send_stats("
    src = _sub(src, None, anchor, code + anchor)
    f = "_sm90_kv1_finish"
    old = "            off = _sm90_kv1_xchg_offsets(BLOCK_H, DV, O_LAYOUT)\n"
    new = "            off, eoff = _sm90_kv1_x16_offsets(BLOCK_H, DV, O_LAYOUT)\n"
    src = _sub(src, f, old, new)
    old = (
        '                _XCHG_GET4_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r",'
        " [off, gl.full_like(off, 1)],\n"
        "                dtype=gl.float32, is_pure=False, pack=4,\n"
    )
    new = (
        "                _X16_GET_ASM, _X16_GET_CONS, [off, eoff], dtype=gl.float32,"
        " is_pure=False, pack=16,\n"
    )
    return _sub(src, f, old, new)


VARIANTS["x16u"] = x16u


def _x16p_put_asm() -> str:
    words = "".join(
        f" abs.f32 y0, ${16 + 2 * i}; abs.f32 y1, ${17 + 2 * i}; max.f32 m, y0, y1;"
        f" mov.b32 e, m; shr.u32 e, e, 23; mov.u32 s{i}, 268; sub.u32 s{i}, s{i}, e;"
        f" min.u32 s{i}, s{i}, 253; shl.b32 b, s{i}, 23; mov.b32 x, b;"
        f" mul.f32 y0, ${16 + 2 * i}, x; mul.f32 y1, ${17 + 2 * i}, x;"
        f" cvt.rn.f16x2.f32 h{i}, y1, y0;\\n"
        for i in range(8)
    )
    pack = "".join(
        f" shl.b32 b, s{4 * w + k}, {8 * k}; or.b32 w{w}, w{w}, b;"
        for w in (0, 1)
        for k in (1, 2, 3)
    )
    outs = " ".join(f"mov.u32 ${k}, 0;" for k in range(16))
    return (
        '"{ .reg .f32 m, x, y0, y1; .reg .u32 a, e, b, w0, w1, s0, s1, s2, s3, s4, s5, s6, s7;'
        '\\n .reg .b32 h0, h1, h2, h3, h4, h5, h6, h7;\\n"\n'
        + "".join(f'        "{line}\\n"\n' for line in words.split("\\n") if line)
        + f'        " mov.u32 w0, s0; mov.u32 w1, s4;{pack}\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $32;\\n" + _TO_PARTNER +\n'
        '        " st.shared::cluster.v4.b32 [a], {h0, h1, h2, h3};\\n"\n'
        '        " st.shared::cluster.v4.b32 [a+2048], {h4, h5, h6, h7};\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $48;\\n" + _TO_PARTNER +\n'
        '        " st.shared::cluster.v2.b32 [a], {w0, w1};\\n"\n'
        f'        " {outs} }}"'
    )


def _x16p_get_asm() -> str:
    words = "".join(
        f" bfe.u32 s, w{i // 4}, {8 * (i % 4)}, 8; mov.u32 b, 254; sub.u32 b, b, s;"
        f" shl.b32 b, b, 23; mov.b32 x, b; mov.b32 {{lo, hi}}, h{i};"
        f" cvt.f32.f16 ${2 * i}, lo; cvt.f32.f16 ${2 * i + 1}, hi;"
        f" mul.f32 ${2 * i}, ${2 * i}, x; mul.f32 ${2 * i + 1}, ${2 * i + 1}, x;\\n"
        for i in range(8)
    )
    return (
        '"{ .reg .u32 a, s, b, w0, w1; .reg .f32 x; .reg .b16 lo, hi;\\n"\n'
        '        " .reg .b32 h0, h1, h2, h3, h4, h5, h6, h7;\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $16;\\n"\n'
        '        " ld.shared.v4.b32 {h0, h1, h2, h3}, [a];\\n"\n'
        '        " ld.shared.v4.b32 {h4, h5, h6, h7}, [a+2048];\\n"\n'
        '        " mov.u32 a, sparse_mla_xchg; add.u32 a, a, $32;\\n"\n'
        '        " ld.shared.v2.b32 {w0, w1}, [a];\\n"\n'
        + "".join(f'        "{line}\\n"\n' for line in words.split("\\n") if line)
        + '        " }"'
    )


# x16p: as x16u, but one scale a register pair (2 heads at one latent column) instead of a
# 16-register pack: 8 scale bytes a pack, 40 bytes for 16 values (62.5% of fp32).
def _x16p_code() -> str:
    code = _X16_CODE
    for old, new in (
        (_x16_put_asm(), _x16p_put_asm()),
        (_x16_get_asm(), _x16p_get_asm()),
        ("_X16_EXP + (j * 128 + t) * 4", "_X16_EXP + (j * 128 + t) * 8"),
    ):
        code = _sub(code, None, old, new)  # each anchor once, or a KeyError naming it
    return code


_X16P_CODE = _x16p_code()


def x16p(src: str) -> str:
    """As x16u, with one power-of-two scale a register pair: heads h and h + 1 at one
    latent column. A pack's scale spanned 2 columns and 8 heads' row sums, which lost a
    small column's near-zero values beside a large column (1.4e-4 of its largest in
    test_cluster_exchange_keeps_each_value_to_bf16); a pair spans only 2 heads' row
    sums. 40 bytes a 16-value pack instead of 32 (x16u) or 64 (fp32). Not an ablation:
    results stand (within that precision). Not run: exchange_precision.py (the CPU model
    of that test) has it fail as x16u does, since what the test refuses is fp16's 11
    bits where the two splits' halves cancel, not the range a pack's scale spans."""
    return _unscaled16(src, _X16P_CODE)


VARIANTS["x16p"] = x16p
