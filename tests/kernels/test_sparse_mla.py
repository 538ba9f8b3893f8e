"""Correctness of the Triton sparse-MLA kernel against a float64 reference.

`make test-kernels` on a GPU machine runs this file twice: as the GPU is, and as the
SM120 stand-in (SPARSE_MLA_STANDIN=sm120, fixtures/kernels/sm120_standin.py) without the
`sm90`-marked tests, which exercise the SM90-only Gluon kernel.

The same tests run on a GPU and, at small shapes, on the CPU through
TRITON_INTERPRET=1; shapes marked `gpu` are too slow for the interpreter.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_loader import load_kernel_module
from triton.runtime.errors import OutOfResources

mod = load_kernel_module()
STANDIN = getattr(mod, "STANDIN", "")  # "sm120": the SM120 stand-in pass of make test-kernels
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
D = mod.D_QK
DV = mod.D_LATENT


def make_inputs(
    t: int,
    h: int,
    topk: int,
    dtype: torch.dtype = torch.bfloat16,
    num_blocks: int = 64,
    block_size: int = 64,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # A fresh seed per call unless one is asked for: every check sees new data.
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    q = torch.randn(t, h, D, generator=gen).to(dtype)
    kv = torch.randn(num_blocks, block_size, D, generator=gen).to(dtype)
    slots = num_blocks * block_size
    idx = torch.stack([torch.randperm(slots, generator=gen)[:topk] for _ in range(t)])
    return q.to(DEVICE), kv.to(DEVICE), idx.to(torch.int32).to(DEVICE)


def run_checked(
    q: torch.Tensor,
    kv: torch.Tensor,
    idx: torch.Tensor,
    scale: float,
    tol: float = 1e-2,
    **kw: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run on poisoned outputs and compare with the reference."""
    t, h, _ = q.shape
    out = torch.full((t, h, DV), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=q.device)
    o, l_ = mod.sparse_mla_fwd(q, kv, idx, scale, out=out, lse=lse, **kw)
    assert o.data_ptr() == out.data_ptr() and l_.data_ptr() == lse.data_ptr()
    assert not torch.isnan(out).any(), "NaN in output (unwritten or bad math)"
    assert not torch.isnan(lse).any(), "NaN in lse"
    ref_o, ref_l = mod.reference_sparse_mla(
        q.cpu(), kv.cpu(), idx.cpu(), scale, kw.get("kv_scale", 1.0)
    )
    got_o = out.cpu().double()
    got_l = lse.cpu().double()
    denom = ref_o.norm().clamp_min(1e-30)
    rel = ((got_o - ref_o).norm() / denom).item()
    assert rel <= tol, f"relative error {rel:.2e} > {tol:.0e}"
    fin = torch.isfinite(ref_l)
    assert torch.equal(fin, torch.isfinite(got_l)), "lse -inf pattern differs"
    assert torch.equal(got_l[~fin], ref_l[~fin])
    if fin.any():
        err = (got_l[fin] - ref_l[fin]).abs().max().item()
        assert err <= 1e-2, f"lse error {err:.2e}"
    return out, lse


# The CPU tier (interpreter) gets the small shapes; the GPU tier gets them all.
SMALL = [(1, 1, 64), (3, 8, 64), (1, 16, 128), (2, 3, 128)]
BIG = [
    (t, h, k)
    for t in (1, 3, 64)
    for h in (1, 8, 16, 64, 128)
    for k in (64, 2048, 4096)
    if (t, h, k) not in SMALL and t * h * k <= 64 * 128 * 2048
]


