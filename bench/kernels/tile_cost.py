"""Per-tile cost and fixed cost of the launch-time choice, from the top-k.

A cell's programs each run top-k / (64 x splits) tiles, so timing the same cell at
several top-k values gives the cost of one more tile (the slope between the two
largest) and what a call pays regardless of its tiles (the intercept at top-k 2048).
The last column times top-k 2048 with every slot -1: the same instructions with no
KV gathered, so the tile loop's own chain. Timed as bench_sparse_mla.py times (cold
L2, >= 32 calls a replay). GPU machine only:

  python3 bench/kernels/tile_cost.py --cells 8x64 32x64 8x128 32x128
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_sparse_mla as bench  # noqa: E402
from ab_sparse_mla import parse_cell  # noqa: E402

TOPKS = (512, 1024, 2048, 4096)


def time_cell(mod: object, kv: torch.Tensor, h: int, t: int, topk: int, empty: bool) -> float:
    """Median us per call of sparse_mla_fwd's launch-time choice (5 timings)."""
    n_sets = bench.index_sets(t, bench.l2_bytes(torch.cuda.get_device_properties(0)), topk)
    calls = bench.calls_per_replay(t, n_sets, topk)
    q = torch.randn(t, h, 576, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(t, h, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(t, h, device="cuda", dtype=torch.float32)
    numel = mod.max_workspace_numel(t, h, topk, q.device)
    ws = torch.empty(max(1, numel), device="cuda", dtype=torch.float32)
    idx = [
        torch.randint(0, kv.shape[0], (t, topk), device="cuda", dtype=torch.int32)
        for _ in range(n_sets)
    ]
    if empty:
        for i in idx:
            i.fill_(-1)
    fns = [lambda i=i: mod.sparse_mla_fwd(q, kv, i, 0.04, out, lse, workspace=ws) for i in idx]
    return statistics.median(bench.time_fn(fns, calls=calls) * 1e6 for _ in range(5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", type=parse_cell, required=True)
    args = ap.parse_args()
    mod = bench.load_kernel_module()
    torch.manual_seed(0)
    kv = torch.randn(bench.SLOTS, 576, device="cuda", dtype=torch.bfloat16).view(-1, 1, 576)
    info = mod._device_info(kv.device)
    cols = " ".join(f"{k:>8d}" for k in TOPKS)
    print(f"{'HxT':>9s} {'config':>22s} {cols} {'per tile':>9s} {'fixed':>7s} {'no KV':>7s}")
    for h, t in args.cells:
        us = {k: time_cell(mod, kv, h, t, k, False) for k in TOPKS}
        empty = time_cell(mod, kv, h, t, 2048, True)
        cfg = mod.pick_config(t, h, info)
        nh = math.ceil(h / cfg.block_h)
        splits = {
            k: mod.pick_num_splits(t, nh, k, cfg.block_n, info.num_sms, cfg.per_sm)
            for k in TOPKS
        }
        tiles = {k: math.ceil(math.ceil(k / splits[k]) / cfg.block_n) for k in TOPKS}
        if tiles[4096] == tiles[2048]:
            print(f"{h}x{t}: the tiles a program runs do not grow with the top-k here")
            continue
        slope = (us[4096] - us[2048]) / (tiles[4096] - tiles[2048])
        fixed = us[2048] - slope * tiles[2048]
        name = f"h{cfg.block_h} splits {splits[2048]}"
        vals = " ".join(f"{us[k]:8.1f}" for k in TOPKS)
        print(f"{h:>4d}x{t:<4d} {name:>22s} {vals} {slope:9.2f} {fixed:7.1f} {empty:7.1f}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
