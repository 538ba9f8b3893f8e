# SPDX-License-Identifier: Apache-2.0
"""Triton sparse-MLA attention (DSA: GLM-5, DeepSeek-V3.2) for decode and prefill.

Each query token attends to its own top-k KV slots of the MLA latent cache
(576 = 512 latent + 64 rope per slot; the first 512 are also V). All heads of
a token share those rows, so one program gathers a tile of KV rows once and
feeds it to the tensor cores for a block of heads (heads are the M dimension).
The top-k range is split across programs (split-K) when T * H alone cannot
fill the GPU; a second small kernel merges the splits through their lse (on SM90,
two splits of 8-32 heads merge in the split kernel instead, as a 2-CTA cluster).

The API, the config tables and the choice live here; the kernels in one module a
family: triton_sparse_mla_triton.py (portable Triton, every part) and
triton_sparse_mla_sm90.py (Gluon, SM90). docs/sparse-mla-kernel.md explains the design;
docs/sparse-mla-kernel-journal.md holds the dated variants and measurements. These
modules import only torch and triton, so they run without vLLM.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
from triton.runtime.errors import OutOfResources

from .triton_sparse_mla_sm90 import (  # noqa: F401 (LAZY_MAX_SLACK: the tests read it here)
    _HAS_GLUON,
    _VOTE_BYTES,
    _XCHG_BYTES,
    LAZY_MAX_SLACK,
)
from .triton_sparse_mla_sm120 import _HAS_GLUON_SM120
from .triton_sparse_mla_triton import (
    _HAS_GDC,
    D_LATENT,
    D_QK,
    D_ROPE,
    _sparse_mla_merge_kernel,
    _sparse_mla_split_kernel,
)

if _HAS_GLUON:
    from .triton_sparse_mla_sm90 import _sm90_constexprs, _sparse_mla_split_kernel_sm90
if _HAS_GLUON_SM120:
    from .triton_sparse_mla_sm120 import _sm120_constexprs, _sparse_mla_split_kernel_sm120

# SM120 (RTX PRO 6000 Blackwell) and SM8x allow 99 KiB of shared memory a block.
SMALL_SMEM_BYTES = 101376


@dataclass(frozen=True)
class SparseMLAConfig:
    """Launch shape of the split kernel."""

    block_h: int  # heads per program (tl.dot M; 16 is the smallest MMA M)
    block_n: int  # gathered KV rows per loop step
    num_warps: int
    num_stages: int
    per_sm: int = 2  # programs per SM that split-K aims for (about the residency)
    idx_ahead: bool = True  # read next tile's slots early (double-buffered gathers)
    max_regs: int | None = None  # register cap (Triton's maxnreg), for more programs per SM
    # Launch the merge as a programmatic dependent of the split kernel: its
    # programs start (and wait) while the splits run. Only where the split grid
    # surely fits one wave, or waiting merge programs take the splits' slots.
    pdl: bool = False
    # Use the Gluon SM90 kernel (KV-major, pipeline written out): num_stages is its
    # number of KV buffers, block_n must be 64 (wgmma's M), num_warps 4 or 8.
    gluon: bool = False
    dup_s: bool = False  # Gluon: every warpgroup computes all of sT (see the kernel)
    late_issue: bool = False  # Gluon: issue the next gather after this tile's q.kT
    # Gluon: producer warps of their own gather the tiles (warp specialisation);
    # 0 keeps the gathers in the MMA warps. producer_regs is their register cap.
    producer_warps: int = 0
    producer_regs: int = 88
    sum_late: bool = False  # Gluon: keep row sums per row at 64 heads as well
    head_major: bool = False  # Gluon with producer warps, 64-head blocks: heads as wgmma M
    # Head-major: the row max crosses the warpgroups through one shared-memory store and
    # one barrier (each warpgroup's max, read back by both) instead of Triton's reduction.
    xchg_max: bool = False
    # Three partitions of one warpgroup each: the first computes s and the softmax for
    # the whole tile (head-major: q read from shared memory once a tile, not once per
    # warpgroup, and no row-max exchange; KV-major, up to 32 heads: the kv tile read
    # once, and alpha handed over once) and half of o, the second the other half of o,
    # the producers gather. num_warps is the first partition's: 4.
    s_by_one: bool = False
    # KV-major with producer warps, one head block, exactly two splits: the two programs
    # of a token run as a 2-CTA cluster and combine their halves of o through
    # distributed shared memory (no partials in global memory, no merge kernel). With
    # s_by_one each warpgroup's half of oT is one split's half of o's columns.
    cluster_merge: bool = False
    # The SM120 family (triton_sparse_mla_sm120.py): Gluon with mma.sync, producer_warps
    # (1, 2, 4 or 8) gathering into num_stages mbarrier-guarded stages; block_h 16 or 32
    # (4 MMA warps a 16 heads), block_n 16 or 32; an e4m3 cache is widened on the way in.
    # Runs on compute capability >= 9 (mbarrier try_wait).
    gluon120: bool = False
    hold_q: bool = False  # SM120 family: q in registers for the whole loop
    # SM120 family: q.kT's MMAs in this many independent accumulator chains (1 to 4).
    qk_chains: int = 1
    # SM120 family, 16-bit cache: the 4 MMA warps of a 16-head group split q.kT's columns
    # (each holds its slice of q) and o's, instead of s's rows: q is never re-read from
    # shared memory and p never stored there (triton_sparse_mla_sm120._sm120_mma_k).
    k_split: bool = False

    def launch_options(self) -> dict[str, int]:
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.max_regs is not None:
            opts["maxnreg"] = self.max_regs
        return opts

    def smem_estimate(self, kv_bytes: int = 2) -> int:
        """Upper estimate of shared memory, calibrated on compiled SM90/SM120 builds.

        The slot load takes one pipeline stage, so num_stages - 1 KV tiles are
        buffered; q and p go through shared memory on the way to the MMA.
        """
        kv_tile = self.block_n * D_QK * kv_bytes
        if self.gluon120:  # stages and their slots, q, p, barriers (from sm_120a builds)
            # The stages hold q's dtype: an fp8 cache is widened on its way in.
            bufs = self.num_stages * (self.block_n * D_QK * 2 + 4 * self.block_n + 16)
            if self.k_split:  # + the four warps' shares of s, summed through shared memory
                return bufs + 4 * self.block_h * self.block_n * 4 + 2 * 1024
            q_tile = 0 if self.hold_q else self.block_h * D_QK * 2
            return bufs + q_tile + self.block_h * self.block_n * 2 + 2 * 1024
        if self.gluon:  # num_stages buffers, q and p tiles, reduction scratch
            p_tile = self.block_n * self.block_h * 2
            bufs = self.num_stages * (kv_tile + 4 * self.block_n)  # + the slots (producer warps)
            # + barriers and reduction scratch (16 B a head, from the compiled builds)
            red = 8 * self.block_h if self.xchg_max else 0  # each warpgroup's row max
            if self.s_by_one:  # alpha, 4 barriers (KV-major: the lse, the softmax's scratch)
                red += 4 * self.block_h + 64 if self.head_major else 8 * self.block_h + 1280
            red += _XCHG_BYTES if self.cluster_merge else 0
            red += _VOTE_BYTES if self.s_by_one and not self.head_major else 0
            return bufs + self.block_h * D_QK * 2 + p_tile + 16 * self.block_h + 64 + red
        if kv_bytes == 1:
            # fp8: each stage holds a tile and its latent part again (K's own copy, see
            # the kernel); calibrated on sm_120 builds (tests/kernels/sm120_fitness.py).
            per_stage = self.block_n * (2 * D_LATENT + D_ROPE)
            return self.num_stages * per_stage + (self.block_h - 16) * D_QK * 2 + 4096
        q_tile = self.block_h * D_QK * 2
        p_tile = self.block_h * self.block_n * 2
        return max(1, self.num_stages - 1) * kv_tile + q_tile + p_tile + 4096


# Preferred configs first; a config is used only if its estimate fits the device.
# "big" targets 227 KiB parts (H100/H200/B200), "small" 99 KiB parts (SM120, SM8x).
_CONFIGS_BIG: dict[str, SparseMLAConfig] = {
    # One token's 8-16 heads alone (batch 1): 16-row tiles give split-K 128 programs.
    "h16_n16": SparseMLAConfig(16, 16, 4, 4, per_sm=2, pdl=True),
    # 93 KiB and 190 registers (Triton 3.6): two programs per SM, two tiles in flight each.
    "h16_n32": SparseMLAConfig(16, 32, 4, 3, per_sm=2, pdl=True),
    "h16_n64": SparseMLAConfig(16, 64, 8, 2, per_sm=2),
    # 17-32 heads: one gathered 64-row tile feeds all 32 heads (184 KiB, 174
    # registers, one program per SM); 64 rows a step amortise the per-step
    # cost (q re-read from shared memory by every warp, the slot load).
    "h32_n64": SparseMLAConfig(32, 64, 8, 3, per_sm=1),
    # Many heads: one gathered tile feeds 64 heads (221 KiB, one program per SM).
    "h64_n64": SparseMLAConfig(64, 64, 8, 2, per_sm=1, idx_ahead=False),
    # SM90 (Gluon, wgmma): two 64-row buffers, one program per SM. Up to 8 heads,
    # each warpgroup computes all of sT; from 64, the next gather goes out after q.kT.
    "g_h8": SparseMLAConfig(8, 64, 8, 2, per_sm=1, pdl=True, gluon=True, dup_s=True),
    "g_h16": SparseMLAConfig(16, 64, 8, 2, per_sm=1, pdl=True, gluon=True),
    "g_h32": SparseMLAConfig(32, 64, 8, 2, per_sm=1, pdl=True, gluon=True),
    "g_h64": SparseMLAConfig(64, 64, 8, 2, per_sm=1, pdl=True, gluon=True, late_issue=True),
    # The same with producer warps of their own (warp specialisation): from 32 tokens
    # (from 8 at 64+ heads); up to 8 heads a third buffer fits, which pays in prefill.
    # Up to 32 heads one warpgroup computes sT for every head and the softmax, and each
    # of two computes half of oT (s_by_one, KV-major). With exactly two splits (about
    # 45-66 tokens) these run as 2-CTA clusters that merge through distributed shared
    # memory (cluster_merge), else the merge kernel.
    "ws_h8": SparseMLAConfig(
        8, 64, 4, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4, s_by_one=True,
        cluster_merge=True,
    ),
    "ws_h8_b3": SparseMLAConfig(
        8, 64, 8, 3, per_sm=1, pdl=True, gluon=True, dup_s=True, producer_warps=4
    ),
    "ws_h16": SparseMLAConfig(
        16, 64, 4, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4, s_by_one=True,
        cluster_merge=True,
    ),
    "ws_h32": SparseMLAConfig(
        32, 64, 4, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4, s_by_one=True,
        cluster_merge=True,
    ),
    "ws_h64": SparseMLAConfig(
        64, 64, 8, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4, sum_late=True
    ),
    # 64-head blocks head-major (heads as wgmma M), s and the softmax by one warpgroup,
    # o split between two (s_by_one): q is read once a tile, and no row max crosses.
    "hm_h64": SparseMLAConfig(
        64, 64, 4, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4, head_major=True,
        s_by_one=True,
    ),
}
# 99 KiB parts (SM120: 100 KiB a SM). Chosen on the SM120 stand-in (an H100 with
# DISABLE_MMA_V3=1, these configs and SM120's residency; fixtures/kernels/sm120_standin.py,
# `make bench-kernels-sm120 BENCH_ARGS=--sweep`), among builds that fit sm_120a with no
# spills (docs/sparse-mla-kernel-journal.md, "SM120 stand-in").
_CONFIGS_SMALL: dict[str, SparseMLAConfig] = {
    # The SM120 Gluon family for a lone token of up to 16 heads, and behind the K-split
    # builds from two tokens: producer warps keep two 32-row stages in flight while 4 MMA
    # warps run mma.sync, each on a quarter of s's columns.
    "g120_h16n32": SparseMLAConfig(
        16, 32, 4, 2, per_sm=1, pdl=True, gluon120=True, producer_warps=4
    ),
    # Up to 16 heads from two tokens: the 4 MMA warps split q.kT's columns (k_split);
    # 2 producer warps keep two 32-row stages in flight.
    "g120_h16n32_k": SparseMLAConfig(
        16, 32, 4, 2, per_sm=1, pdl=True, gluon120=True, producer_warps=2, k_split=True
    ),
    # 17-32 heads from two tokens, as one head block: two K-split groups (8 MMA warps)
    # share each gathered 16-row tile; three stages in flight (32-row stages spill).
    "g120_h32n16_k": SparseMLAConfig(
        32, 16, 8, 3, per_sm=1, pdl=True, gluon120=True, producer_warps=4, k_split=True
    ),
    # An e4m3 cache, a lone token of up to 32 heads: 8 producer warps widen the rows
    # through registers, two tiles in flight each (96 registers a thread, no spills).
    "g120_h16n32_fp8": SparseMLAConfig(
        16, 32, 4, 2, per_sm=1, pdl=True, gluon120=True, producer_warps=8, producer_regs=96
    ),
    # An e4m3 cache, up to 16 heads from two tokens: the same producers into K-split
    # stages. 17-32 heads take g120_h32n16_k, whose 4 producer warps widen as well.
    "g120_h16n32_k_fp8": SparseMLAConfig(
        16, 32, 4, 2, per_sm=1, pdl=True, gluon120=True, producer_warps=8, producer_regs=96,
        k_split=True,
    ),
    # A lone token: 37 KiB, two programs per SM, so split-K makes 2 x SMs programs.
    "h16_n16_p2": SparseMLAConfig(16, 16, 4, 2, per_sm=2, pdl=True),
    # Everything else up to 32 heads (32 as two head blocks, the second reading the rows
    # from L2: ahead of 32-head blocks, whose 4-warp build spills and 8-warp one is slower).
    "h16_n32": SparseMLAConfig(16, 32, 4, 3, per_sm=1, pdl=True),
    # Over 32 heads from 16 tokens (untimed on the stand-in).
    "h32_n32": SparseMLAConfig(32, 32, 8, 2, per_sm=1, idx_ahead=False),
    # fp8 KV (widened to 16 bit on the way to the MMA): no wider tile fits without spills.
    "h16_n16_p2_fp8": SparseMLAConfig(16, 16, 4, 2, per_sm=2, pdl=True),
    "h32_n32_fp8": SparseMLAConfig(32, 32, 8, 2, per_sm=1, pdl=True),
    "h16_n16_fp8": SparseMLAConfig(16, 16, 4, 3, per_sm=1, idx_ahead=False),
}
# The merge kernel: partial-output elements a warp reads (splits x columns), and the
# fewest columns a program takes (32 fp32: one 128-byte line a split).
MERGE_WARP_ELEMS = 2048
MERGE_MIN_COLS = 32


def merge_shape(num_splits: int) -> tuple[int, int, int]:
    """The merge kernel's BLOCK_S (splits, a power of two), BLOCK_D (columns) and warps.

    Warps side by side along the columns (128 a warp: 4 a lane) reduce over the splits
    within a warp; warps stacked along the splits, only where one warp would read more
    than MERGE_WARP_ELEMS, reduce through shared memory and bar.sync (journal, variant 66).
    """
    block_s = triton.next_power_of_2(num_splits)
    block_d = min(D_LATENT, max(MERGE_MIN_COLS, MERGE_WARP_ELEMS // block_s))
    return block_s, block_d, max(1, block_d // 128, block_s * block_d // MERGE_WARP_ELEMS)


_FALLBACK = SparseMLAConfig(16, 16, 4, 3, idx_ahead=False)  # smallest build; fits every part


@dataclass(frozen=True)
class DeviceInfo:
    num_sms: int
    smem_bytes: int
    major: int = 0  # compute capability major (0: not a CUDA device)


@functools.lru_cache(maxsize=16)
def _device_info(device: torch.device) -> DeviceInfo:
    if device.type != "cuda":
        # TRITON_INTERPRET=1 on CPU: behave like a small SM120 part.
        return DeviceInfo(num_sms=8, smem_bytes=SMALL_SMEM_BYTES)
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or SMALL_SMEM_BYTES
    return DeviceInfo(
        num_sms=props.multi_processor_count, smem_bytes=int(smem), major=int(props.major)
    )


@functools.lru_cache(maxsize=1024)
def candidate_configs(
    num_tokens: int, num_heads: int, info: DeviceInfo, kv_bytes: int = 2
) -> tuple[SparseMLAConfig, ...]:
    """Configs for a problem on a device, best first, all estimated to fit.

    Cached: sparse_mla_fwd asks on every call, and the answer depends on these
    arguments only (about 10 us of Python per call otherwise).

    Chosen from H200 sweeps (docs/sparse-mla-kernel-journal.md): on SM90 the
    Gluon kernel from 8 tokens (head blocks of 8, 16, 32 or 64: one gathered
    tile feeds them all; producer warps from 32 tokens, and from 8 at 64+ heads,
    where the 64-head blocks run head-major), a lone token of 8-16 heads the Triton kernel with
    16-row tiles so split-K reaches 128 programs. Elsewhere the Triton kernel:
    32- and 64-head blocks from 16 tokens, else double-buffered 32-row tiles.
    99 KiB parts (SM120) get the small-part table, chosen on the SM120 stand-in.
    """
    alone = num_tokens * triton.cdiv(num_heads, 16) == 1
    if info.smem_bytes >= 2 * SMALL_SMEM_BYTES:
        table = _CONFIGS_BIG
        # SM90 from 8 tokens: the Gluon kernel (the Triton configs stay as fallbacks).
        sm90 = _HAS_GLUON and info.major == 9 and kv_bytes == 2
        gluon_ok = sm90 and num_tokens >= 8
        ws = num_tokens >= 32  # producer warps; below, the inline pipeline was ahead
        if sm90 and num_tokens < 8 and num_heads > 64:  # 32-head blocks beat h16_n64 here
            order = ["g_h32", "h16_n64", "h16_n32"]
        elif gluon_ok and num_heads <= 8:
            first = ("ws_h8_b3" if num_tokens >= 512 else "ws_h8") if ws else "g_h8"
            order = [first, "g_h8", "g_h16", "h16_n32"]
        elif gluon_ok and num_heads <= 16:
            order = ["ws_h16" if ws else "g_h16", "g_h16", "h16_n32"]
        elif gluon_ok and num_heads <= 32:
            order = ["ws_h32" if ws else "g_h32", "g_h32", "h32_n64", "h16_n32"]
        elif gluon_ok:
            order = ["hm_h64", "ws_h64", "g_h64", "h64_n64", "h16_n32"]
        elif alone:
            order = ["h16_n16", "h16_n32"]
        elif num_heads >= 64 and num_tokens >= 16:
            order = ["h64_n64", "h16_n32"]
        elif num_heads > 16 and num_tokens >= 16:
            order = ["h32_n64", "h16_n32"]
        elif num_heads >= 64:
            order = ["h16_n64", "h16_n32"]
        else:
            order = ["h16_n32", "h16_n64"]
    else:
        table = _CONFIGS_SMALL
        sm120 = _HAS_GLUON_SM120 and info.major >= 12
        if kv_bytes == 1 and sm120 and num_heads <= 32:
            order = ["g120_h16n32_fp8", "h16_n16_p2_fp8", "h16_n16_fp8"]
            if num_tokens >= 2:  # K-split stages from two tokens
                order.insert(0, "g120_h16n32_k_fp8" if num_heads <= 16 else "g120_h32n16_k")
        elif kv_bytes == 1:
            wide = num_heads > 16 and num_tokens >= 16
            order = ["h32_n32_fp8" if wide else "h16_n16_p2_fp8", "h16_n16_fp8"]
        elif alone:
            order = ["g120_h16n32"] * sm120 + ["h16_n16_p2", "h16_n32"]
        elif sm120 and num_tokens >= 2 and 16 < num_heads <= 32:
            order = ["g120_h32n16_k", "g120_h16n32", "h16_n32", "h16_n16_p2"]
        elif num_heads > 32 and num_tokens >= 16:
            order = ["h32_n32", "h16_n32"]
        elif sm120 and num_tokens >= 2 and num_heads <= 16:
            order = ["g120_h16n32_k", "g120_h16n32", "h16_n32", "h16_n16_p2"]
        elif sm120 and num_tokens >= 2:
            order = ["g120_h16n32", "h16_n32", "h16_n16_p2"]
        else:
            order = ["h16_n32", "h16_n16_p2"]
    cfgs = [table[n] for n in order if table[n].smem_estimate(kv_bytes) <= info.smem_bytes]
    return tuple(dict.fromkeys([*cfgs, _FALLBACK]))


def pick_config(
    num_tokens: int, num_heads: int, info: DeviceInfo, kv_bytes: int = 2
) -> SparseMLAConfig:
    return candidate_configs(num_tokens, num_heads, info, kv_bytes)[0]


def pick_num_splits(
    num_tokens: int, num_hblk: int, topk: int, block_n: int, num_sms: int, per_sm: int = 2
) -> int:
    """Split top-k so that the grid is about one full wave of `per_sm` programs per SM.

    Rounding down matters: 1.5 waves cost as much as 2, and every split adds
    partial-output traffic and the merge.
    """
    base = num_tokens * num_hblk
    splits = max(1, min((per_sm * num_sms) // base, triton.cdiv(topk, block_n)))
    split_len = triton.cdiv(triton.cdiv(topk, splits), block_n) * block_n
    return triton.cdiv(topk, split_len)


def workspace_numel(num_tokens: int, num_heads: int, num_splits: int) -> int:
    """fp32 elements of the split-K workspace: partial outputs then partial lse."""
    if num_splits <= 1:
        return 0
    return num_tokens * num_heads * num_splits * (D_LATENT + 1)


def _max_workspace(
    num_tokens: int, num_heads: int, topk: int, info: DeviceInfo, kv_bytes: int
) -> int:
    sizes = [0]
    for cfg in candidate_configs(num_tokens, num_heads, info, kv_bytes):
        nh = triton.cdiv(num_heads, cfg.block_h)
        splits = pick_num_splits(num_tokens, nh, topk, cfg.block_n, info.num_sms, cfg.per_sm)
        sizes.append(workspace_numel(num_tokens, num_heads, splits))
    return max(sizes)


def max_workspace_numel(
    num_tokens: int, num_heads: int, topk: int, device: torch.device, kv_bytes: int = 2
) -> int:
    """Workspace (fp32 elements) that covers any config sparse_mla_fwd may pick here;
    allocate it once before CUDA-graph capture."""
    return _max_workspace(num_tokens, num_heads, topk, _device_info(device), kv_bytes)


@functools.lru_cache(maxsize=64)
def _workspace_bound(num_heads: int, topk: int, info: DeviceInfo, kv_bytes: int) -> int:
    # Past per_sm x SMs tokens every config runs one split, which needs no workspace.
    most = max(c.per_sm for c in (*_CONFIGS_BIG.values(), *_CONFIGS_SMALL.values()))
    return max(
        _max_workspace(t, num_heads, topk, info, kv_bytes)
        for t in range(1, most * info.num_sms + 1)
    )


def workspace_bound(
    num_heads: int, topk: int, device: torch.device, kv_bytes: int = 2
) -> int:
    """fp32 elements of one workspace that serves every batch size here: the backend
    reserves it once, before CUDA-graph capture, and hands it to every call."""
    return _workspace_bound(num_heads, topk, _device_info(device), kv_bytes)


def sparse_mla_fwd(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    *,
    kv_scale: float = 1.0,
    workspace: torch.Tensor | None = None,
    config: SparseMLAConfig | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention over per-token top-k global KV slots.

    q: [T, H, 576] bf16/fp16. kv_cache: [num_blocks, block_size, 576] or
    [num_blocks, block_size, 1, 576], q's dtype, or float8_e4m3fn with a
    per-tensor ``kv_scale``. indices: [T, topk] int32 global slots
    (block * block_size + offset), -1 = skip. Returns o [T, H, 512] in q's
    dtype and lse [T, H] float32 (natural log; -inf where nothing was valid).
    No host syncs and no data-dependent shapes, so it is CUDA-graph safe;
    pass ``workspace`` (>= workspace_numel fp32) to avoid allocation.
    """
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)
    num_tokens, num_heads, d_qk = q.shape
    topk = indices.shape[-1]
    if d_qk != D_QK or kv_cache.shape[-1] != D_QK:
        raise ValueError(f"expected head dim {D_QK}, got q {d_qk} and kv {kv_cache.shape[-1]}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q must be bf16 or fp16, got {q.dtype}")
    kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if kv_cache.dtype != q.dtype and not kv_fp8:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} does not match q {q.dtype}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32, got {indices.dtype}")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("last dims of q, kv_cache and indices must be contiguous")
    indices = indices.reshape(num_tokens, topk)
    if out is None:
        out = q.new_empty(num_tokens, num_heads, D_LATENT)
    if lse is None:
        lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return out, lse

    info = _device_info(q.device)
    if config is not None:
        cfgs: tuple[SparseMLAConfig, ...] = (config,)
    else:
        cfgs = candidate_configs(num_tokens, num_heads, info, kv_cache.element_size())
        if _UNFIT:  # empty unless Triton refused a config on this device
            cfgs = tuple(c for c in cfgs if (q.device, kv_cache.dtype, c) not in _UNFIT)
            cfgs = cfgs or (_FALLBACK,)
    for i, cfg in enumerate(cfgs):
        try:
            _launch(
                q, kv_cache, indices, out, lse, sm_scale, kv_scale, workspace, cfg, num_splits, info
            )
            return out, lse
        except OutOfResources:
            # The compiled kernel asks for more shared memory than this device
            # has; Triton refuses before launching, so nothing was written.
            if config is not None or i == len(cfgs) - 1:
                raise
            _UNFIT.add((q.device, kv_cache.dtype, cfg))
    raise AssertionError("unreachable")