@pytest.mark.parametrize("t,h,topk", SMALL + [pytest.param(*s, marks=pytest.mark.gpu) for s in BIG])
def test_matches_reference(t: int, h: int, topk: int) -> None:
    q, kv, idx = make_inputs(t, h, topk, num_blocks=max(8, 2 * topk // 64))
    run_checked(q, kv, idx, 1.0 / math.sqrt(D))


@pytest.mark.parametrize("num_splits", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_paths_and_dtypes(num_splits: int, dtype: torch.dtype) -> None:
    # Forced split counts cover the direct store and the merge kernel.
    q, kv, idx = make_inputs(2, 4, 128, dtype=dtype, num_blocks=8)
    run_checked(
        q, kv, idx, 0.06, tol=1e-2 if dtype == torch.bfloat16 else 3e-3, num_splits=num_splits
    )


def test_merge_shape_covers_the_splits_and_columns() -> None:
    for num_splits in range(1, 257):
        block_s, block_d, warps = mod.merge_shape(num_splits)
        assert block_s >= num_splits and block_s & (block_s - 1) == 0, num_splits
        assert mod.D_LATENT % block_d == 0 and block_d >= 32, num_splits  # whole lines
        assert warps in (1, 2, 4, 8), num_splits
        # Every lane of every warp gets 4 columns of its own (no replicated elements).
        assert block_s * block_d >= warps * 32 * 4, num_splits


@pytest.mark.parametrize("num_splits", [8, 43, 128])
def test_merge_kernel_many_splits(num_splits: int) -> None:
    # 8, 43 and 128 partials a head (16-row tiles): the merge's 2-, 1- and 2-warp shapes;
    # 43 splits of 48 rows leave a ragged last split and 21 masked rows of BLOCK_S 64.
    q, kv, idx = make_inputs(1, 2, 2048, num_blocks=64)
    run_checked(q, kv, idx, 0.05, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_skipped_slots(num_splits: int) -> None:
    t, h, topk = 4, 8, 128
    q, kv, idx = make_inputs(t, h, topk, num_blocks=8)
    idx[0] = -1  # nothing to attend to: zeros and lse -inf
    idx[1, 3::2] = -1  # some holes
    idx[2, 1:] = -1  # a single valid slot
    idx[3, : topk // 2] = -1  # a whole split empty
    out, lse = run_checked(q, kv, idx, 0.05, num_splits=num_splits)
    assert torch.all(out[0] == 0)
    assert torch.all(torch.isneginf(lse[0]))
    assert torch.isfinite(lse[1:]).all()


def test_repeated_indices() -> None:
    q, kv, idx = make_inputs(2, 8, 64, num_blocks=4)
    idx[:, 32:] = idx[:, :32]  # each slot twice: counted twice, like the reference
    idx[1, :] = idx[1, 5]
    run_checked(q, kv, idx, 0.05)


@pytest.mark.parametrize("block_size", [1, 16])
def test_layouts(block_size: int) -> None:
    # [blocks, block_size, 1, 576] views and a cache whose blocks are padded
    # (stride(0) > block_size * 576), as when the cache is a slice of a buffer.
    t, h, topk = 2, 8, 64
    q, _, idx = make_inputs(t, h, topk, num_blocks=1, block_size=64)
    num_blocks = 256 // block_size
    big = torch.randn(num_blocks, block_size + 1, 1, D).to(torch.bfloat16).to(DEVICE)
    kv = big[:, :block_size]
    idx = torch.randint(0, num_blocks * block_size, (t, topk), dtype=torch.int32, device=DEVICE)
    run_checked(q, kv, idx, 0.05)


def test_workspace_and_rejects() -> None:
    q, kv, idx = make_inputs(1, 8, 128, num_blocks=8)
    ws = torch.empty(mod.workspace_numel(1, 8, 2), dtype=torch.float32, device=DEVICE)
    run_checked(q, kv, idx, 0.05, num_splits=2, workspace=ws)
    # The launch-time choice must fit the advertised worst-case workspace.
    ws_max = torch.empty(mod.max_workspace_numel(1, 8, 128, q.device), device=DEVICE)
    run_checked(q, kv, idx, 0.05, workspace=ws_max)
    with pytest.raises(ValueError, match="workspace"):
        mod.sparse_mla_fwd(q, kv, idx, 0.05, num_splits=2, workspace=ws[:10])
    with pytest.raises(ValueError, match="dtype"):
        mod.sparse_mla_fwd(q, kv.half(), idx, 0.05)
    with pytest.raises(ValueError, match="int32"):
        mod.sparse_mla_fwd(q, kv, idx.long(), 0.05)


@pytest.mark.parametrize("smem,sms", [(101376, 188), (232448, 132)])  # RTX PRO 6000, H200
@pytest.mark.parametrize("t,h", [(1, 1), (1, 8), (16, 32), (16, 64), (128, 32), (128, 128)])
def test_config_choice_fits_and_fills(smem: int, sms: int, t: int, h: int) -> None:
    info = mod.DeviceInfo(num_sms=sms, smem_bytes=smem)
    for kv_bytes in (1, 2):
        cfgs = mod.candidate_configs(t, h, info, kv_bytes)
        assert all(c.smem_estimate(kv_bytes) <= smem for c in cfgs)
    cfg = mod.pick_config(t, h, info)
    nh = math.ceil(h / cfg.block_h)
    s = mod.pick_num_splits(t, nh, 2048, cfg.block_n, info.num_sms, cfg.per_sm)
    assert 1 <= s <= 2048 // cfg.block_n
    # Enough programs to cover half the SMs whenever top-k can be cut that
    # finely (rounding the wave down may leave up to half a wave idle).
    assert t * nh * s >= min(info.num_sms // 2, t * nh * (2048 // cfg.block_n))


@pytest.mark.parametrize(
    "info",
    [
        mod.DeviceInfo(num_sms=188, smem_bytes=101376, major=12),  # RTX PRO 6000
        mod.DeviceInfo(num_sms=132, smem_bytes=232448, major=9),  # H100/H200
    ],
    ids=["sm120", "sm90"],
)
@pytest.mark.parametrize("h,kv_bytes", [(8, 2), (16, 2), (32, 2), (128, 2), (8, 1), (32, 1)])
def test_workspace_bound_serves_every_batch(info: object, h: int, kv_bytes: int) -> None:
    # The backend reserves workspace_bound once; every batch size and every candidate
    # config (the launch may fall back to any of them) must fit in it.
    bound = mod._workspace_bound(h, 2048, info, kv_bytes)
    need = 0
    for t in [*range(1, 600), 1024, 4096, 8192]:
        for cfg in mod.candidate_configs(t, h, info, kv_bytes):
            nh = math.ceil(h / cfg.block_h)
            s = mod.pick_num_splits(t, nh, 2048, cfg.block_n, info.num_sms, cfg.per_sm)
            need = max(need, mod.workspace_numel(t, h, s))
    assert 0 < need == bound


@pytest.mark.gpu
def test_fp8_kv() -> None:
    q, kv, idx = make_inputs(3, 16, 2048, num_blocks=64)
    scale = float(kv.float().abs().amax()) / 448.0
    kv8 = (kv.float() / scale).to(torch.float8_e4m3fn)
    out, _ = run_checked(q, kv8, idx, 1.0 / math.sqrt(D), tol=2e-2, kv_scale=scale)


@pytest.mark.gpu
def test_cuda_graph_replay() -> None:
    q, kv, idx = make_inputs(4, 8, 2048, num_blocks=64)
    out = torch.empty(4, 8, DV, dtype=q.dtype, device=DEVICE)
    lse = torch.empty(4, 8, dtype=torch.float32, device=DEVICE)
    numel = mod.max_workspace_numel(4, 8, 2048, q.device)
    ws = torch.empty(numel, dtype=torch.float32, device=DEVICE)
    mod.sparse_mla_fwd(q, kv, idx, 0.05, out=out, lse=lse, workspace=ws)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.sparse_mla_fwd(q, kv, idx, 0.05, out=out, lse=lse, workspace=ws)
    q2, kv2, idx2 = make_inputs(4, 8, 2048, num_blocks=64)
    q.copy_(q2)
    kv.copy_(kv2)
    idx.copy_(idx2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_o, _ = mod.reference_sparse_mla(q, kv, idx, 0.05)
    rel = ((out.double() - ref_o).norm() / ref_o.norm()).item()
    assert rel <= 1e-2


@pytest.mark.parametrize(
    "cfg",
    [
        mod.SparseMLAConfig(16, 16, 4, 4),
        mod.SparseMLAConfig(16, 32, 4, 3, idx_ahead=False),
        mod.SparseMLAConfig(32, 64, 8, 3, per_sm=1),
        mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, idx_ahead=False),
    ],
    ids=repr,
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_forced_configs(cfg: object, num_splits: int) -> None:
    # Every loop variant, with head blocks that overhang H and a ragged last split.
    q, kv, idx = make_inputs(2, 20, 192, num_blocks=8)
    idx[1, 64:100] = -1
    if STANDIN and cfg.smem_estimate() > mod.SMALL_SMEM_BYTES:  # refused as on SM120
        with pytest.raises(OutOfResources):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)
        return
    run_checked(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)


# Both MMA warpgroups on sT (the launch-time choices before KV-major s_by_one).
WS_CM_CFGS = [
    mod.SparseMLAConfig(h, 64, 8, 2, per_sm=1, pdl=True, gluon=True, dup_s=h == 8,
                        producer_warps=4, cluster_merge=True)
    for h in (8, 16, 32)
]

# Listed options and every launch-time Gluon config, each once.
GLUON_CFGS = list(dict.fromkeys([
    mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, gluon=True),
    mod.SparseMLAConfig(16, 64, 4, 2, per_sm=1, gluon=True),
    mod.SparseMLAConfig(32, 64, 8, 2, per_sm=1, gluon=True),
    mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True),
    mod.SparseMLAConfig(32, 64, 8, 2, per_sm=1, gluon=True, dup_s=True, late_issue=True),
    mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, pdl=True, gluon=True, late_issue=True),
    mod.SparseMLAConfig(64, 64, 16, 2, per_sm=1, gluon=True),
    mod.SparseMLAConfig(8, 64, 8, 2, per_sm=1, pdl=True, gluon=True, dup_s=True),
    # Warp-specialised: producer warps gather, mbarrier handshakes with the MMA warps.
    mod.SparseMLAConfig(8, 64, 8, 3, per_sm=1, pdl=True, gluon=True, dup_s=True, producer_warps=4,
                        producer_regs=88),
    mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4,
                        producer_regs=64),
    mod.SparseMLAConfig(32, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4, producer_regs=64),
    mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4, producer_regs=48),
    mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4,
                        sum_late=True),
    mod.SparseMLAConfig(32, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4),
    mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4,
                        head_major=True),
    # The row max across the warpgroups through one store and one barrier (xchg_max).
    mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4,
                        head_major=True, xchg_max=True),
    # One warpgroup computes s and the softmax, the other only half of o (s_by_one).
    mod.SparseMLAConfig(64, 64, 4, 2, per_sm=1, pdl=True, gluon=True, producer_warps=4,
                        head_major=True, s_by_one=True),
    # A token's two splits as a 2-CTA cluster, merged through distributed shared memory.
    mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4,
                        cluster_merge=True),
    *(c for c in mod._CONFIGS_BIG.values() if c.gluon),  # the launch-time choices
    *WS_CM_CFGS,
]))

