"""Compile the Gluon (SM90) sparse-MLA builds for sm_90 without a GPU and read their resources.

    python3 bench/kernels/sm90_resources.py [VARIANT ...]   # 'base' and kernel_variants names

Prints registers, shared memory, stack and local bytes of every producer-warp build the
cluster merge and the s_by_one split-K use (8, 16 and 32 heads; clustered, split-K and
direct), one row a build and variant, so that a variant's cost in registers and spills
is known before device time is spent on it. Gluon needs the Triton the GPU machine has
(3.6); with another it refuses to start: on a CPU machine put a triton 3.6 first on
PYTHONPATH.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "fixtures" / "kernels"))

import kernel_variants  # noqa: E402
import triton  # noqa: E402
from sm120_fitness import Resources, compile_build  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
TRITON = "3.6."  # the GPU machine's; Triton 3.9's Gluon lacks calls the kernel makes
SM90_SMEM_LIMIT = 232448  # 227 KiB, the opt-in maximum a block gets on SM90
CONFIGS = ("ws_h8", "ws_h16", "ws_h32")
MODES = {  # (direct, cluster): one split, two splits in a 2-CTA cluster, split-K
    "cluster": (False, True),
    "split-K": (False, False),
    "direct": (True, False),
}


def version_error(version: str) -> str | None:
    if version.startswith(TRITON):
        return None
    return (
        f"the Gluon kernel compiles with triton {TRITON}x (the GPU machine's); this is"
        f" triton {version}: put a triton {TRITON}x first on PYTHONPATH"
    )


def rows(variant: str, configs: tuple[str, ...], modes: tuple[str, ...]) -> list[Resources]:
    mod = kernel_variants.load(variant)
    out = []
    for name in configs:
        cfg = mod._CONFIGS_BIG[name]
        for mode in modes:
            direct, cluster = MODES[mode]
            pdl = cfg.pdl and not direct and not cluster
            ce = mod._sm90_constexprs(cfg, direct, pdl, cluster)
            k, use = compile_build(
                mod._sparse_mla_split_kernel_sm90, ce, {"num_warps": cfg.num_warps},
                target=SM90, source=GluonASTSource,
            )  # fmt: skip
            # The launch's dynamic shared memory, plus the static .shared that the
            # kernel's inline PTX declares (the exchange buffer and the vote word).
            shared = int(k.metadata.shared) + use.get("SHARED", 0)
            out.append(
                Resources(
                    f"{variant} {name} {mode}", shared, use["REG"], use.get("STACK", 0),
                    use.get("LOCAL", 0),
                )
            )  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", default=["base"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = ap.parse_args()
    for v in args.variants:
        try:
            kernel_variants.source(v)
        except KeyError as exc:
            ap.error(str(exc).strip("'\""))
    if err := version_error(triton.__version__):
        print(f"sm90_resources: error: {err}", file=sys.stderr)
        return 2
    print(f"triton {triton.__version__}, target sm_90")
    print(f"{'build':40s} {'REG':>4s} {'SHARED':>7s} {'STACK':>5s} {'LOCAL':>5s}")
    bad = 0
    for v in args.variants:
        for r in rows(v, tuple(args.configs), tuple(args.modes)):
            flag = ""
            if r.shared > SM90_SMEM_LIMIT or r.local or r.stack:
                flag, bad = "  <-- spills or does not fit", bad + 1
            print(
                f"{r.name:40s} {r.registers:4d} {r.shared:7d} {r.stack:5d} {r.local:5d}{flag}",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
