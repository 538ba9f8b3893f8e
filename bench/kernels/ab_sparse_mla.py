"""Interleaved A/B timing of sweep configs (and FlashMLA bf16) on the same cells.

The table in bench_sparse_mla.py times each contender once, one after another, and
a build timed later in its row has come out up to ~3% faster than the same build
timed first. Here every contender is timed once per round, the order rotating from
round to round, and the medians over the rounds are compared, so drift within a
row is spread over all of them. GPU machine only:

  python3 bench/kernels/ab_sparse_mla.py --configs ours hm_h64 --cells 128x1024 --rounds 6

--kernel-variants times the launch choice of patched copies of the kernel too
(kernel_variants.py), as 'ours@NAME': e.g. --kernel-variants no_pdl_wait.
--kernel-files does the same for other copies of the kernel, as 'file@NAME': a folder
holding its files, e.g. an earlier revision's, `mkdir /tmp/before && git archive REV
patches/vllm/files/vllm/v1/attention/ops | tar -x -C /tmp/before --strip-components=6`,
or the one file of a revision from before the split into families (2026-12-06).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_sparse_mla as bench  # noqa: E402
import kernel_variants  # noqa: E402


def parse_cell(text: str) -> tuple[int, int]:
    try:
        h, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        msg = f"cell {text!r}: expected HEADSxTOKENS, e.g. 128x1024"
        raise argparse.ArgumentTypeError(msg) from None
    if h < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"cell {text!r}: heads and tokens must be >= 1")
    return h, t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", required=True, help="'ours' or sweep variant names")
    ap.add_argument("--cells", nargs="+", type=parse_cell, required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--kernel-variants", nargs="*", default=[], metavar="NAME")
    ap.add_argument("--kernel-files", nargs="*", default=[], type=Path, metavar="PATH")
    args = ap.parse_args()
    if missing := [str(f) for f in args.kernel_files if not f.exists()]:
        ap.error(f"kernel file(s) {missing} do not exist")
    parts = {p for v in args.kernel_variants for p in v.split("+")}
    if bad := sorted(parts - set(kernel_variants.VARIANTS)):
        ap.error(f"unknown kernel variant(s) {bad}; known: {', '.join(kernel_variants.VARIANTS)}")
    if wrong := sorted(parts & kernel_variants.WRONG_RESULTS):
        ap.error(f"kernel variant(s) {wrong} give wrong results by design: use phase_stamps.py")
    mod = bench.load_kernel_module()
    sweep = bench.sweep_variants(mod)
    unknown = [c for c in args.configs if c != "ours" and c not in sweep]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; known: ours, {', '.join(sweep)}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    fm_missing = [] if args.no_flashmla else bench.peers_missing(("flashmla",))
    if fm_missing:
        ap.error(
            f"FlashMLA is not prepared: {fm_missing[0]}; run `make bench-peers` and carry"
            " .bench-peers with the checkout, or pass --no-flashmla"
        )
    if not torch.cuda.is_available():
        ap.error("no CUDA GPU here; the A/B timing runs on a GPU")
    torch.manual_seed(0)
    l2 = bench.l2_bytes(torch.cuda.get_device_properties(0))
    kv = torch.randn(bench.SLOTS, 576, device="cuda", dtype=torch.bfloat16)
    fm, fm_status = (None, "off") if args.no_flashmla else bench.load_flashmla()
    print(f"flashmla: {fm_status}", flush=True)
    if fm is None and not args.no_flashmla:
        print(f"ab_sparse_mla: error: FlashMLA did not load: {fm_status}", file=sys.stderr)
        return 1
    failures = 0
    for h, t in args.cells:
        n_sets = bench.index_sets(t, l2)
        calls = bench.calls_per_replay(t, n_sets)
        case = bench.Case(h, t, kv, None, n_sets)
        ref = case.reference()
        fns: dict[str, list] = {}
        if fm is not None:
            f = bench.flashmla_bf16(case, fm)
            if bench.check("fm_bf16", f, lambda r: r[0], case, ref, 1e-2) == "ok":
                fns["fm_bf16"] = f
        contenders = [(n, None if n == "ours" else sweep[n][0], None) for n in args.configs]
        contenders += [(f"ours@{v}", None, kernel_variants.load(v)) for v in args.kernel_variants]
        contenders += [
            (f"file@{f.name}", None, kernel_variants.load_file(f)) for f in args.kernel_files
        ]
        for name, cfg, variant in contenders:
            f, build = bench.ours(case, cfg, variant)
            print(f"  build {name} h{h} t{t}: {build[0]} {build[1]}", flush=True)
            if bench.check(name, f, lambda r: r[0], case, ref, 1e-2) != "ok":
                failures += 1
                continue
            fns[name] = f
        runs, errors = bench.time_rounds(fns, calls, args.rounds)
        for name, err in errors.items():
            print(f"  {name} h{h} t{t} timing: {err}", flush=True)
            failures += 1
        times = {n: [x * 1e6 for x in v] for n, v in runs.items()}
        med = {n: statistics.median(v) for n, v in times.items()}
        print(f"{h}x{t} ({args.rounds} rounds, order rotated, {calls} calls a replay), us:")
        for n in times:
            vs = f"  FM/this {med['fm_bf16'] / med[n]:.3f}x" if "fm_bf16" in med else ""
            runs = " ".join(f"{x:.1f}" for x in times[n])
            print(f"  {n:14s} median {med[n]:9.1f}{vs}   [{runs}]", flush=True)
        del case
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