# The launch-time choices at 8, 16 and 32 heads from 32 tokens, and the ones before them.
CLUSTER_CFGS = list(dict.fromkeys(
    [*(mod._CONFIGS_BIG[n] for n in ("ws_h8", "ws_h16", "ws_h32")), *WS_CM_CFGS]
))


@pytest.mark.sm90
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CLUSTER_CFGS, ids=repr)
@pytest.mark.parametrize("topk", [2048, 448])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cluster_merge(cfg: object, topk: int, dtype: torch.dtype) -> None:
    # Two splits merged in the split kernel: token 0's second split has no valid slot,
    # token 2 none at all (o = 0, lse = -inf), token 1 holes; heads below the block's.
    h = max(8, cfg.block_h - 4)
    q, kv, idx = make_inputs(5, h, topk, dtype=dtype, num_blocks=max(8, 2 * topk // 64))
    idx[0, topk // 2 :] = -1
    idx[1, 64:100] = -1
    idx[2, :] = -1
    if torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(ValueError, match="SM90"):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=2)
        return
    tol = 3e-3 if dtype == torch.float16 else 1e-2
    run_checked(q, kv, idx, 0.05, tol=tol, config=cfg, num_splits=2)


def make_moving_max_inputs(
    h: int, topk: int = 2048, scale: float = 0.05, seed: int = 7
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four tokens whose scores (natural log units, times 1 + head / h per head) move
    across the tiles by more than exp2 can span (2^128), so that the lazy running max of
    the KV-major s_by_one loop has to move after its first tile: 0 rises by 200 over the
    top-k, 1 falls by 200, 2 is noise with +120 spikes late in each split, 3 rises with
    masked runs. Each token's rows are its own slots; k = u * score / scale along the
    token's q direction u, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    t = 4
    u = torch.randn(t, D, generator=gen)
    u = u / u.norm(dim=1, keepdim=True)
    pos = torch.arange(topk, dtype=torch.float64) / topk
    target = torch.stack([
        200 * pos,
        200 * (1 - pos),
        torch.randn(topk, generator=gen, dtype=torch.float64),
        200 * pos,
    ])
    for half in (0, 1):  # spikes in the last tiles of each half of the top-k
        at = half * topk // 2 + topk // 2 - 1 - torch.randperm(topk // 4, generator=gen)[:3]
        target[2, at] += 120
    q = u[:, None, :] * (1 + torch.arange(h) / h)[None, :, None]
    k = u[:, None, :] * (target / scale)[:, :, None].float()
    k = k + 0.3 * torch.randn(t, topk, D, generator=gen)
    kv = k.reshape(t * topk // 64, 64, D).to(torch.bfloat16)
    idx = torch.arange(t)[:, None] * topk + torch.arange(topk)[None, :]
    idx[3, topk // 4 : topk // 4 + 200] = -1
    idx[3, 3 * topk // 4 :: 7] = -1
    return q.to(torch.bfloat16).to(DEVICE), kv.to(DEVICE), idx.to(torch.int32).to(DEVICE)


@pytest.mark.sm90
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ws_h8", "ws_h16", "ws_h32"])
@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_kv_major_lazy_max_follows_moving_scores(name: str, num_splits: int) -> None:
    # KV-major s_by_one keeps its running max until a score rises LAZY_MAX_SLACK above
    # it: scores that rise, fall and spike across the tiles (and heads scaled apart, so
    # one head moves its max while another does not) must still match the reference.
    cfg = mod._CONFIGS_BIG[name]
    h = max(8, cfg.block_h - 2)
    q, kv, idx = make_moving_max_inputs(h)
    if torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(ValueError, match="SM90"):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)
        return
    run_checked(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)


@pytest.mark.sm90
@pytest.mark.gpu
def test_cluster_merge_without_cluster_launch_uses_the_merge_kernel(monkeypatch) -> None:
    # A Triton whose compiled kernels lack the launch metadata: same results, merge kernel.
    monkeypatch.setattr(mod, "_launch_in_pairs", lambda *a: False)
    q, kv, idx = make_inputs(3, 16, 2048, num_blocks=64)
    idx[1, 64:100] = -1
    if torch.cuda.get_device_capability()[0] != 9:  # SM90 only: refused elsewhere
        with pytest.raises(ValueError, match="SM90"):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=mod._CONFIGS_BIG["ws_h16"])
        return
    run_checked(q, kv, idx, 0.05, config=mod._CONFIGS_BIG["ws_h16"], num_splits=2)


def exchange_inputs(
    block_h: int, seed: int = 11
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs that stress the cluster exchange's precision (also modelled on the CPU by
    bench/kernels/exchange_precision.py): 6 tokens of BLOCK_H - 2 heads (at least 8),
    topk 2048 with a hole, latent columns scaled 1e-3..1e3 apart, head scales 1-5x."""
    h = max(8, block_h - 2)
    gen = torch.Generator().manual_seed(seed)
    q, kv, idx = make_inputs(6, h, 2048, num_blocks=256, seed=seed)
    cols = torch.logspace(-3, 3, D, dtype=torch.float64)[torch.randperm(D, generator=gen)]
    kv = (kv.double() * cols.to(kv.device)).to(kv.dtype)
    head_scale = (1 + torch.arange(h, device=q.device) % 5)[None, :, None]
    q = (q.float() * head_scale / cols.to(q.device).float().clamp_min(1.0)).to(q.dtype)
    idx[1, 100:900] = -1
    return q, kv, idx


EXCHANGE_BOUND = 2.0**-7  # 2 bf16 ulps (at least one), or 1e-6 of the column's largest


def exchange_rel(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exchange test's measure of o a against o b [T, H, 512]: |a - b| over |b| plus
    1e-6 / EXCHANGE_BOUND of b's latent column's largest (so values at or under 1e-6 of
    that may differ by 1e-6 of it), and that largest per column."""
    a, b = a.double(), b.double()
    col_max = b.abs().amax(dim=(0, 1), keepdim=True)
    return (a - b).abs() / (b.abs() + 1e-6 / EXCHANGE_BOUND * col_max), col_max


@pytest.mark.sm90
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ws_h8", "ws_h16", "ws_h32"])
def test_cluster_exchange_keeps_each_value_to_bf16(monkeypatch, name: str) -> None:
    # The cluster exchange carries each split's half of o, not yet divided by l, between
    # the pair. With latent columns scaled 1e-3..1e3 apart and heads' score scales 1-5x
    # apart (row sums up to ~2^10 apart), every output value must stay within 2 bf16 ulps
    # of the merge kernel's (fp32 partials) or within 1e-6 of its column's largest. The
    # fp32 exchange meets it; the fp16 one with a power-of-two scale a 16-register pack
    # (journal, variant 77) failed at values ~1.4e-4 of their column's largest, and by the
    # CPU model (bench/kernels/exchange_precision.py) any format with under ~17 mantissa
    # bits fails it, whatever its scales: values that are small after the two splits'
    # halves cancel.
    cfg = mod._CONFIGS_BIG[name]
    q, kv, idx = exchange_inputs(cfg.block_h)
    if torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(ValueError, match="SM90"):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=2)
        return
    o_c, lse_c = mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=2)
    monkeypatch.setattr(mod, "_launch_in_pairs", lambda *a: False)
    o_m, lse_m = mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=2)
    rel, col_max = exchange_rel(o_c, o_m)
    worst = rel.argmax()
    assert rel.max().item() <= EXCHANGE_BOUND, (
        f"cluster vs merge kernel: {rel.max().item():.2e} relative at a value"
        f" {(o_m.double().abs() / col_max).flatten()[worst].item():.1e} of its column's largest"
    )
    assert torch.allclose(lse_c, lse_m, rtol=0, atol=1e-4)


@pytest.mark.parametrize("h", [8, 16, 32])
def test_sm90_batch64_merges_in_clusters(h: int) -> None:
    # 64 tokens of 8-32 heads on 132 SMs: one head block, two splits, cluster_merge, and
    # KV-major s_by_one (one warpgroup computes sT, each half of oT).
    info = mod.DeviceInfo(num_sms=132, smem_bytes=232448, major=9)
    cfg = mod.candidate_configs(64, h, info)[0]
    if not mod._HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    assert cfg.cluster_merge and math.ceil(h / cfg.block_h) == 1
    assert cfg.s_by_one and not cfg.head_major and cfg.num_warps == 4
    assert mod.pick_num_splits(64, 1, 2048, cfg.block_n, 132, cfg.per_sm) == 2
    assert cfg.smem_estimate() <= info.smem_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("t,h", [(8, 64), (12, 128)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_launch_choice_fp16_many_heads(t: int, h: int, num_splits: int) -> None:
    # The 64-head launch choice in fp16 (on SM90 s_by_one: o staged through q's buffer in
    # q's dtype, or fp32 partials), with holes and an empty tail.
    q, kv, idx = make_inputs(t, h, 512, dtype=torch.float16, num_blocks=16)
    idx[1, 64:100] = -1
    idx[0, 256:] = -1
    run_checked(q, kv, idx, 0.05, tol=3e-3, num_splits=num_splits)


@pytest.mark.sm90
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GLUON_CFGS, ids=repr)
@pytest.mark.parametrize(
    "t,h,topk,num_splits",
    [(2, 20, 200, 1), (2, 20, 448, 3), (3, 64, 2048, 4), (3, 20, 2048, 2), (5, 64, 2048, 4),
     (2, 8, 448, 7)],
)
def test_gluon_sm90(cfg: object, t: int, h: int, topk: int, num_splits: int) -> None:
    # Head blocks that overhang H, a ragged last tile, holes, an empty tail, page size 64.
    q, kv, idx = make_inputs(t, h, topk, num_blocks=max(8, 2 * topk // 64))
    idx[1, 64:100] = -1
    idx[0, topk // 2 :] = -1
    if torch.cuda.get_device_capability()[0] != 9:  # SM90 only: refused elsewhere
        with pytest.raises(ValueError, match="SM90"):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg)
        return
    run_checked(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)


# The SM120 Gluon family (mma.sync, producer warps, mbarrier stages): every shape the
# sweep times and the table launches. It runs on SM90 too, so both passes test it.
SM120_CFGS = list(dict.fromkeys([
    mod.SparseMLAConfig(h, n, 4 * h // 16, st, per_sm=1, pdl=True, gluon120=True,
                        producer_warps=pw, hold_q=hq, qk_chains=ch)
    for h, n, st, pw, hq, ch in [
        (16, 32, 2, 2, False, 1), (16, 16, 4, 2, False, 1), (16, 16, 3, 4, False, 1),
        (32, 16, 3, 2, False, 1), (32, 32, 2, 4, False, 1), (16, 32, 2, 4, True, 1),
        (16, 32, 2, 2, True, 1), (16, 32, 2, 8, False, 1), (16, 32, 2, 4, False, 2),
        (16, 32, 2, 4, False, 3), (16, 32, 2, 4, True, 4), (32, 16, 3, 4, False, 3),
    ]
] + [
    # k_split: the MMA warps split q.kT's columns (16 and 32 heads, 16- and 32-row tiles)
    mod.SparseMLAConfig(h, n, 4 * h // 16, st, per_sm=1, pdl=True, gluon120=True,
                        producer_warps=pw, k_split=True)
    for h, n, st, pw in [(16, 32, 2, 2), (16, 16, 4, 4), (32, 32, 2, 2), (32, 16, 4, 2)]
] + [c for c in mod._CONFIGS_SMALL.values() if c.gluon120]))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SM120_CFGS, ids=repr)
@pytest.mark.parametrize(
    "t,h,topk,num_splits",
    [(2, 20, 200, 1), (2, 20, 448, 3), (3, 32, 2048, 4), (3, 8, 2048, 2), (2, 8, 448, 7),
     (1, 16, 2048, 64)],
)
def test_gluon_sm120(cfg: object, t: int, h: int, topk: int, num_splits: int) -> None:
    # Head blocks that overhang H, a ragged last tile, holes, an empty tail, page size 64,
    # and splits of one tile (a lone token's split-K).
    q, kv, idx = make_inputs(t, h, topk, num_blocks=max(8, 2 * topk // 64))
    idx[-1, 64:100] = -1
    idx[0, topk // 2 :] = -1
    if STANDIN and cfg.smem_estimate() > mod.SMALL_SMEM_BYTES:  # refused as on SM120
        with pytest.raises(OutOfResources):
            mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)
        return
    run_checked(q, kv, idx, 0.05, config=cfg, num_splits=num_splits)


# Over an e4m3 cache the producers widen the rows through registers: the table's build,
# and builds whose producers have fewer warps or a stage more, into row-split and
# K-split stages (16 and 32 heads, 16- and 32-row tiles).
SM120_FP8_CFGS = list(dict.fromkeys([
    mod.SparseMLAConfig(h, n, 4 * h // 16, st, per_sm=1, pdl=True, gluon120=True,
                        producer_warps=pw, producer_regs=pr, hold_q=hq, qk_chains=ch,
                        k_split=ks)
    for h, n, st, pw, pr, hq, ch, ks in [
        (16, 32, 2, 2, 168, False, 1, False), (16, 16, 3, 4, 168, False, 1, False),
        (32, 16, 2, 4, 168, False, 1, False), (16, 32, 2, 4, 168, False, 1, False),
        (16, 32, 2, 4, 128, True, 1, False), (16, 32, 2, 8, 96, False, 3, False),
        (16, 32, 2, 8, 96, False, 1, True), (16, 16, 3, 8, 96, False, 1, True),
        (32, 16, 3, 4, 88, False, 1, True), (32, 32, 2, 4, 168, False, 1, True),
    ]
] + [c for k, c in mod._CONFIGS_SMALL.items() if c.gluon120 and k.endswith("_fp8")]))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SM120_FP8_CFGS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "t,h,topk,num_splits",
    [(2, 20, 448, 3), (3, 8, 2048, 2), (2, 8, 448, 7), (1, 16, 2048, 64)],
)
def test_gluon_sm120_fp8(
    cfg: object, dtype: torch.dtype, t: int, h: int, topk: int, num_splits: int
) -> None:
    q, kv, idx = make_inputs(t, h, topk, dtype=dtype, num_blocks=max(8, 2 * topk // 64))
    idx[-1, 64:100] = -1
    idx[0, topk // 2 :] = -1
    scale = float(kv.float().abs().amax()) / 448.0
    kv8 = (kv.float() / scale).to(torch.float8_e4m3fn)
    if STANDIN and cfg.smem_estimate(1) > mod.SMALL_SMEM_BYTES:  # refused as on SM120
        with pytest.raises(OutOfResources):
            mod.sparse_mla_fwd(q, kv8, idx, 0.05, config=cfg, num_splits=num_splits)
        return
    run_checked(q, kv8, idx, 0.05, tol=2e-2, config=cfg, num_splits=num_splits, kv_scale=scale)


@pytest.mark.parametrize(
    "cfg",
    [
        mod.SparseMLAConfig(8, 16, 4, 2, gluon120=True, producer_warps=2),  # 16-head groups
        mod.SparseMLAConfig(16, 64, 4, 2, gluon120=True, producer_warps=2),  # 64 rows: no fit
        mod.SparseMLAConfig(32, 16, 4, 2, gluon120=True, producer_warps=2),  # 4 warps a group
        mod.SparseMLAConfig(16, 16, 4, 2, gluon120=True),  # no producer warps
        # k_split holds only its slice of q and sums one accumulator chain
        mod.SparseMLAConfig(16, 32, 4, 2, gluon120=True, producer_warps=4, k_split=True,
                            hold_q=True),
        mod.SparseMLAConfig(16, 32, 4, 2, gluon120=True, producer_warps=4, k_split=True,
                            qk_chains=2),
    ],
    ids=repr,
)
def test_sm120_config_without_a_build_is_refused(cfg: object) -> None:
    q, kv, idx = make_inputs(8, 16, 128, num_blocks=8)
    with pytest.raises(ValueError, match="no SM120 Gluon sparse-MLA build"):
        mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        mod.SparseMLAConfig(16, 32, 8, 2, per_sm=1, gluon=True),  # wgmma's M is 64 rows
        mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, gluon=True, head_major=True),
        # The hand-rolled row-max exchange exists only in the head-major loop.
        mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4, xchg_max=True),
        # s_by_one: one-warpgroup partitions (num_warps 4) beside producer warps;
        # KV-major up to 32 heads (oT halves of [256, heads] in registers).
        mod.SparseMLAConfig(64, 64, 4, 2, per_sm=1, gluon=True, producer_warps=4,
                            s_by_one=True),
        mod.SparseMLAConfig(16, 64, 4, 2, per_sm=1, gluon=True, s_by_one=True),
        mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4,
                            s_by_one=True),
        mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4,
                            head_major=True, s_by_one=True),
        # cluster_merge: KV-major with producer warps, 8 MMA warps, up to 32 heads.
        mod.SparseMLAConfig(16, 64, 8, 2, per_sm=1, gluon=True, cluster_merge=True),
        mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4,
                            cluster_merge=True),
        mod.SparseMLAConfig(64, 64, 8, 2, per_sm=1, gluon=True, producer_warps=4,
                            head_major=True, cluster_merge=True),
    ],
    ids=repr,
)
def test_gluon_config_without_a_build_is_refused(cfg: object) -> None:
    # Refused for its shape on any machine (before the SM90 check), never run as another.
    q, kv, idx = make_inputs(8, 16, 128, num_blocks=8)
    with pytest.raises(ValueError, match="no Gluon sparse-MLA build"):
        mod.sparse_mla_fwd(q, kv, idx, 0.05, config=cfg)


