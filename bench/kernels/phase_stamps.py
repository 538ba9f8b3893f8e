"""Where a call of the KV-major s_by_one kernel spends its time: ablations and stamps.

For each cell, the launch choice and patched copies of it (kernel_variants.py) are
timed interleaved over rounds (order rotated, as ab_sparse_mla.py does), and the
difference of each from the unpatched build is printed. Then the 'stamps' build is
replayed once more and the globaltimer stamps its CTAs wrote in the replay's last call
are printed per phase (min, p10, median, p90, max over the CTAs, us). Cells must use the
KV-major s_by_one path (8-32 heads, 32-128 tokens), or be a lone token of 1-16 heads (the
Triton build: the t_* ablations, no stamps). GPU machine only:

  python3 bench/kernels/phase_stamps.py --cells 32x64 8x64 --variants noq nostore noxfer
  python3 bench/kernels/phase_stamps.py --cells 16x1 8x1 --variants t_noq t_nostore t_nomerge
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import kernel_variants  # noqa: E402
from ab_sparse_mla import parse_cell  # noqa: E402

CLUSTER_ONLY = {"noxfer", "bf16x"}  # no change where no cluster runs


def kv_major(h: int, t: int) -> bool:
    return 8 <= h <= 32 and 32 <= t <= 128


def lone(h: int, t: int) -> bool:
    """A lone token of 1-16 heads: the Triton h16_n16 build, the t_* variants' target."""
    return t == 1 and h <= 16


def applies(name: str, h: int, t: int, cluster: bool) -> bool:
    parts = [p for p in name.split("+") if p != "base"]
    if lone(h, t):
        return all(p.startswith("t_") for p in parts)
    if not cluster and any(p in CLUSTER_ONLY for p in parts):
        return False
    return not any(p.startswith("t_") for p in parts)


