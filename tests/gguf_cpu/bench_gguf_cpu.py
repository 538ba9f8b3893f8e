"""Baseline numbers for GGUF serving on CPU: Gemma 3 270M Q4_K_M through `serve`.

Prints the time until the readiness file appears, vLLM's own model-load figure,
the peak RSS of every process of the server (VmHWM), and tokens per second of
a 128-token greedy completion (after one short warm-up request).

    .venv/bin/python tests/gguf_cpu/bench_gguf_cpu.py [--dtype float32|bfloat16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from entrypoint.gguf_config import extract  # noqa: E402
from entrypoint.gguf_models import gemma_gguf  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[3]) == sid:
            pids.append(int(entry))
    return pids


def peak_rss_mib(pid: int) -> tuple[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return (name, int(match.group(1)) / 1024) if match else None


def post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=1800) as response:
        return json.load(response)


def start_gemma(dtype: str) -> tuple[subprocess.Popen[bytes], int, Path, Path, float]:
    """`serve` Gemma 3 270M Q4_K_M on 127.0.0.1 in its own session.

    Returns the process, port, work folder (ready file, serve.log), model path and
    the monotonic time of the process start.
    """
    model = gemma_gguf()
    extract(model)  # the entrypoint's config cache, warm: extraction stays out of the timing
    folder = Path(tempfile.mkdtemp(prefix="gguf-cpu-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        SERVE_MODEL=str(model),  # serve finds config + tokenizer in the cache warmed above
        SERVE_QUANTIZATION="gguf",
        SERVE_DTYPE=dtype,
        SERVE_MAX_MODEL_LEN="512",
        SERVE_ENFORCE_EAGER="true",
        SERVE_HOST="127.0.0.1",
        SERVE_PORT=str(port),
        SERVE_READY_FILE=str(folder / "ready"),
        SERVE_HEALTH_INTERVAL="0.5",
        SERVE_PREFLIGHT_GGUF="false",  # check-gguf covers the GLM-5/DeepSeek layouts only
    )
    started = time.monotonic()
    with (folder / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "serve"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, port, folder, model, started


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

    proc, port, folder, model, start = start_gemma(args.dtype)
    log = folder / "serve.log"
    try:
        while not (folder / "ready").exists():
            if proc.poll() is not None or time.monotonic() - start > args.timeout:
                print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
                print("error: the server did not become ready", file=sys.stderr)
                return 1
            time.sleep(0.5)
        ready_s = time.monotonic() - start
        base = {"model": str(model), "temperature": 0, "prompt": "Once upon a time"}
        post(port, {**base, "max_tokens": 4})  # warm-up
        t0 = time.monotonic()
        answer = post(port, {**base, "max_tokens": args.tokens, "min_tokens": args.tokens})
        gen_s = time.monotonic() - t0
        produced = answer["usage"]["completion_tokens"]
        peaks = [p for pid in session_pids(proc.pid) if (p := peak_rss_mib(pid))]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)

    text = log.read_text(errors="replace")
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
