"""Summarise ncu's SASS source page (CSV) by warp-stall samples (GPU machine).

  ncu --import r.ncu-rep --page source --csv --print-source sass > r.csv
  python3 bench/kernels/ncu_source_top.py r.csv [--top 40]

Prints, for each kernel in the file: the total samples, the samples per opcode, and
the instructions with the most samples, each with its largest stall-reason columns.
Column names differ between ncu versions, so they are found by substring.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections import Counter
from pathlib import Path


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _blocks(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Each kernel's rows; a block starts at a header line naming 'Address'."""
    blocks: list[tuple[str, list[str]]] = []
    title = ""
    for line in text.splitlines():
        if line.startswith('"') and "Address" in line.split(",")[0]:
            blocks.append((title, [line]))
        elif blocks and line.startswith('"'):
            blocks[-1][1].append(line)
        elif line.strip():
            title = line.strip()
    return [(t, list(csv.DictReader(io.StringIO("\n".join(lines))))) for t, lines in blocks]


def summarise(title: str, rows: list[dict[str, str]], top: int) -> None:
    if not rows:
        return
    cols = list(rows[0])
    total_col = next((c for c in cols if "Sampling (All" in c), None)
    if total_col is None:
        print(f"{title}: no stall-sampling column; columns: {cols}")
        return
    src_col = next((c for c in cols if c.strip("# ") == "Source"), cols[1])
    reason_cols = [c for c in cols if "stall" in c.lower() and "Sampling" not in c]
    total = sum(_number(r[total_col]) for r in rows)
    print(f"== {title or 'kernel'}: {len(rows)} instructions, {total:.0f} samples")
    if total == 0:
        return
    by_op: Counter[str] = Counter()
    for r in rows:
        op = (r[src_col].split() or ["?"])[0]
        if op.startswith("@"):  # predicate
            op = (r[src_col].split() + ["?"])[1]
        by_op[op.split(".")[0]] += _number(r[total_col])
    print("   by opcode: " + ", ".join(f"{op} {n / total:.1%}" for op, n in by_op.most_common(14)))
    if reason_cols:
        sums = Counter({c: sum(_number(r[c]) for r in rows) for c in reason_cols})
        shares = [f"{c} {n / total:.1%}" for c, n in sums.most_common(10) if n]
        print("   by reason: " + ", ".join(shares))
    ranked = sorted(rows, key=lambda r: _number(r[total_col]), reverse=True)[:top]
    for r in ranked:
        n = _number(r[total_col])
        reasons = sorted(((_number(r[c]), c) for c in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{c} {v:.0f}" for v, c in reasons if v)
        addr = r[cols[0]]
        print(f"   {n / total:6.2%} {addr:>6} {r[src_col][:64]:<64} {why}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    text = args.csv.read_text(errors="replace")
    blocks = _blocks(text)
    if not blocks:
        print(f"ncu_source_top: no source table in {args.csv}; its head:", file=sys.stderr)
        print("\n".join(text.splitlines()[:15]), file=sys.stderr)
        return 1
    for title, rows in blocks:
        summarise(title, rows, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
