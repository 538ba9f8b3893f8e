"""A synthetic GLM-5-shaped GGUF set for the GGUF benchmarks: real tensor shapes, fewer layers.

GLM-5's real shapes (hidden 6144, 64 heads, the DSA indexer, the MTP block, the
154880-token vocabulary with as many BPE merges) with 8 experts per MoE layer and
as many layers as fit the requested size. Tensor bytes are noise (no holes in the
file), 2-D tensors Q4_K where rows allow it, else Q8_0; vectors F32. Written as
``glm5-synthetic-0000k-of-0000N.gguf`` parts the way llama.cpp's gguf-split lays
them out: the first part holds the metadata, every part its split keys.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from entrypoint.start.plugin_files import module as plugin_module  # noqa: E402

GLM5 = {
    "model_type": "glm_moe_dsa", "hidden_size": 6144, "num_attention_heads": 64,
    "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32,
    "index_head_dim": 128, "num_nextn_predict_layers": 1, "first_k_dense_replace": 3,
    "intermediate_size": 12288, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "topk_method": "noaux_tc", "vocab_size": 154880,
    "tie_word_embeddings": False,
}
EXPERTS = 8
CHUNK = 64 << 20


def qtype(shape: tuple[int, ...]) -> gguf.GGMLQuantizationType:
    T = gguf.GGMLQuantizationType
    if len(shape) == 1:
        return T.F32
    return T.Q4_K if shape[-1] % 256 == 0 else T.Q8_0


def nbytes(shape: tuple[int, ...], t: gguf.GGMLQuantizationType) -> int:
    block, size = gguf.GGML_QUANT_SIZES[t]
    return int(np.prod(shape)) // block * size


def plan(target: int, min_layers: int = 4) -> tuple[dict, dict]:
    """A GLM-5 config with as many layers (8 experts each) as fit *target* bytes,
    and the tensors (GGUF name -> layout slot) a real file of it holds."""
    layout_mod = plugin_module("layout")
    cfg = dict(GLM5, n_routed_experts=EXPERTS, num_hidden_layers=min_layers)
    tensors: dict = {}
    for layers in range(min_layers, 79):
        cfg["num_hidden_layers"] = layers
        layout = layout_mod.build_layout(cfg)
        tensors = {n: s for n, s in layout.items() if s.kv_part or not s.optional
                   or n == "output.weight"}
        if sum(nbytes(s.shape, qtype(s.shape)) for s in tensors.values()) >= target:
            break
    return cfg, tensors


def part_paths(folder: Path, parts: int) -> list[Path]:
    return [folder / f"glm5-synthetic-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]


def _split(tensors: dict, parts: int) -> list[list[str]]:
    """Consecutive runs of tensors of about equal bytes, one per part."""
    sizes = [(n, nbytes(s.shape, qtype(s.shape))) for n, s in tensors.items()]
    total, groups, acc = sum(b for _, b in sizes), [[] for _ in range(parts)], 0
    for name, size in sizes:
        groups[min(parts - 1, acc * parts // total)].append(name)
        acc += size
    return groups


def write_set(folder: Path, cfg: dict, tensors: dict, parts: int = 2,
              merges: int | None = None) -> list[Path]:
    """Write the parts into *folder*; fsync'd, so the caller can evict them."""
    paths = part_paths(folder, parts)
    noise = np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    vocab = cfg["vocab_size"]
    n_merges = vocab if merges is None else merges
    for index, (path, names) in enumerate(zip(paths, _split(tensors, parts), strict=True)):
        w = gguf.GGUFWriter(str(path), "glm-dsa")
        w.add_uint16("split.no", index)
        w.add_uint16("split.count", parts)
        w.add_int32("split.tensors.count", len(tensors))
        if index == 0:
            w.add_block_count(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"])
            w.add_embedding_length(cfg["hidden_size"])
            w.add_head_count(cfg["num_attention_heads"])
            w.add_token_list([f"tok{i}" for i in range(vocab)])
            w.add_token_types([1] * vocab)
            w.add_token_merges([f"tok{i % vocab} tok{(i * 7) % vocab}" for i in range(n_merges)])
        for name in names:
            slot = tensors[name]
            t = qtype(slot.shape)
            w.add_tensor_info(name, slot.shape, np.dtype(np.float32), nbytes(slot.shape, t),
                              raw_dtype=t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        for name in names:
            size = left = nbytes(tensors[name].shape, qtype(tensors[name].shape))
            while left:
                step = min(left, CHUNK)
                fout.write(noise[:step])
                left -= step
            w.write_padding(fout, size)  # each tensor's data ends on the alignment
        fout.flush()
        os.fsync(fout.fileno())
        w.close()
    return paths


def evict(paths: list[Path]) -> None:
    """Drop the files from the page cache (they were fsync'd, so this sticks)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_read(paths: list[Path]) -> float:
    """Seconds for one read() pass over every part in 16 MiB requests (the floor)."""
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(view):
                pass
    return time.perf_counter() - start
