"""Patch 0001 of the plugin series, on a real GGUF written with gguf-py.

The patched plugin (installed in the CPU tier) must yield exactly the names
vLLM loads; the pristine 0.0.5 code, read from the pinned release wheel,
reproduces the bug, which shows this test fails without the patch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="needs the CPU test tier (make venv)")
pytest.importorskip("vllm_gguf_plugin", reason="needs the CPU test tier (make venv)")

from pipeline import source  # noqa: E402

Q8_0, Q4_0 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0

# gguf name -> (mapped HF name, quant type); several mapped names hold
# "weight" away from the end.
TENSORS = {
    "blk.3.indexer.proj.weight": ("model.layers.3.self_attn.indexer.weights_proj.weight", Q8_0),
    "blk.3.attn_q_a.weight": ("model.layers.3.self_attn.q_a_proj.weight", Q4_0),
    "blk.3.weightless.weight": ("model.layers.3.weightless_gate.weight", Q8_0),
    "blk.3.attn_norm.weight": (
        "model.layers.3.input_layernorm.weight",
        gguf.GGMLQuantizationType.F32,
    ),
}
EXPECTED = [
    ("model.layers.3.self_attn.indexer.weights_proj.qweight_type", "type"),
    ("model.layers.3.self_attn.indexer.weights_proj.qweight", "data"),
    ("model.layers.3.self_attn.q_a_proj.qweight_type", "type"),
    ("model.layers.3.self_attn.q_a_proj.qweight", "data"),
    ("model.layers.3.weightless_gate.qweight_type", "type"),
    ("model.layers.3.weightless_gate.qweight", "data"),
    ("model.layers.3.input_layernorm.weight", "data"),
]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "rename.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    originals = {}
    for name, (_, qtype) in TENSORS.items():
        data = rng.standard_normal((8, 64)).astype(np.float32)
        originals[name] = data
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, originals


def _yielded(module: ModuleType, path: Path) -> list[tuple[str, object]]:
    name_map = {gguf_name: hf for gguf_name, (hf, _) in TENSORS.items()}
    return list(module.gguf_quant_weights_iterator(path, name_map))


def _pristine_weight_utils(tmp_path: Path, real_file) -> ModuleType:  # noqa: ANN001
    tree = source.unpack_wheel(real_file("gguf-plugin-wheel"), tmp_path / "pristine")
    spec = importlib.util.spec_from_file_location(
        "pristine_weight_utils", tree / "vllm_gguf_plugin" / "weight_utils.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_patched_iterator_yields_exact_names(gguf_file) -> None:  # noqa: ANN001
    from vllm_gguf_plugin import weight_utils

    path, originals = gguf_file
    got = _yielded(weight_utils, path)
    assert [name for name, _ in got] == [name for name, _ in EXPECTED]
    by_name = dict(got)
    assert int(by_name["model.layers.3.self_attn.indexer.weights_proj.qweight_type"]) == int(Q8_0)
    assert int(by_name["model.layers.3.self_attn.q_a_proj.qweight_type"]) == int(Q4_0)
    raw = by_name["model.layers.3.self_attn.indexer.weights_proj.qweight"].numpy()
    restored = gguf.quants.dequantize(raw, Q8_0)
    np.testing.assert_allclose(restored, originals["blk.3.indexer.proj.weight"], atol=0.05)
    np.testing.assert_array_equal(
        by_name["model.layers.3.input_layernorm.weight"].numpy(),
        originals["blk.3.attn_norm.weight"],
    )


def test_diffusion_iterator_renames_only_the_suffix(gguf_file) -> None:  # noqa: ANN001
    from vllm_gguf_plugin.weights_adapter.diffusion import base

    path, _ = gguf_file
    names = [name for name, _ in base.gguf_quant_weights_iterator(str(path))]
    assert "blk.3.indexer.proj.qweight" in names and "blk.3.indexer.proj.qweight_type" in names
    assert "blk.3.weightless.qweight" in names
    assert not any("qweightless" in name for name in names)


def test_unpatched_plugin_reproduces_the_bug(gguf_file, tmp_path: Path, real_file) -> None:  # noqa: ANN001
    path, _ = gguf_file
    names = [name for name, _ in _yielded(_pristine_weight_utils(tmp_path, real_file), path)]
    assert "model.layers.3.self_attn.indexer.qweights_proj.qweight" in names
    assert names != [name for name, _ in EXPECTED]
