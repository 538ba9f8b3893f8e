"""Benchmark the Triton sparse-MLA kernel against its floor and its peers.

Two steps:

  make bench-peers    # here, plain python3: fetch peers into .bench-peers/ (bench_peers.py)
  make bench-kernels  # on the GPU machine (carry .bench-peers): this file's `run`

Without the prepared peers `run` stops at once with an error that names them
(`--no-peers` times ours alone, with no peer columns).

`run` measures the copy bandwidth and the bf16 matmul rate, checks every
kernel against a float64 reference, then times all of them under CUDA-graph
replay and prints one table: heads x tokens, topk 2048, bf16. Decode rows
are batch 1..128 (one query token per request); prefill rows are 1024 and
4096 query tokens, each with its own top-k. Every row replays enough index
sets that one replay touches >= 3x the L2, so no row is timed from a warm L2,
and captures whole rounds of them until a replay makes >= 32 calls or gathers
>= 4 GB, so the graph's own launch (~10 us a replay) is spread as thin as in a
model's captured forward, where the layers share one launch.

`run --sm120` (`make bench-kernels-sm120`) times the kernel as an SM120 part runs it
(fixtures/kernels/sm120_standin.py: mma.sync, the small-part configs, SM120's residency)
and, in the same process, the SM90 path it would take here (column "SM90") beside the
peers and the floor; `--fp8` adds our kernel over an e4m3 KV cache against its own floor
(1 byte a KV element).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import glob
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[2])]
from bench_peers import PEER_FILES, PEERS  # noqa: E402

from fixtures.kernels.kernel_loader import load_kernel_module  # noqa: E402
from fixtures.kernels.sm120_standin import load_standin, sm120_blocks_per_sm  # noqa: E402

TOPK = 2048
HEADS = (8, 16, 32, 64, 128)
BATCHES = (1, 16, 32, 64, 128)  # decode
PREFILL = (1024, 4096)  # prefill query tokens
HAND_MAX_TOKENS = 128  # the hand approach is a decode kernel; prefill rows leave it out
SLOTS = 1 << 21  # KV cache rows (2M = 2.4 GB bf16)
E4M3_SCALE = 0.05  # --fp8: our e4m3 cache holds kv / E4M3_SCALE (randn * 20 fits e4m3)


def l2_bytes(dev: object) -> int:
    """The device's L2 size (60 MB where torch does not report it)."""
    return int(getattr(dev, "L2_cache_size", 0) or 60e6)


def gathered_bytes(tokens: int, topk: int = TOPK) -> int:
    """KV bytes one call gathers (top-k rows of 576 bf16 a query token)."""
    return tokens * topk * 576 * 2


def index_sets(tokens: int, l2: int, topk: int = TOPK) -> int:
    """Index sets a cell replays so that one replay gathers >= 3x the L2 (cold L2)."""
    return max(2, math.ceil(3 * l2 / gathered_bytes(tokens, topk)))


# One graph replay costs ~10 us of launch before its first kernel (H200: a one-call
# graph of a tiny kernel times 10.75 us a call, a 32-call graph 1.14). With the two
# index sets of batch >= 64 as the whole graph, that added ~5 us to every call
# (8x64: 45.0 us at 2 calls, 42.4 at 32), which a served model, 78 layers to one
# captured graph, does not pay per layer.
REPLAY_CALLS = 32
REPLAY_BYTES = 4e9  # ~1 ms at the copy ceiling: the launch is < 1% of such a replay


def calls_per_replay(tokens: int, n_sets: int, topk: int = TOPK) -> int:
    """Calls captured into one graph: whole rounds of the n_sets index sets (so a set
    never follows itself, across replays too) until the replay makes >= REPLAY_CALLS
    calls or gathers >= REPLAY_BYTES."""
    want = min(REPLAY_CALLS, math.ceil(REPLAY_BYTES / gathered_bytes(tokens, topk)))
    return n_sets * max(1, math.ceil(want / n_sets))


# ----------------------------------------------------------------------------- peers


def peers_missing(names: tuple[str, ...] = tuple(PEER_FILES)) -> list[str]:
    """Those of the named peers whose files `make bench-peers` prepares are not under
    PEERS, each as 'name (path)'."""
    return [f"{n} ({PEERS / PEER_FILES[n]})" for n in names if not (PEERS / PEER_FILES[n]).exists()]


def peers_error(what: str) -> str:
    return (
        f"bench_sparse_mla: error: {what}; the targets are set against the peers timed in"
        " the same run: run `make bench-peers` on a machine with an index and carry"
        " .bench-peers with the checkout, or pass --no-peers to time ours alone"
    )


def load_decode_attention() -> Callable | None:
    if peers_missing(("hand",)):
        return None
    sys.path.insert(0, str(PEERS))
    import triton_decode_attention  # type: ignore[import-not-found]

    return triton_decode_attention.decode_attention_fwd


def load_flashmla() -> tuple[object | None, str]:
    if peers_missing(("flashmla",)):
        return None, "not prepared"
    # The extension links libcudart.so.13; torch's own copy may not be on the
    # loader path, so load it by file first.
    for lib in glob.glob(
        str(Path(torch.__file__).parents[1] / "nvidia/**/libcudart.so.13*"), recursive=True
    ):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        break
    sys.path.insert(0, str(PEERS))
    try:
        from vllm.third_party.flashmla import flash_mla_interface  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - report any load failure as a missing peer
        return None, f"{type(exc).__name__}: {exc}"
    return flash_mla_interface, "ok"


