"""Baseline numbers for GGUF serving on CPU: Gemma 3 270M Q4_K_M through `serve`.

Prints the time until the readiness file appears, vLLM's own model-load figure,
the peak RSS of every process of the server (VmHWM), and tokens per second of
a 128-token greedy completion (after one short warm-up request).

    .venv/bin/python bench/gguf_cpu/bench_gguf_cpu.py [--dtype float32|bfloat16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from fixtures.serving import session_pids, start_gemma  # noqa: E402


def peak_rss_mib(pid: int) -> tuple[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return (name, int(match.group(1)) / 1024) if match else None


def log_span(text: str, first: str, then: str) -> float | None:
    """Seconds between two vLLM log lines, from their 1 s resolution stamps."""
    stamp = r"(\d\d-\d\d \d\d:\d\d:\d\d) \[[^]]+\] "
    a = re.search(stamp + first, text)
    b = re.search(stamp + then, text)
    if not (a and b):
        return None
    def seconds(match: re.Match[str]) -> float:  # the stamps carry no year
        return time.mktime(time.strptime("2000-" + match.group(1), "%Y-%m-%d %H:%M:%S"))

    return seconds(b) - seconds(a)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()

    served, model = start_gemma(args.dtype)
    try:
        try:
            ready_s = served.wait_ready(args.timeout)
        except AssertionError as error:
            print(f"error: the server did not become ready: {error}", file=sys.stderr)
            return 1
        base = {"model": str(model), "temperature": 0, "prompt": "Once upon a time"}
        served.post("/v1/completions", {**base, "max_tokens": 4})  # warm-up
        t0 = time.monotonic()
        body = {**base, "max_tokens": args.tokens, "min_tokens": args.tokens}
        answer = served.post("/v1/completions", body, timeout=1800)
        gen_s = time.monotonic() - t0
        produced = answer["usage"]["completion_tokens"]
        peaks = [p for pid in session_pids(served.proc.pid) if (p := peak_rss_mib(pid))]
    finally:
        served.terminate(120)

    text = served.log.read_text(errors="replace")
    load_s = log_span(text, r"Starting to load model", r"CPU KV cache size")
    size_mib = model.stat().st_size / 2**20
    print(f"model            {model.name} ({size_mib:.0f} MiB), dtype {args.dtype}")
    print(f"ready after      {ready_s:.1f} s (process start to readiness file)")
    if load_s is not None:
        print(f"model load       {load_s:.0f} s (worker log: load start to KV cache sizing; "
              "GGUF parse + dequantized copies)")  # fmt: skip
    for name, mib in sorted(peaks, key=lambda p: -p[1]):
        print(f"peak RSS         {mib:8.0f} MiB  {name}")
    print(f"peak RSS total   {sum(m for _, m in peaks):8.0f} MiB")
    print(f"generation       {produced} tokens in {gen_s:.2f} s = {produced / gen_s:.2f} tokens/s "
          f"(greedy, one request)")  # fmt: skip
    print(f"os.cpu_count()   {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
