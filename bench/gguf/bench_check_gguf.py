"""Benchmark: check-gguf on a synthetic multi-GB GLM-5-layout GGUF vs one sequential read.

    python bench/gguf/bench_check_gguf.py [--gib 2.5] [--dir /tmp]

Writes a file with GLM-5's real tensor shapes (hidden 6144, 64 heads, the
indexer, the MTP block, the 154880-token vocabulary) and fewer layers/experts
so it fits the requested size, streams real (non-zero) bytes so the file has
no holes, evicts it from the page cache (posix_fadvise DONTNEED after fsync),
then times a cold check-gguf run (a fresh interpreter, imports included)
and a cold sequential read. The file is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "gguf"))

from synthetic_glm5 import evict, plan, write_set  # noqa: E402


def time_check(path: Path, cfg_dir: Path) -> tuple[float, int]:
    code = ("import sys; from entrypoint.start import gguf_check;"
            f"sys.exit(gguf_check.main({str(path)!r}, {str(cfg_dir)!r}))")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    print(done.stdout.strip().splitlines()[-1] if done.stdout else done.stderr[-2000:])
    return elapsed, done.returncode


def time_read(path: Path) -> float:
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(view):
            pass
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.5, help="synthetic file size (GiB)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write it")
    args = ap.parse_args()
    target = int(args.gib * 2**30)
    if shutil.disk_usage(args.dir).free < target + (1 << 30):
        print(f"not enough free space in {args.dir} for {args.gib} GiB + 1 GiB margin")
        return 2
    cfg, tensors = plan(target)
    work = Path(tempfile.mkdtemp(prefix="bench-check-gguf-", dir=args.dir))
    try:
        (work / "config.json").write_text(json.dumps(cfg))
        t0 = time.perf_counter()
        (path,) = write_set(work, cfg, tensors, parts=1)
        size = path.stat().st_size
        print(f"wrote {size / 2**30:.2f} GiB, {len(tensors)} tensors, "
              f"{cfg['num_hidden_layers']} layers + MTP in {time.perf_counter() - t0:.1f} s")
        evict([path])
        check_s, rc = time_check(path, work)
        evict([path])
        read_s = time_read(path)
        print(f"check-gguf (cold, fresh interpreter): {check_s:.2f} s, exit {rc}")
        print(f"one sequential read (cold):          {read_s:.2f} s "
              f"({size / 2**20 / read_s:.0f} MiB/s)")
        print(f"ratio read/check: {read_s / check_s:.1f}x; at this read rate the 402 GB "
              f"set would take {402e9 / (size / read_s) / 60:.0f} min to read once")
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