@pytest.mark.parametrize("t,h", [(8, 8), (16, 16), (128, 32), (16, 64), (1024, 128), (1, 128)])
def test_sm90_picks_gluon(t: int, h: int) -> None:
    # On SM90 the Gluon kernel is the first choice from 8 tokens (and for a lone
    # token of many heads), with Triton configs behind it as fallbacks.
    info = mod.DeviceInfo(num_sms=132, smem_bytes=232448, major=9)
    cfgs = mod.candidate_configs(t, h, info)
    assert cfgs[0].gluon == mod._HAS_GLUON
    assert any(not c.gluon for c in cfgs)
    assert all(c.smem_estimate() <= info.smem_bytes for c in cfgs)
    if cfgs[0].gluon:
        assert cfgs[0].block_h >= min(h, 64) or t < 8
    # Not on other parts, nor for fp8 KV.
    assert not any(c.gluon for c in mod.candidate_configs(t, h, info, kv_bytes=1))
    sm120 = mod.DeviceInfo(num_sms=188, smem_bytes=101376, major=12)
    assert not any(c.gluon for c in mod.candidate_configs(t, h, sm120))


@pytest.mark.parametrize("t", [1, 2, 64, 4096])
@pytest.mark.parametrize("h", [8, 16, 32, 64])
def test_sm120_picks_its_family(t: int, h: int) -> None:
    # The SM120 family wherever the stand-in measured it ahead: 16-bit KV from two tokens
    # up to 32 heads as K-split builds (16- and 32-head blocks), a lone token of up to 16
    # heads (32 x 1 stays on h16_n32), an e4m3 cache up to 32 heads (K-split stages
    # from two tokens); the Triton configs stay behind it.
    sm120 = mod.DeviceInfo(num_sms=188, smem_bytes=101376, major=12)
    has = mod._HAS_GLUON_SM120
    bf16 = mod.candidate_configs(t, h, sm120)
    assert (bf16[0] == mod._CONFIGS_SMALL["g120_h16n32_k"]) == (has and t >= 2 and h <= 16)
    k32 = has and t >= 2 and 16 < h <= 32
    assert (bf16[0] == mod._CONFIGS_SMALL["g120_h32n16_k"]) == k32
    want = has and ((h <= 16 and t == 1) or (t >= 2 and h > 32 and t < 16))
    assert (bf16[0] == mod._CONFIGS_SMALL["g120_h16n32"]) == want
    fp8 = mod.candidate_configs(t, h, sm120, kv_bytes=1)
    assert (fp8[0] == mod._CONFIGS_SMALL["g120_h16n32_fp8"]) == (has and h <= 32 and t == 1)
    assert (fp8[0] == mod._CONFIGS_SMALL["g120_h16n32_k_fp8"]) == (has and h <= 16 and t >= 2)
    assert (fp8[0] == mod._CONFIGS_SMALL["g120_h32n16_k"]) == k32
    assert any(not c.gluon120 for c in (*bf16, *fp8))
    # Not on a 99 KiB part of compute capability 8 (no mbarrier try_wait there).
    sm86 = mod.DeviceInfo(num_sms=84, smem_bytes=101376, major=8)
    for kv_bytes in (1, 2):
        assert not any(c.gluon120 for c in mod.candidate_configs(t, h, sm86, kv_bytes))


