"""Run one sparse-MLA config on one cell, for a profiler (GPU machine).

  ncu --clock-control none -k regex:_sparse_mla_split -c 1 -s 2 \\
      python3 bench/kernels/profile_sparse_mla.py --heads 32 --tokens 128 --config 32,64,8,3,1

--config is block_h,block_n,num_warps,num_stages,idx_ahead[,per_sm[,gluon]]; without it
the launch-time choice runs. --peer flashmla runs FlashMLA's sparse bf16 kernel on the
same cell instead (q padded to 64 or 128 heads beforehand, as the bench does). --sm120
runs the kernel as SM120 runs it (the stand-in: mma.sync, the small-part table); with
--variant NAME, one of the bench's SM120 sweep variants (e.g. g_h16n32s2p4-c3). Three
launches: two warm-ups, then the profiled one, inside the NVTX range "profile"
(`ncu --nvtx --nvtx-include profile/` picks out its kernels).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.kernels.bench_sparse_mla import (  # noqa: E402
    Case,
    flashmla_bf16,
    load_flashmla,
    sweep_variants_sm120,
)
from fixtures.kernels.kernel_loader import load_kernel_module  # noqa: E402
from fixtures.kernels.sm120_standin import load_standin  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--config", default="")
    ap.add_argument("--slots", type=int, default=1 << 21)
    ap.add_argument("--peer", choices=["ours", "flashmla"], default="ours")
    ap.add_argument("--sm120", action="store_true", help="the SM120 stand-in's kernel")
    ap.add_argument("--variant", default="", help="an SM120 sweep variant (with --sm120)")
    args = ap.parse_args()
    mod = load_standin() if args.sm120 else load_kernel_module()
    cfg = None
    if args.variant:
        known = sweep_variants_sm120(mod)
        if not args.sm120 or args.config or args.variant not in known:
            print(f"--variant: needs --sm120, no --config, and one of {sorted(known)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        cfg = known[args.variant][0]
    if args.config:
        f = [int(x) for x in args.config.split(",")]
        cfg = mod.SparseMLAConfig(
            *f[:4],
            idx_ahead=bool(f[4]),
            per_sm=f[5] if len(f) > 5 else 2,
            gluon=bool(f[6]) if len(f) > 6 else False,
        )
    kv = torch.randn(args.slots, 1, 576, device="cuda", dtype=torch.bfloat16)
    case = Case(args.heads, args.tokens, kv, None, 3)  # fresh slots each launch: no L2 reuse
    if args.peer == "flashmla":
        fm, why = load_flashmla()
        if fm is None:
            print(f"FlashMLA: {why}", file=sys.stderr)
            return 1
        fns = flashmla_bf16(case, fm)  # q padded as the bench pads it, outside the launches
    else:
        fns = [
            lambda i=i: mod.sparse_mla_fwd(case.q, kv, i, case.scale, config=cfg)
            for i in case.idx
        ]
    for n, fn in enumerate(fns):
        torch.cuda.synchronize()
        if n == 2:
            torch.cuda.nvtx.range_push("profile")
        fn()
        if n == 2:
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
