"""One TP rank's load of a GLM-5 GGUF set without vLLM: the GPU bench's loader pass.

The GPU machine has torch and gguf but no vLLM, so `bench_gguf_load.py --device cuda`
loads the synthetic set the way the plugin's loaders cut it, through the plugin's
own `gguf_tensors` (map views) and `gguf_reads` (copy_into), loaded from this
repository's overlay as a package of its own (no vLLM import):

- rows: column-parallel layers, the embedding and lm_head, the experts' w1/w3
  (dim 1 of the [experts, rows, bytes] tensor), cut along the rows;
- columns: row-parallel layers (o_proj, down_proj, the experts' w2), cut along
  the row's bytes: one run of super-blocks a row;
- replicated: everything else the main model builds, whole on every rank;
- unused: the MTP block (the draft loads it, not the main model).

`kind()` is checked against vLLM's own classes of the same tensors in the CPU
bench (`bench_gguf_load.py`, "name classes agree with vLLM's").
"""

from __future__ import annotations

import importlib
import re
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "patches" / "vllm-gguf-plugin" / "files" / "vllm_gguf_plugin"
PACKAGE = "_frontier_gguf_overlay"

# Block tensors by their own name (blk.N.<name>): the indexer's attn_q_b is replicated.
ROWS = re.compile(r"^(token_embd|output)\.weight$|^blk\.\d+\.(attn_q_b|ffn_gate|ffn_up"
                  r"|ffn_gate_shexp|ffn_up_shexp|ffn_gate_exps|ffn_up_exps)\.weight$")
COLUMNS = re.compile(r"^blk\.\d+\.(attn_output|ffn_down|ffn_down_shexp|ffn_down_exps)\.weight$")
BLOCK = re.compile(r"^blk\.(\d+)\.")


def plugin() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """(gguf_headers, gguf_tensors, gguf_reads) from the overlay, without vLLM."""
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(OVERLAY)]  # type: ignore[attr-defined]
        sys.modules[PACKAGE] = package
    return tuple(importlib.import_module(f"{PACKAGE}.{name}")  # type: ignore[return-value]
                 for name in ("gguf_headers", "gguf_tensors", "gguf_reads"))


def kind(name: str, num_layers: int) -> str:
    """rows / columns / replicated / unused for a GLM-5 GGUF tensor at TP > 1, no EP."""
    block = BLOCK.match(name)
    if block and int(block.group(1)) >= num_layers:
        return "unused"
    if ROWS.search(name):
        return "rows"
    if COLUMNS.search(name):
        return "columns"
    return "replicated"


def rank_slice(view, kind_: str, tp: int, rank: int):  # type: ignore[no-untyped-def]
    """The part of *view* (numpy order; quantized: bytes last) that *rank* keeps."""
    if tp == 1 or kind_ == "replicated":
        return view
    dim = view.dim() - 2 if kind_ == "rows" else view.dim() - 1
    size = view.shape[dim] // tp
    return view.narrow(dim, rank * size, size)


def load_rank(parts: list[str], device: str, tp: int, rank: int) -> dict:
    """Copy every tensor's rank slice into *device* memory; time and bytes."""
    import torch

    headers_mod, tensors_mod, reads_mod = plugin()
    start = time.perf_counter()
    headers = [headers_mod.read_header(p) for p in parts]
    parse_s = time.perf_counter() - start
    # The synthetic set's last block is its one MTP block.
    num_layers = int(headers[0].fields.get("glm-dsa.block_count", 0)) - 1
    reads_mod.STATS.reset()
    kept, share, bytes_by_kind = [], 0, {"rows": 0, "columns": 0, "replicated": 0, "unused": 0}
    for header in headers:
        for info in header.tensors:
            k = kind(info.name, num_layers)
            bytes_by_kind[k] += info.nbytes
            if k == "unused":
                continue
            src = rank_slice(tensors_mod.tensor_view(info), k, tp, rank)
            dest = torch.empty(src.shape, dtype=src.dtype, device=device)
            reads_mod.copy_into(dest, src)
            share += src.numel() * src.element_size()
            kept.append(dest)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stats = reads_mod.STATS.as_dict()
    tensors_mod.release_maps()
    del kept
    return {"seconds": seconds, "parse_s": parse_s, "share": share, "stats": stats,
            "copied": reads_mod.STATS.copied(), "bytes_by_kind": bytes_by_kind}