# Batch 1 (Triton split + merge), 16 tokens (Gluon split-K + merge), 64 (2-CTA clusters),
# 128 (one split): every path the split kernel takes as a programmatic dependent.
PDL_CELLS = [(1, 16), (16, 8), (64, 32), (128, 8)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "t,h", [*PDL_CELLS, pytest.param(1, 64, marks=pytest.mark.sm90)]  # 64 x 1: no pdl on SM90
)
def test_split_kernel_launches_as_a_programmatic_dependent(t: int, h: int) -> None:
    q, kv, idx = make_inputs(t, h, 2048, num_blocks=64)
    info = mod._device_info(q.device)
    cfg = mod.pick_config(t, h, info)
    out = torch.empty(t, h, DV, dtype=q.dtype, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    ws = torch.empty(mod.max_workspace_numel(t, h, 2048, q.device), device=q.device)
    build = mod._launch(q, kv, idx, out, lse, 0.05, 1.0, ws, cfg, None, info)
    want = cfg.pdl and torch.cuda.get_device_capability()[0] >= 9 and mod._HAS_GDC
    assert (t, h) != (1, 64) or not want, "64 x 1 was to check a config without pdl"
    assert bool(getattr(build.metadata, "launch_pdl", False)) == want
    # ... and then it waits for the grid before it before touching memory.
    assert ("griddepcontrol.wait" in build.asm["ptx"]) == want


@pytest.mark.gpu
@pytest.mark.parametrize("t,h", PDL_CELLS)
def test_back_to_back_calls_in_a_graph_see_each_others_writes(t: int, h: int) -> None:
    # Each call reads the q that the kernel before it wrote (a copy captured between the
    # calls) and writes an output the next copy reads: were a split kernel to touch
    # memory before the grid before it completes, the chain would see stale data.
    n = 4
    q0, kv, idx = make_inputs(t, h, 2048, num_blocks=64)
    qs = [q0.clone() for _ in range(n)]
    outs = [torch.empty(t, h, DV, dtype=q0.dtype, device=q0.device) for _ in range(n)]
    lses = [torch.empty(t, h, dtype=torch.float32, device=q0.device) for _ in range(n)]
    ws = torch.empty(mod.max_workspace_numel(t, h, 2048, q0.device), device=q0.device)

    def chain() -> None:
        for i in range(n):
            if i:  # q of call i: q0 plus a tenth of call i-1's output (its latent part)
                qs[i][..., :DV].copy_(q0[..., :DV] + 0.1 * outs[i - 1])
            mod.sparse_mla_fwd(qs[i], kv, idx, 0.05, outs[i], lses[i], workspace=ws)

    chain()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        chain()
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    q_ref = q0.cpu()
    for i in range(n):
        if i:
            q_ref = q0.cpu().clone()
            q_ref[..., :DV] = (q0[..., :DV].cpu().float() + 0.1 * outs[i - 1].cpu().float()).to(
                q0.dtype
            )
        ref_o, _ = mod.reference_sparse_mla(q_ref, kv.cpu(), idx.cpu(), 0.05)
        got = outs[i].cpu().double()
        rel = ((got - ref_o).norm() / ref_o.norm()).item()
        assert rel <= 1e-2, f"call {i}: relative error {rel:.2e}"