def quantize_fp8_ds_mla(kv: torch.Tensor) -> torch.Tensor:
    """bf16 [slots, 576] -> FlashMLA's 656-byte fp8_ds_mla rows (uint8 [slots, 656]).

    512 e4m3 latent values, 4 fp32 scales (one per 128), 64 bf16 rope values.
    """
    slots = kv.shape[0]
    nope = kv[:, :512].float().view(slots, 4, 128)
    scale = (nope.abs().amax(-1) / 448.0).clamp_min(1e-8)
    q8 = (nope / scale[..., None]).to(torch.float8_e4m3fn).view(slots, 512)
    out = torch.empty(slots, 656, dtype=torch.uint8, device=kv.device)
    out[:, :512] = q8.view(torch.uint8)
    out[:, 512:528] = scale.contiguous().view(torch.uint8)
    out[:, 528:] = kv[:, 512:].contiguous().view(torch.uint8)
    return out


def dequantize_fp8_ds_mla(raw: torch.Tensor) -> torch.Tensor:
    slots = raw.shape[0]
    q8 = raw[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(slots, 4, 128)
    scale = raw[:, 512:528].contiguous().view(torch.float32)
    nope = (q8 * scale[..., None]).view(slots, 512)
    rope = raw[:, 528:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], -1).to(torch.bfloat16)


# ----------------------------------------------------------------------------- timing


def ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read+write, bf16 matmul flop/s), measured here."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_s = time_fn(lambda: dst.copy_(src), reps=20, graph=False)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_s = time_fn(lambda: a @ b, reps=10, graph=False)
    return 2 * 2**30 / copy_s, 2 * 8192**3 / mm_s


def replay_order(fns: list[Callable], calls: int) -> list[Callable]:
    """The calls one graph captures: fns in turn, max(calls, len(fns)) of them."""
    return [fns[i % len(fns)] for i in range(max(calls, len(fns)))]


