"""SASS of the SM120 family's builds, and how its q·kᵀ chain is scheduled (any machine).

  python3 bench/kernels/sm120_sass.py [--arch 120 90] [--chains 1 2 3] [--out DIR]

Compiles `g120_h16n32` (16-bit cache, direct) with each qk_chains value for each
architecture with this machine's Triton and its ptxas, writes the SASS to DIR, and
prints per build: registers, HMMA and NOP counts, and the q·kᵀ section's shape (the
HMMAs before the first FMUL: how many, how many distinct accumulators, and the NOPs
between them). A NOP between two dependent HMMAs is ptxas spelling out the
accumulator's latency, so it shows whether a build's chains hide it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "fixtures" / "kernels")]

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from fixtures.kernels import sm120_fitness as fitness  # noqa: E402
from fixtures.kernels.kernel_loader import load_kernel_module  # noqa: E402

_LINE = re.compile(r"/\*([0-9a-f]{4})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9]+)[.\w]*\s*([^;]*);")


def qk_section(sass: str) -> tuple[int, int, int]:
    """(HMMAs, distinct accumulators, NOPs) from the first HMMA to the first FMUL after it."""
    hmma = nops = 0
    accs: set[str] = set()
    started = False
    for m in _LINE.finditer(sass):
        op, args = m.group(3), m.group(4)
        if op == "HMMA":
            started = True
            hmma += 1
            accs.add(args.split(",")[0].strip())
        elif started and op == "NOP":
            nops += 1
        elif started and op == "FMUL":
            break
    return hmma, len(accs), nops


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, nargs="+", default=[120, 90])
    ap.add_argument("--chains", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", type=Path, default=Path(".bench-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mod = load_kernel_module()
    base = mod._CONFIGS_SMALL["g120_h16n32"]
    print(f"{'build':24s} {'REG':>4s} {'HMMA':>5s} {'NOP':>4s}  q·kᵀ: HMMA accs NOPs")
    for arch in args.arch:
        for chains in args.chains:
            cfg = dataclasses.replace(base, qk_chains=chains)
            ce = mod._sm120_constexprs(cfg, True, False)
            kernel, use = fitness.compile_build(
                mod._sparse_mla_split_kernel_sm120, ce, {"num_warps": cfg.num_warps},
                "bf16", GPUTarget("cuda", arch, 32), GluonASTSource,
            )  # fmt: skip
            sass = fitness.cuobjdump(kernel.asm["cubin"], "-sass")
            name = f"sm{arch} c{chains}"
            (args.out / f"sass_sm{arch}_c{chains}.txt").write_text(sass)
            ops = collections.Counter(m.group(3) for m in _LINE.finditer(sass))
            h, a, n = qk_section(sass)
            counts = f"{use['REG']:4d} {ops['HMMA']:5d} {ops['NOP']:4d}"
            print(f"{name:24s} {counts}  {h:11d} {a:4d} {n:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