def phases(words: np.ndarray, cluster: bool, n_tiles: int) -> list[tuple[str, np.ndarray]]:
    """Per-phase times (us) from the stamps of one call: words is [2 * tokens, 32] int32,
    row 2t + s for token t's split s (one split: the even rows)."""
    x = words.astype(np.int64)
    split = np.tile([0, 1], len(x) // 2)
    if not cluster:
        x, split = x[0::2], split[0::2]
    base = x[:, kernel_variants.SLOTS["s_start"]].min()

    def at(name: str) -> np.ndarray:  # us from the first CTA's start (32-bit wrap)
        d = (x[:, kernel_variants.SLOTS[name]] - base + 2**31) % 2**32 - 2**31
        return d / 1000.0

    r = {name: at(name) for name in kernel_variants.SLOTS}
    rows = [
        ("start", r["s_start"]),
        ("q in shared memory", r["s_q"] - r["s_start"]),
        ("tile 0 scored", r["s_tile0"] - r["s_start"]),
        ("tile 0: scored -> p handed over", r["s_p0"] - r["s_tile0"]),
        ("tile 0 scored -> tile 1 scored", r["s_tile1"] - r["s_tile0"]),
        ("tile 1 scored -> tile 2 scored", r["s_tile2"] - r["s_tile1"]),
        ("per tile, tile 0 .. last scored",
         (r["s_last_scored"] - r["s_tile0"]) / max(1, n_tiles - 1)),
        ("last tile: wait + q.kT", r["s_last_scored"] - r["s_last_top"]),
        ("last tile: softmax .. p.v", r["s_loop"] - r["s_last_scored"]),
        ("loop end, first warpgroup", r["s_loop"]),
        ("loop end, second warpgroup", r["o_loop"]),
    ]  # fmt: skip
    if not cluster:  # one split: both warpgroups finish and store their halves
        return rows + [
            ("first wg: loop end -> 1/l and lse computed", r["s_stats"] - r["s_loop"]),
            ("first wg: -> second wg past its last p.v", r["s_pe"] - r["s_stats"]),
            ("second wg: loop end -> 1/l and lse in", r["o_pf"] - r["o_loop"]),
            ("finish, first warpgroup", r["s_end"] - r["s_loop"]),
            ("finish, second warpgroup", r["o_end"] - r["o_loop"]),
            ("end", np.maximum(r["s_end"], r["o_end"])),
        ]
    # cluster_merge: split 0's first warpgroup keeps its half of o (and sends lse, 1/l),
    # its second sends; split 1's first sends its half, lse and 1/l, its second keeps.
    s0, s1 = split == 0, split == 1
    rows += [
        ("split 0, second wg: loop end -> o sent", (r["o_put"] - r["o_loop"])[s0]),
        ("split 0, second wg: loop end -> signalled", (r["o_sent"] - r["o_loop"])[s0]),
        ("split 0, first wg: loop end -> lse, 1/l computed", (r["s_stats"] - r["s_loop"])[s0]),
        ("split 0, first wg: loop end -> signalled", (r["s_sent"] - r["s_loop"])[s0]),
        ("split 1, first wg: loop end -> o sent", (r["s_put"] - r["s_loop"])[s1]),
        ("split 1, first wg: o sent -> lse, 1/l computed", (r["s_stats"] - r["s_put"])[s1]),
        ("split 1, first wg: loop end -> signalled", (r["s_sent"] - r["s_loop"])[s1]),
        ("split 1, second wg: loop end -> 1/l in", (r["o_pf"] - r["o_loop"])[s1]),
    ]  # fmt: skip
    for wg, keeper in (("s", s0), ("o", s1)):
        name = f"split {0 if wg == 's' else 1} keeper"
        rows += [
            (f"{name}: loop end -> partner's half in", (r[f"{wg}_xchg"] - r[f"{wg}_loop"])[keeper]),
            (f"{name}: in -> merged", (r[f"{wg}_merged"] - r[f"{wg}_xchg"])[keeper]),
            (f"{name}: merged -> stored", (r[f"{wg}_end"] - r[f"{wg}_merged"])[keeper]),
        ]
    end = np.where(s0, r["s_end"], r["o_end"])
    rows += [
        ("end", end),
        ("pair's loop ends apart", np.abs(r["s_loop"][0::2] - r["s_loop"][1::2])),
        ("pair: the later loop end -> the later end",
         end.reshape(-1, 2).max(1) - np.maximum(r["s_loop"], r["o_loop"]).reshape(-1, 2).max(1)),
    ]
    return rows


def print_phases(rows: list[tuple[str, np.ndarray]]) -> None:
    print(f"    {'phase, us':44s} {'min':>7s} {'p10':>7s} {'median':>7s} {'p90':>7s} {'max':>7s}")
    for name, v in rows:
        q = np.percentile(v, [0, 10, 50, 90, 100])
        print(f"    {name:44s} " + " ".join(f"{a:7.2f}" for a in q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", type=parse_cell, required=True)
    ap.add_argument("--variants", nargs="*", default=["noq", "nostore", "noxfer"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stamps-on", default="", metavar="VARIANT",
                    help="stamp this variant instead of the unpatched build")  # fmt: skip
    ap.add_argument("--save", type=Path, metavar="DIR",
                    help="also write each cell's raw stamps to DIR/stamps_HxT.npy")  # fmt: skip
    args = ap.parse_args()
    every = [*args.variants, *([args.stamps_on] if args.stamps_on else [])]
    unknown = [v for v in every for p in v.split("+") if p not in kernel_variants.VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(kernel_variants.VARIANTS)}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    bad = [f"{h}x{t}" for h, t in args.cells if not (kv_major(h, t) or lone(h, t))]
    if bad:
        ap.error(
            f"cell(s) {bad}: these tools cover the KV-major s_by_one path (8-32 heads at"
            " 32-128 tokens) and the lone token's Triton build (1-16 heads at 1 token)"
        )

    import bench_sparse_mla as bench
    import torch  # after the argument checks: they run without a GPU

    stamp = any(kv_major(h, t) for h, t in args.cells)  # lone tokens are not stamped
    stamps = f"stamps+{args.stamps_on}" if args.stamps_on else "stamps"
    names = ["base", *dict.fromkeys([*args.variants, *([stamps] if stamp else [])])]
    mods = {n: kernel_variants.load(n) for n in names}
    torch.manual_seed(0)
    l2 = bench.l2_bytes(torch.cuda.get_device_properties(0))
    kv = torch.randn(bench.SLOTS, 576, device="cuda", dtype=torch.bfloat16)
    info = mods["base"]._device_info(kv.device)
    for h, t in args.cells:
        cfg = mods["base"].pick_config(t, h, info)
        stamped = cfg.gluon and cfg.s_by_one and not cfg.head_major
        if not stamped and not lone(h, t):
            print(f"{h}x{t}: the launch choice here is not KV-major s_by_one; skipped")
            continue
        nhb = -(-h // cfg.block_h)
        splits = mods["base"].pick_num_splits(
            t, nhb, bench.TOPK, cfg.block_n, info.num_sms, cfg.per_sm
        )
        cluster = splits == 2 and cfg.cluster_merge
        ws_numel = max(1 << 20, mods["base"].max_workspace_numel(t, h, bench.TOPK, kv.device))
        n_sets = bench.index_sets(t, l2)
        calls = bench.calls_per_replay(t, n_sets)
        case = bench.Case(h, t, kv, None, n_sets)
        ref = case.reference()
        fns, ws = {}, {}
        for n in names:
            if not applies(n, h, t, cluster) or (n == stamps and not stamped):
                continue
            w = torch.zeros(ws_numel, device="cuda", dtype=torch.float32)
            out, lse = torch.empty_like(case.out), torch.empty_like(case.lse)
            fns[n] = [
                lambda i=i, m=mods[n], c=case, w=w, out=out, lse=lse: m.sparse_mla_fwd(
                    c.q, kv.view(-1, 1, 576), i, c.scale, out, lse, workspace=w
                )
                for i in case.idx
            ]
            ws[n] = w
            fns[n][0]()
            torch.cuda.synchronize()
            err = bench.rel_err(out[: ref.shape[0]].cpu(), ref)
            wrong = set(n.split("+")) & kernel_variants.WRONG_RESULTS
            print(f"  {h}x{t} {n}: error vs reference {err:.2e}"
                  + (" (ablation: wrong by design)" if wrong else ""), flush=True)  # fmt: skip
            if not wrong and not err < 1e-2:
                print(f"{h}x{t} {n}: wrong results", file=sys.stderr)
                return 1
        times: dict[str, list[float]] = {n: [] for n in fns}
        order = list(fns)
        for rd in range(args.rounds):
            k = rd % len(order)
            for n in order[k:] + order[:k]:
                times[n].append(bench.time_fn(fns[n], calls=calls) * 1e6)
        med = {n: statistics.median(v) for n, v in times.items()}
        print(f"{h}x{t}: h{cfg.block_h}, {splits} split(s), {args.rounds} rounds, {calls} calls"
              " a replay; us, median and against the unpatched build")  # fmt: skip
        for n in order:
            runs = " ".join(f"{x:.1f}" for x in times[n])
            print(f"  {n:18s} {med[n]:8.2f} {med[n] - med['base']:+7.2f}   [{runs}]", flush=True)
        if stamped:
            bench.time_fn(fns[stamps], calls=calls, reps=1)
            torch.cuda.synchronize()
            words = ws[stamps][: t * 2 * kernel_variants.STAMP_WORDS].view(torch.int32)
            words = words.view(t * 2, kernel_variants.STAMP_WORDS).cpu().numpy()
            if args.save is not None:
                args.save.mkdir(parents=True, exist_ok=True)
                np.save(args.save / f"stamps_{h}x{t}.npy", words)
            n_tiles = bench.TOPK // splits // 64
            print(f"  {stamps}, the last call of a replay ({n_tiles} tiles a CTA):")
            print_phases(phases(words, cluster, n_tiles))
        del case
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