def time_fn(
    fns: Callable | list[Callable], reps: int = 20, graph: bool = True, calls: int = 0
) -> float:
    """Median seconds per call. A list of calls (one per input set) is captured
    into one graph and replayed; the sets rotate so that L2 holds none of them.
    calls > len(fns) captures that many, cycling through the list."""
    fns = fns if isinstance(fns, list) else [fns]
    for f in fns:
        f()  # compile / initialise outside capture
    torch.cuda.synchronize()
    if graph:
        fns = replay_order(fns, calls)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):  # captured where it warmed up, as vLLM does
            for f in fns:
                f()

        def step() -> None:
            g.replay()

        per_step = len(fns)
    else:

        def step() -> None:
            fns[0]()

        per_step = 1
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / per_step)
    times.sort()
    return times[len(times) // 2]


def time_rounds(
    fns: dict[str, list[Callable]], calls: int, rounds: int, timer: Callable = time_fn
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Seconds per call of each entry, one a round, and the entries whose timing raised
    (dropped from then on). A round times every entry once; the order turns one place
    a round, so no entry always follows the same one: in one pass the same build has
    read up to ~3% apart by its place in a row (journal, Timing method). One round is
    the order given. The table and ab_sparse_mla.py both time this way."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            try:
                times[name].append(timer(fns[name], calls=calls))
            except Exception as exc:  # noqa: BLE001 - keep the row; the caller reports it
                errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return {n: v for n, v in times.items() if n not in errors}, errors


# ----------------------------------------------------------------------------- run


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm()).item()


class Case:
    """One heads x batch cell with several index sets over one big KV cache."""

    def __init__(
        self,
        h: int,
        b: int,
        kv: torch.Tensor,
        kv8: torch.Tensor | None,
        n_sets: int,
        kv_e4m3: torch.Tensor | None = None,
    ) -> None:
        self.h, self.b = h, b
        slots = kv.shape[0]
        self.kv = kv
        self.kv8 = kv8  # FlashMLA's fp8_ds_mla rows
        self.kv_e4m3 = kv_e4m3  # ours: e4m3 rows, one scale for the cache
        self.q = torch.randn(b, h, 576, device="cuda", dtype=torch.bfloat16)
        self.idx = [
            torch.randint(0, slots, (b, TOPK), device="cuda", dtype=torch.int32)
            for _ in range(n_sets)
        ]
        self.scale = 1.0 / math.sqrt(576)
        self.out = torch.empty(b, h, 512, device="cuda", dtype=torch.bfloat16)
        self.lse = torch.empty(b, h, device="cuda", dtype=torch.float32)

    def reference(self, fp8: bool = False, e4m3: bool = False) -> torch.Tensor:
        """float64 output for the first few tokens of index set 0 (bf16, FlashMLA's fp8
        or our e4m3 cache)."""
        mod = load_kernel_module()
        n = min(self.b, 4)  # a few tokens are enough to catch wrong indexing
        flat = self.idx[0][:n].reshape(-1).long()
        kv_scale = 1.0
        if e4m3:
            rows, kv_scale = self.kv_e4m3[flat], E4M3_SCALE
        else:
            rows = dequantize_fp8_ds_mla(self.kv8[flat]) if fp8 else self.kv[flat]
        idx = torch.arange(n * TOPK, dtype=torch.int32).view(n, TOPK)
        o, _ = mod.reference_sparse_mla(
            self.q[:n].cpu(), rows.cpu().view(-1, 1, 576), idx, self.scale, kv_scale
        )
        return o


@dataclasses.dataclass(frozen=True)
class Variant:
    """One column of ours: a config (None: the launch-time choice), the heads it applies
    to, the kernel module it runs from (native or the SM120 stand-in), the KV cache."""

    cfg: object | None
    applies: Callable[[int], bool]
    mod: object
    e4m3: bool = False


def ours(
    case: Case, cfg: object | None, mod: object | None = None, e4m3: bool = False
) -> tuple[list[Callable], tuple[str, str]]:
    """Calls for each index set, and (split path, build report) of the config used.

    cfg None is the launch-time choice, called as the backend calls it (no
    config, a workspace sized by max_workspace_numel). mod: a patched copy of the
    kernel module (kernel_variants.py) or the SM120 stand-in instead of the kernel
    itself. e4m3: over the e4m3 KV cache."""
    mod = mod or load_kernel_module()
    info = mod._device_info(case.q.device)
    kv = case.kv_e4m3 if e4m3 else case.kv
    kv3 = kv.view(-1, 1, 576)  # page size 1 view; any block size works
    kv_bytes = kv.element_size()
    scale = {"kv_scale": E4M3_SCALE} if e4m3 else {}
    if cfg is None:
        numel = mod.max_workspace_numel(case.b, case.h, TOPK, case.q.device, kv_bytes)
        kw: dict[str, object] = dict(scale)
        c = mod.pick_config(case.b, case.h, info, kv_bytes)
    else:
        nh = math.ceil(case.h / cfg.block_h)
        s = mod.pick_num_splits(case.b, nh, TOPK, cfg.block_n, info.num_sms, cfg.per_sm)
        numel = mod.workspace_numel(case.b, case.h, s)
        kw = {"config": cfg, **scale}
        c = cfg
    ws = torch.empty(max(1, numel), device="cuda", dtype=torch.float32)
    fns = [
        lambda i=i: mod.sparse_mla_fwd(
            case.q, kv3, i, case.scale, case.out, case.lse, workspace=ws, **kw
        )
        for i in case.idx
    ]
    build = mod._launch(
        case.q, kv3, case.idx[0], case.out, case.lse, case.scale, scale.get("kv_scale", 1.0),
        ws, c, None, info,
    )  # fmt: skip
    nh = math.ceil(case.h / c.block_h)
    s = mod.pick_num_splits(case.b, nh, TOPK, c.block_n, info.num_sms, c.per_sm)
    path = "direct" if s == 1 else "partial"
    report = build_report(build, getattr(mod, "STANDIN", ""))
    return fns, (path, f"{report} splits {s} programs {case.b * nh * s}")


BACKEND_PAGE = 64  # the backend's KV block size here (vLLM's sparse backends use 64)


def backend_path(case: Case, mod: object) -> list[Callable]:
    """The backend's own call (TRITON_MLA_SPARSE forward_mqa -> sparse_mla_topk_attention,
    fixtures/backend/backend_call.py): vLLM's remap of request positions to cache slots, then
    the kernel with one workspace reserved up front (workspace_bound), as forward_mqa
    calls it. Every token belongs to one request whose block table is the identity over
    64-row pages, so the slots it computes are case.idx and the output is ours'."""
    from fixtures.backend.backend_call import find_sparse_utils, load_backend_call

    call = load_backend_call(mod, find_sparse_utils())
    kv4 = case.kv.view(-1, BACKEND_PAGE, 576)
    table = torch.arange(kv4.shape[0], dtype=torch.int32, device="cuda").view(1, -1)
    req = torch.zeros(case.b, dtype=torch.int32, device="cuda")
    ws = torch.empty(mod.workspace_bound(case.h, TOPK, case.q.device), device="cuda")
    return [
        lambda i=i: case.out.copy_(
            call(case.q, kv4, i, req, table, BACKEND_PAGE, case.scale, workspace=ws)
        )
        for i in case.idx
    ]


def hand(case: Case, decode_fwd: Callable) -> list[Callable]:
    # vLLM 0.32 triton_mla.py: 512 tokens a split, power of 2, capped by 2*SMs.
    splits = min(
        1 << (max(1, TOPK // 512) - 1).bit_length(),
        2 * torch.cuda.get_device_properties(0).multi_processor_count,
    )
    k_buf = case.kv.view(-1, 1, 1, 576)
    v_buf = k_buf[..., :512]
    logits = torch.empty(case.b, case.h, splits, 513, device="cuda", dtype=torch.float32)
    seq = torch.full((case.b,), TOPK, device="cuda", dtype=torch.int32)
    lse = torch.empty(case.b, case.h, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return [
        lambda i=i: decode_fwd(
            case.q,
            k_buf,
            v_buf,
            case.out,
            lse,
            i,
            seq,
            logits,
            splits,
            case.scale,
            1,
            k_scale=one,
            v_scale=one,
            is_mla=True,
        )  # fmt: skip
        for i in case.idx
    ]


def flashmla_bf16(case: Case, fm: object) -> list[Callable]:
    hp = 64 if case.h <= 64 else 128  # heads padded as vLLM does on Hopper
    qp = torch.zeros(case.b, hp, 576, device="cuda", dtype=torch.bfloat16)
    qp[:, : case.h] = case.q
    kv = case.kv.view(-1, 1, 576)
    return [
        lambda i=i: fm.flash_mla_sparse_fwd(qp, kv, i.view(case.b, 1, TOPK), case.scale, 512)
        for i in case.idx
    ]


def flashmla_fp8(case: Case, fm: object) -> list[Callable]:
    hp = 64 if case.h <= 64 else 128
    qp = torch.zeros(case.b, 1, hp, 576, device="cuda", dtype=torch.bfloat16)
    qp[:, 0, : case.h] = case.q
    cache = case.kv8.view(-1, 64, 1, 656)  # block size 64, as vLLM's sparse backends use
    seqlens = torch.full((case.b,), TOPK, device="cuda", dtype=torch.int32)
    table = torch.zeros(case.b, 1, device="cuda", dtype=torch.int32)
    metas = [fm.get_mla_metadata()[0] for _ in case.idx]
    return [
        lambda i=i, m=m: fm.flash_mla_with_kvcache(
            qp,
            cache,
            table,
            seqlens,
            512,
            m,
            softmax_scale=case.scale,
            is_fp8_kvcache=True,
            indices=i.view(case.b, 1, TOPK),
        )  # fmt: skip
        for i, m in zip(case.idx, metas, strict=True)
    ]


def check(
    name: str,
    fns: list[Callable],
    out_of: Callable[[object], torch.Tensor],
    case: Case,
    ref: torch.Tensor,
    tol: float,
) -> str:
    n = ref.shape[0]
    case.out.fill_(float("nan"))
    res = fns[0]()
    torch.cuda.synchronize()
    got = out_of(res)[:n, : case.h].float().cpu()
    err = rel_err(got, ref)
    status = "ok" if err <= tol else "FAIL"
    print(f"  check {name:24s} h{case.h:<3d} b{case.b:<3d} rel_err {err:.2e} {status}", flush=True)
    return status


def sweep_variants(mod: object) -> dict[str, tuple[object, Callable[[int], bool]]]:
    """Configs timed beside the launch-time choice with --sweep: name -> (config, heads filter)."""
    cfg = mod.SparseMLAConfig
    few = lambda h: h <= 16  # noqa: E731
    mid = lambda h: h == 32  # noqa: E731
    many = lambda h: h >= 64  # noqa: E731

    def g(block_h: int, warps: int, **kw: object) -> object:
        return cfg(block_h, 64, warps, 2, per_sm=1, pdl=True, gluon=True, **kw)

    # The launch-time choice before the Gluon kernel (2026-12-01), and the runner-ups.
    return {
        "t_h16n32": (cfg(16, 32, 4, 3, pdl=True), lambda h: h <= 32),
        "t_h16n16": (cfg(16, 16, 4, 4, pdl=True), few),
        "t_h32n64": (cfg(32, 64, 8, 3, per_sm=1), mid),
        "t_h64n64": (cfg(64, 64, 8, 2, per_sm=1, idx_ahead=False), many),
        "t_h16n64": (cfg(16, 64, 8, 2), many),
        # Gluon SM90 kernel without producer warps (the choice before them, and the
        # runner-ups of the first Gluon sweep: dup = sT by both warpgroups, late =
        # next gather issued after q.kT).
        "g_h8": (g(8, 8, dup_s=True), lambda h: h <= 8),
        "g_h16": (g(16, 8), few),
        "g_h32": (g(32, 8), mid),
        "g_h64_late": (g(64, 8, late_issue=True), many),
        "g_h64_early": (g(64, 8), many),
        # Producer warps (warp-specialised): two KV buffers at 8 heads (b2, the merge
        # kernel at two splits); row sums reduced every tile at 64 heads (rs).
        "ws_h8_b2": (g(8, 8, dup_s=True, producer_warps=4), lambda h: h <= 8),
        "ws_h64_rs": (g(64, 8, producer_warps=4), many),
        # 64-head blocks with producer warps: KV-major (ws_h64) and head-major (hm_h64,
        # the launch-time choice before xchg_max and s_by_one).
        "ws_h64": (g(64, 8, producer_warps=4, sum_late=True), many),
        "hm_h64": (g(64, 8, producer_warps=4, head_major=True), lambda h: h >= 16),
        # The launch-time choice before s_by_one: head-major, row max exchanged by hand.
        "hm_xm": (g(64, 8, producer_warps=4, head_major=True, xchg_max=True), many),
        # The launch-time choices before cluster_merge: two splits merged by the merge
        # kernel (at 8 heads that is ws_h8_b2).
        "ws_h16_mk": (g(16, 8, producer_warps=4), few),
        "ws_h32_mk": (g(32, 8, producer_warps=4), mid),
        # The launch-time choices before KV-major s_by_one (variant 54): both MMA
        # warpgroups compute sT (their halves of the heads, or all at 8 heads).
        "ws_h8_cm": (g(8, 8, dup_s=True, producer_warps=4, cluster_merge=True), lambda h: h <= 8),
        "ws_h16_cm": (g(16, 8, producer_warps=4, cluster_merge=True), few),
        "ws_h32_cm": (g(32, 8, producer_warps=4, cluster_merge=True), mid),
    }


def sweep_variants_sm120(mod: object) -> dict[str, tuple[object, Callable[[int], bool]]]:
    """Small-part configs timed on the SM120 stand-in with --sm120 --sweep, each estimated
    to fit SM120's 99 KiB: name -> (config, heads filter). s_h{heads}n{rows}w{warps}s{stages},
    -p2 two programs per SM by split-K (those that fit two on SM120), -na the slots read in
    the tile's own step (no double-buffered gathers), -np without programmatic launch."""
    cfg = mod.SparseMLAConfig
    any_h = lambda h: True  # noqa: E731
    mid = lambda h: h >= 32  # noqa: E731
    shapes = {
        "s_h16n16w4s2-p2": (cfg(16, 16, 4, 2, per_sm=2, pdl=True), any_h),
        "s_h16n16w4s3": (cfg(16, 16, 4, 3, per_sm=1, pdl=True), any_h),
        "s_h16n16w4s4": (cfg(16, 16, 4, 4, per_sm=1, pdl=True), any_h),
        "s_h16n16w4s5": (cfg(16, 16, 4, 5, per_sm=1, pdl=True), any_h),
        "s_h16n32w4s2": (cfg(16, 32, 4, 2, per_sm=1, pdl=True), any_h),
        "s_h16n32w4s3": (cfg(16, 32, 4, 3, per_sm=1, pdl=True), any_h),
        "s_h16n32w8s3": (cfg(16, 32, 8, 3, per_sm=1, pdl=True), any_h),
        "s_h16n32w4s3-na": (cfg(16, 32, 4, 3, per_sm=1, pdl=True, idx_ahead=False), any_h),
        "s_h16n32w4s3-np": (cfg(16, 32, 4, 3, per_sm=1), any_h),
        "s_h16n64w4s2": (cfg(16, 64, 4, 2, per_sm=1, pdl=True), any_h),
        "s_h16n64w8s2": (cfg(16, 64, 8, 2, per_sm=1, pdl=True), any_h),
        "s_h16n16w8s3": (cfg(16, 16, 8, 3, per_sm=1, pdl=True), any_h),
        "s_h16n32w8s2": (cfg(16, 32, 8, 2, per_sm=1, pdl=True), any_h),
        "s_h32n16w8s3": (cfg(32, 16, 8, 3, per_sm=1, pdl=True), mid),
        "s_h32n16w4s3": (cfg(32, 16, 4, 3, per_sm=1, pdl=True), mid),
        "s_h32n16w4s4": (cfg(32, 16, 4, 4, per_sm=1, pdl=True), mid),
        "s_h32n16w8s4": (cfg(32, 16, 8, 4, per_sm=1, pdl=True), mid),
        "s_h32n32w4s2": (cfg(32, 32, 4, 2, per_sm=1, pdl=True), mid),
        "s_h32n32w8s2": (cfg(32, 32, 8, 2, per_sm=1, pdl=True), mid),
        "s_h32n32w8s2-na": (cfg(32, 32, 8, 2, per_sm=1, pdl=True, idx_ahead=False), mid),
        "s_h32n64w8s2": (cfg(32, 64, 8, 2, per_sm=1, pdl=True), mid),
    }
    # The SM120 Gluon family: g_h{heads}n{rows}s{stages}p{producer warps}, 4 MMA warps a 16
    # heads; -q: q held in registers; -r{n}: the producers' register cap (the fp8
    # widening keeps two tiles in flight in registers: 168 without q held, 128 with);
    # -c{n}: q.kT in n independent accumulator chains.
    for h, n, st, pw, hq, pr, ch in [
        (16, 32, 2, 4, False, 88, 1), (16, 32, 2, 4, False, 88, 2),
        (16, 32, 2, 4, False, 88, 3), (16, 32, 2, 4, False, 88, 4),
        (16, 32, 2, 4, True, 88, 1), (16, 32, 2, 4, True, 88, 3),
        (16, 32, 2, 2, True, 88, 1), (16, 32, 2, 4, False, 168, 1),
        (16, 32, 2, 4, True, 128, 1), (16, 32, 2, 4, True, 128, 3),
        (16, 32, 2, 8, False, 96, 1), (16, 32, 2, 8, False, 96, 3),
        (32, 16, 3, 4, False, 88, 3), (32, 16, 3, 4, False, 88, 1),
    ]:
        g = cfg(h, n, 4 * h // 16, st, per_sm=1, pdl=True, gluon120=True, producer_warps=pw,
                hold_q=hq, producer_regs=pr, qk_chains=ch)  # fmt: skip
        name = f"g_h{h}n{n}s{st}p{pw}" + ("-q" if hq else "") + (f"-r{pr}" if pr != 88 else "")
        shapes[name + (f"-c{ch}" if ch != 1 else "")] = (g, any_h if h == 16 else mid)
    # -k: the MMA warps split q.kT's columns (k_split) instead of s's rows (-r{n} as
    # above, for the e4m3 cache's widening producers).
    for h, n, st, pw, pr in [
        (16, 32, 2, 4, 88), (16, 32, 2, 2, 88), (16, 16, 4, 4, 88), (16, 16, 3, 4, 88),
        (32, 32, 2, 2, 88), (32, 32, 2, 4, 88), (32, 16, 3, 4, 88), (32, 16, 4, 2, 88),
        (32, 16, 3, 2, 88), (16, 32, 2, 8, 96), (16, 32, 2, 4, 168), (16, 16, 3, 8, 96),
        (32, 16, 3, 4, 128), (32, 16, 3, 8, 96),
    ]:
        g = cfg(h, n, 4 * h // 16, st, per_sm=1, pdl=True, gluon120=True, producer_warps=pw,
                producer_regs=pr, k_split=True)  # fmt: skip
        name = f"g_h{h}n{n}s{st}p{pw}-k" + (f"-r{pr}" if pr != 88 else "")
        shapes[name] = (g, any_h if h == 16 else mid)
    return {
        k: v for k, v in shapes.items() if v[0].smem_estimate() <= mod.SMALL_SMEM_BYTES
    }


def _prewarm_worker(jobs: list[tuple[str, int, int, dict[str, object]]]) -> list[str]:
    """Compile builds into Triton's on-disk cache (shared with the parent): (module kind
    'native' or 'sm120', heads, KV bytes, config fields)."""
    os.environ.pop("TRITON_INTERPRET", None)
    done = []
    caches = {
        2: torch.randn(4096, 1, 576, device="cuda", dtype=torch.bfloat16),
        1: torch.randn(4096, 1, 576, device="cuda").to(torch.float8_e4m3fn),
    }
    for kind, h, kv_bytes, fields in jobs:
        mod = load_standin() if kind == "sm120" else load_kernel_module()
        c = mod.SparseMLAConfig(**fields)  # sent as fields: the module is loaded by path
        q = torch.randn(2, h, 576, device="cuda", dtype=torch.bfloat16)
        idx = torch.randint(0, 4096, (2, TOPK), device="cuda", dtype=torch.int32)
        for splits in (1, 3):  # direct store and the partial + merge path
            try:
                mod.sparse_mla_fwd(q, caches[kv_bytes], idx, 0.04, config=c, num_splits=splits)
            except Exception as exc:  # noqa: BLE001 - reported; the main run retries it
                done.append(f"{kind} h{h} {c}: {type(exc).__name__}: {str(exc)[:200]}")
    torch.cuda.synchronize()
    return done


def prewarm(variants: dict[str, Variant], heads: list[int], tokens: list[int], procs: int) -> None:
    jobs = set()
    for h in heads:
        for v in variants.values():
            if not v.applies(h):
                continue
            kind = "sm120" if getattr(v.mod, "STANDIN", "") else "native"
            kv_bytes = 1 if v.e4m3 else 2
            if v.cfg is not None:
                jobs.add((kind, h, kv_bytes, v.cfg))
                continue
            info = v.mod._device_info(torch.device("cuda", 0))
            for t in tokens:
                jobs.add((kind, h, kv_bytes, v.mod.pick_config(t, h, info, kv_bytes)))
    ordered = [(k, h, b, dataclasses.asdict(c)) for k, h, b, c in sorted(jobs, key=repr)]
    chunks = [ordered[i::procs] for i in range(procs)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        for errs in pool.map(_prewarm_worker, [c for c in chunks if c]):
            for e in errs:
                print(f"  prewarm: {e}", flush=True)
    print(f"prewarmed {len(ordered)} (kind, heads, config) builds in {procs} processes", flush=True)


def mma_kind(build: object) -> str:
    """The MMA instruction a compiled split kernel uses: wgmma, mma (mma.sync) or ?."""
    ptx = getattr(build, "asm", {}).get("ptx", "")
    return "wgmma" if "wgmma.mma_async" in ptx else ("mma" if "mma.sync" in ptx else "?")


def build_report(build: object, standin: str = "") -> str:
    """Registers, spills, shared memory and MMA kind of a compiled split kernel; with the
    SM120 stand-in, the programs an SM120 SM holds."""
    try:
        mma = mma_kind(build)
        threads = 32 * build.metadata.num_warps
        smem = build.metadata.shared
        # Programs per SM that fit (SM90: 64K registers, 228 KiB shared, 1 KiB reserved each).
        regs8 = -(-build.n_regs // 8) * 8
        by_regs = 65536 // (regs8 * threads)
        fit = min(by_regs, (228 * 1024) // (smem + 1024))
        if standin == "sm120":
            fit = min(by_regs, sm120_blocks_per_sm(smem, threads))
        return (
            f"regs {build.n_regs} spills {build.n_spills} smem {smem} "
            f"threads {threads} per_sm {fit}{' (sm120)' if standin else ''} {mma}"
        )
    except Exception as exc:  # noqa: BLE001 - a report, not a check
        return f"no build info ({type(exc).__name__})"


def make_variants(args: argparse.Namespace, native: object) -> dict[str, Variant]:
    """The columns of ours: 'ours' (the launch-time choice; with --sm120, the stand-in's),
    with --sm120 'sm90' (this GPU's own choice), with --fp8 'ours_fp8', and --sweep's."""
    every = lambda h: True  # noqa: E731
    mod = load_standin() if args.sm120 else native
    out = {"ours": Variant(None, every, mod)}
    if args.sm120:
        out["sm90"] = Variant(None, every, native)
    if args.fp8:
        out["ours_fp8"] = Variant(None, every, mod, e4m3=True)
    if args.backend:  # cfg None and this name: the backend's call path (backend_path)
        out["backend"] = Variant(None, every, mod)
    if args.sweep:
        table = sweep_variants_sm120(mod) if args.sm120 else sweep_variants(mod)
        if args.variants:  # name patterns: time only these beside the launch-time choice
            table = {k: v for k, v in table.items() if any(fnmatch(k, p) for p in args.variants)}
        out.update({k: Variant(c, f, mod) for k, (c, f) in table.items()})
        if args.fp8 and args.sm120:  # the same shapes over the e4m3 cache (one that does
            # not fit is refused at its launch, as on SM120, and reported)
            out.update({f"{k}_fp8": Variant(c, f, mod, e4m3=True) for k, (c, f) in table.items()})
    return out


def run(args: argparse.Namespace) -> int:
    native = load_kernel_module()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    info = native._device_info(torch.device("cuda", 0))
    l2 = l2_bytes(dev)
    print(
        f"device {dev.name} sm{dev.major}{dev.minor} SMs {info.num_sms} smem {info.smem_bytes} "
        f"L2 {l2 / 1e6:.0f} MB"
    )
    tokens = [*args.batches, *args.prefill]
    variants = make_variants(args, native)
    if args.sm120:
        print(
            "SM120 stand-in: 'ours' is the kernel as SM120 runs it (mma.sync, small-part "
            "configs, SM120 residency); 'sm90' is this GPU's own path",
            flush=True,
        )
    if args.prewarm > 0:
        prewarm(variants, args.heads, tokens, args.prewarm)
    if args.wait_for is not None:  # e.g. the test run, sharing the GPU until then
        while not args.wait_for.exists():
            time.sleep(1)
    bw, mm = ceilings()
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)

    if args.no_peers:
        decode_fwd, fm = None, None
        print("peers: not timed (--no-peers)", flush=True)
    else:
        decode_fwd = load_decode_attention()
        fm, fm_status = load_flashmla()
        print(f"peers: hand={'ok' if decode_fwd else 'missing'} flashmla={fm_status}", flush=True)
        if decode_fwd is None or fm is None:  # prepared, yet not loadable here
            print(peers_error(f"a peer did not load (flashmla: {fm_status})"), file=sys.stderr)
            return 1

    slots = args.slots
    kv = torch.randn(slots, 576, device="cuda", dtype=torch.bfloat16)
    kv8 = quantize_fp8_ds_mla(kv) if fm else None
    kv_e4m3 = (kv.float() / E4M3_SCALE).to(torch.float8_e4m3fn) if args.fp8 else None

    results: dict[tuple[int, int], dict[str, float]] = {}
    failures = 0
    for h in args.heads:
        for b in tokens:
            n_sets = index_sets(b, l2)
            calls = calls_per_replay(b, n_sets)
            case = Case(h, b, kv, kv8, n_sets, kv_e4m3)
            ref = case.reference()
            ref_e4m3 = case.reference(e4m3=True) if args.fp8 else None
            row: dict[str, float] = {}
            # Everything checked first, then timed in rounds (time_rounds). Peers first:
            # with one round (the default) any drift along a row goes against ours; at
            # heavy prefill cells one build timed later in its row came out up to 9%
            # slower (2026-12-02).
            timed: dict[str, list[Callable]] = {}
            if decode_fwd is not None and b <= HAND_MAX_TOKENS:
                fns = hand(case, decode_fwd)
                if check("hand", fns, lambda r, c=case: c.out, case, ref, 1e-2) == "ok":
                    timed["hand"] = fns
            if fm is not None:
                try:
                    fns = flashmla_bf16(case, fm)
                    if check("flashmla_bf16", fns, lambda r: r[0], case, ref, 1e-2) == "ok":
                        timed["fm_bf16"] = fns
                    ref8 = case.reference(fp8=True)
                    fns = flashmla_fp8(case, fm)
                    if check("flashmla_fp8", fns, lambda r: r[0][:, 0], case, ref8, 2e-2) == "ok":
                        timed["fm_fp8"] = fns
                except Exception as exc:  # noqa: BLE001 - keep the table when a peer breaks
                    print(f"  flashmla h{h} b{b}: {type(exc).__name__}: {exc}", flush=True)
            for name, v in variants.items():
                if not v.applies(h):
                    continue
                try:
                    fns, build = ours(case, v.cfg, v.mod, v.e4m3)
                    if name == "backend":
                        fns = backend_path(case, v.mod)
                except Exception as exc:  # noqa: BLE001 - a sweep config may not build
                    print(f"  {name} h{h} b{b}: {type(exc).__name__}: {str(exc)[:300]}")
                    if v.cfg is None:
                        failures += 1
                    continue
                print(f"  build {name:18s} h{h:<3d} b{b:<4d} {build[0]:7s} {build[1]}", flush=True)
                if getattr(v.mod, "STANDIN", "") and "wgmma" in build[1]:
                    print(f"  {name} h{h} b{b}: the SM120 stand-in compiled wgmma", flush=True)
                    failures += 1
                    continue
                want, tol = (ref_e4m3, 3e-2) if v.e4m3 else (ref, 1e-2)
                if check(name, fns, lambda r: r[0] if isinstance(r, tuple) else r, case, want,
                         tol) != "ok":  # fmt: skip
                    failures += 1
                    continue
                timed[name] = fns
            runs, errors = time_rounds(timed, calls, args.rounds)
            row.update({name: statistics.median(v) for name, v in runs.items()})
            for name, err in errors.items():  # a peer's is reported; ours' counts as a failure
                print(f"  {name} h{h} b{b} timing: {err}", flush=True)
                failures += name in variants
            flops = 2 * b * h * TOPK * (576 + 512)
            qo_bytes = b * h * (576 + 512) * 2
            row["floor"] = max((gathered_bytes(b) + qo_bytes) / bw, flops / mm)
            if args.fp8:  # one byte a KV element
                row["floor_fp8"] = max((gathered_bytes(b) // 2 + qo_bytes) / bw, flops / mm)
            results[(h, b)] = row
            mine = [
                (v, k) for k, v in row.items()
                if k in variants and k not in ("sm90", "backend") and not k.endswith("fp8")
            ]  # fmt: skip
            best = min(mine) if mine else (0.0, "-")
            cells = " ".join(f"{k}={v * 1e6:.2f}" for k, v in row.items())
            print(f"  h{h} b{b} sets{n_sets} calls{calls}: {cells} best={best[1]}", flush=True)
            del case, timed

    print_table(results, bw, mm, list(variants), args.rounds)
    return 1 if failures else 0


def print_table(
    results: dict[tuple[int, int], dict[str, float]],
    bw: float,
    mm: float,
    variants: list[str],
    rounds: int = 1,
) -> None:
    timing = (
        f"median of {rounds} rounds, the order turned a place a round"
        if rounds > 1
        else "one pass a row, peers first"
    )
    us = lambda r, k: f"{r[k] * 1e6:8.1f}" if k in r else f"{'-':>8s}"  # noqa: E731
    sp = lambda r, k: f"{r[k] / r['ours']:6.2f}x" if k in r and "ours" in r else f"{'-':>7s}"  # noqa: E731
    # Three decimals: the targets are thresholds (<= 1.2x) that two would round away.
    per = lambda r, k, f: f"{r[k] / r[f]:7.3f}x" if k in r else f"{'-':>8s}"  # noqa: E731
    sm90 = any("sm90" in r for r in results.values())
    fp8 = any("floor_fp8" in r for r in results.values())
    backend = any("backend" in r for r in results.values())
    bf16 = [k for k in variants if k not in ("sm90", "backend") and not k.endswith("fp8")]
    fp8s = [k for k in variants if k.endswith("fp8")]
    print(f"\nsparse MLA, topk {TOPK}, bf16, CUDA-graph replay, us (HxT: heads x query tokens;")
    print(f"T > {HAND_MAX_TOKENS} are prefill rows); floor from copy {bw / 1e12:.2f} TB/s and "
          f"bf16 matmul {mm / 1e12:.0f} TFLOP/s; a replay is >= {REPLAY_CALLS} calls or "
          f">= {REPLAY_BYTES / 1e9:.0f} GB gathered; " + timing)  # fmt: skip
    if sm90:
        print("ours = the SM120 stand-in (mma.sync, small-part configs, SM120 residency); "
              "SM90 = this GPU's own path, same process")  # fmt: skip
    if fp8:
        print("fp8 = ours over an e4m3 KV cache; floor8 counts one byte a KV element")
    if backend:
        print("backend = the backend's call path: index remap + ours, workspace reserved once")
    head = f"{'HxT':>9s} {'ours':>8s} {'floor':>8s} {'/floor':>8s}"
    if sm90:
        head += f" {'SM90':>8s} {'/floor':>8s} {'ours/SM90':>9s}"
    if fp8:
        head += f" {'fp8':>8s} {'floor8':>8s} {'/floor8':>8s}"
    if backend:
        head += f" {'backend':>8s} {'/ours':>7s}"
    head += f" {'hand':>8s} {'FM bf16':>8s} {'FM fp8':>8s}"
    head += f" {'vs hand':>7s} {'vs bf16':>7s} {'vs fp8':>7s} {'vs FM':>7s}"
    if len(bf16) > 1:
        head += "  best variant"
    print(head)
    for (h, b), r in results.items():
        fm = [r[k] for k in ("fm_bf16", "fm_fp8") if k in r]
        if fm:
            r = {**r, "fm_best": min(fm)}
        line = f"{h:>4d}x{b:<4d} {us(r, 'ours')} {us(r, 'floor')} {per(r, 'ours', 'floor')}"
        if sm90:
            vs = f"{r['ours'] / r['sm90']:8.3f}x" if "sm90" in r and "ours" in r else f"{'-':>9s}"
            line += f" {us(r, 'sm90')} {per(r, 'sm90', 'floor')} {vs}"
        if fp8:
            line += f" {us(r, 'ours_fp8')} {us(r, 'floor_fp8')} {per(r, 'ours_fp8', 'floor_fp8')}"
        if backend:
            bo = f"{r['backend'] / r['ours']:6.3f}x" if "backend" in r and "ours" in r else "-"
            line += f" {us(r, 'backend')} {bo:>7s}"
        line += f" {us(r, 'hand')} {us(r, 'fm_bf16')} {us(r, 'fm_fp8')}"
        line += f" {sp(r, 'hand')} {sp(r, 'fm_bf16')} {sp(r, 'fm_fp8')} {sp(r, 'fm_best')}"
        for names in (bf16, fp8s):
            timed = [(r[k], k) for k in names if k in r]
            if len(names) > 1 and timed:
                best = min(timed)
                line += f"  {best[1]} {best[0] * 1e6:.1f}"
        print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["run"])
    ap.add_argument("--heads", type=int, nargs="+", default=list(HEADS))
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="decode rows")
    ap.add_argument("--prefill", type=int, nargs="*", default=list(PREFILL), help="prefill rows")
    ap.add_argument("--slots", type=int, default=SLOTS, help="KV cache rows (2M = 2.4 GB bf16)")
    ap.add_argument("--sweep", action="store_true", help="also time the candidate configs")
    ap.add_argument("--variants", nargs="*", help="with --sweep: only names matching these")
    ap.add_argument("--prewarm", type=int, default=0, help="compile builds in N processes first")
    ap.add_argument("--wait-for", type=Path, help="after compiling, wait for this file to exist")
    ap.add_argument("--no-peers", action="store_true", help="time ours alone (no peer columns)")
    ap.add_argument(
        "--sm120", action="store_true", help="ours as SM120 runs it, beside this GPU's own path"
    )
    ap.add_argument("--fp8", action="store_true", help="also ours over an e4m3 KV cache")
    ap.add_argument(
        "--backend", action="store_true", help="also the backend's call path (index remap too)"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="time each row's kernels N times in turned order"
    )
    args = ap.parse_args()
    if not 1 <= args.rounds <= 99:
        ap.error(f"--rounds must be 1..99, got {args.rounds}")
    missing = [] if args.no_peers else peers_missing()
    if missing:  # before any compile or GPU work
        print(peers_error("peers not prepared: " + ", ".join(missing)), file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_sparse_mla: error: no CUDA GPU here; `run` times on a GPU", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