_UNFIT: set[tuple[torch.device, torch.dtype, SparseMLAConfig]] = set()


# False once this Triton's compiled kernels turned out not to carry the launch metadata
# that _launch_in_pairs edits (then cluster_merge configs use the merge kernel).
_PAIRS_OK = True


def _launch_in_pairs(args: tuple, kw: dict, num_tokens: int) -> bool:
    """Prepare the cluster_merge build so that the next launch runs it in 2-CTA clusters.

    Triton launches num_ctas CTAs a program as one cluster (gridDim.x doubled, the
    cluster attribute set) from the compiled kernel's packed metadata (num_warps,
    num_ctas, shared memory). The kernel is written per CTA and compiled with num_ctas 1
    (Gluon cannot compile it for 2), so num_ctas 2 is set there after compiling: CTAs 2k
    and 2k + 1 are token k's two splits. Returns False where that metadata is missing.
    """
    global _PAIRS_OK
    k = _sparse_mla_split_kernel_sm90.warmup(*args, grid=(num_tokens,), **kw)
    meta = getattr(k, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3):
        _PAIRS_OK = False
        return False
    if meta[1] != 2:
        k.packed_metadata = (meta[0], 2, meta[2])
    return True


def _launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sm_scale: float,
    kv_scale: float,
    workspace: torch.Tensor | None,
    cfg: SparseMLAConfig,
    num_splits: int | None,
    info: DeviceInfo,
) -> object:
    """Launch split (and merge) kernels; returns the split kernel's build (None interpreted)."""
    num_tokens, num_heads, _ = q.shape
    topk = indices.shape[1]
    num_hblk = triton.cdiv(num_heads, cfg.block_h)
    if num_splits is None:
        num_splits = pick_num_splits(
            num_tokens, num_hblk, topk, cfg.block_n, info.num_sms, cfg.per_sm
        )
    split_len = triton.cdiv(triton.cdiv(topk, num_splits), cfg.block_n) * cfg.block_n
    num_splits = triton.cdiv(topk, split_len)
    direct = num_splits == 1
    # cluster_merge: the two splits of a token combine in the split kernel (2-CTA cluster).
    cluster = cfg.cluster_merge and num_splits == 2 and num_hblk == 1 and _PAIRS_OK

    if direct or cluster:
        po = plse = lse  # unused placeholders
    else:
        need = workspace_numel(num_tokens, num_heads, num_splits)
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.float32, device=q.device)
        elif workspace.numel() < need or workspace.dtype != torch.float32:
            raise ValueError(f"workspace needs {need} float32 elements")
        n_po = num_tokens * num_heads * num_splits * D_LATENT
        # fp32 partials: 16-bit ones (half the bytes) made every split-K cell 7-25%
        # slower on the H200 (docs/sparse-mla-kernel-journal.md, variant 27).
        po = workspace[:n_po]
        plse = workspace[n_po:need]

    qk_scale = sm_scale * math.log2(math.e) * kv_scale
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    # cfg.pdl: the split kernel launches as a programmatic dependent of whatever precedes
    # it (its CTAs are placed while that grid drains, and wait with griddepcontrol.wait
    # before touching memory), and lets its merge kernel launch early. Not for the other
    # configs: h16 n64 w8 at 64 x 1 took 0.4 us longer as a dependent (H200, journal).
    pdl_wait = cfg.pdl and _HAS_GDC and info.major >= 9 and not interpret
    pdl = not direct and not cluster and pdl_wait
    grid = (num_tokens * num_splits * num_hblk,)
    # Every family's split kernel takes the same runtime arguments.
    args = (
        q, kv_cache, indices, out, lse, po, plse,
        qk_scale, kv_scale,
        num_heads, topk, split_len, num_splits, num_hblk, kv_cache.shape[1],
        q.stride(0), q.stride(1),
        kv_cache.stride(0), kv_cache.stride(1),
        indices.stride(0),
        out.stride(0), out.stride(1),
        lse.stride(0), lse.stride(1),
    )  # fmt: skip
    pdl_kw = {"launch_pdl": True} if pdl_wait else {}
    if cfg.gluon120:
        if (
            cfg.gluon
            or cfg.block_h not in (16, 32)
            or cfg.block_n not in (16, 32)
            or cfg.num_warps != 4 * (cfg.block_h // 16)
            or cfg.producer_warps not in (1, 2, 4, 8)
            or (cfg.k_split and (cfg.hold_q or cfg.qk_chains != 1))
        ):
            raise ValueError(f"no SM120 Gluon sparse-MLA build for {cfg}")
        if not (_HAS_GLUON_SM120 and info.major >= 9) or interpret:
            raise ValueError("the SM120 Gluon sparse-MLA kernel needs an SM90 or newer GPU")
        if kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
            raise ValueError("the SM120 Gluon sparse-MLA kernel reads KV in q's dtype or e4m3")
        build = _sparse_mla_split_kernel_sm120[grid](
            *args, **_sm120_constexprs(cfg, direct, pdl), num_warps=cfg.num_warps, **pdl_kw
        )
    elif cfg.gluon:  # a config with no build is refused on any machine
        if (
            cfg.block_n != 64
            or cfg.num_warps % 4
            or (not cfg.dup_s and cfg.block_h * 4 // cfg.num_warps < 8)
            or (cfg.head_major and (cfg.block_h != 64 or not cfg.producer_warps or cfg.dup_s))
            or (cfg.xchg_max and not cfg.head_major)
            or (
                cfg.s_by_one
                and (cfg.num_warps != 4 or cfg.xchg_max or cfg.dup_s or not cfg.producer_warps
                     or (not cfg.head_major and cfg.block_h > 32))
            )
            or (
                cfg.cluster_merge
                and (cfg.head_major or not cfg.producer_warps
                     or cfg.num_warps != (4 if cfg.s_by_one else 8) or cfg.block_h > 32)
            )
        ):
            raise ValueError(f"no Gluon sparse-MLA build for {cfg}")
        if not (_HAS_GLUON and info.major == 9) or interpret:
            raise ValueError("the Gluon sparse-MLA kernel needs an SM90 GPU")
        if kv_cache.dtype != q.dtype:
            raise ValueError("the Gluon sparse-MLA kernel reads KV in q's dtype")
        kw = dict(_sm90_constexprs(cfg, direct, pdl, cluster), num_warps=cfg.num_warps, **pdl_kw)
        if cluster:
            if not _launch_in_pairs(args, kw, num_tokens):
                # This Triton's launcher cannot be asked for clusters: the merge kernel.
                plain = dataclasses.replace(cfg, cluster_merge=False)
                return _launch(
                    q, kv_cache, indices, out, lse, sm_scale, kv_scale, workspace, plain,
                    num_splits, info,
                )  # fmt: skip
            grid = (num_tokens,)  # one program a cluster of two CTAs
        build = _sparse_mla_split_kernel_sm90[grid](*args, **kw)
    else:
        build = _sparse_mla_split_kernel[grid](
            *args,
            BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DV=D_LATENT, DR=D_ROPE, DIRECT=direct,
            IDX_AHEAD=cfg.idx_ahead,
            USE_PDL=pdl,
            DOT_F32=interpret,
            PDL_WAIT=pdl_wait,
            **pdl_kw,
            **cfg.launch_options(),
        )  # fmt: skip
    if not direct and not cluster:
        block_s, block_d, merge_warps = merge_shape(num_splits)
        _sparse_mla_merge_kernel[(num_tokens * num_heads, D_LATENT // block_d)](
            po, plse, out, lse,
            num_heads, num_splits,
            out.stride(0), out.stride(1),
            lse.stride(0), lse.stride(1),
            BLOCK_S=block_s, BLOCK_D=block_d, DV=D_LATENT, USE_PDL=pdl,
            num_warps=merge_warps, **({"launch_pdl": True} if pdl else {}),
        )  # fmt: skip
    return build


def reference_sparse_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 gather-and-softmax reference: o [T, H, 512] fp64, lse [T, H] fp64."""
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)
    flat = kv_cache.reshape(-1, D_QK).to(torch.float64) * kv_scale
    valid = indices >= 0
    rows = flat[indices.clamp(min=0).long()]  # [T, topk, 576]
    qf = q.to(torch.float64)
    scores = torch.einsum("thd,tkd->thk", qf, rows) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    o = torch.einsum("thk,tkd->thd", probs, rows[..., :D_LATENT])
    return o, lse
