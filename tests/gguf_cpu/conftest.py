"""The Gemma 3 270M GGUF's config, prompt and transformers reference, shared by the
CPU serving tests (one reference per session: it costs ~30 s of 2 cores)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

PROMPT = "The capital of France is Paris. The capital of Germany is"
NEW_TOKENS = 16


@pytest.fixture(scope="session")
def gemma_config(gemma_path: Path) -> Path:
    """Config and tokenizer read from the GGUF by entrypoint.start.gguf_config (cached)."""
    from entrypoint.start.gguf_config import extract

    folder, _ = extract(gemma_path)
    return folder


@pytest.fixture(scope="session")
def prompt_ids(gemma_config: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_config)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids]  # Gemma expects <bos>; sent as ids to both sides


@pytest.fixture(scope="session")
def reference(gemma_path: Path, gemma_config: Path, prompt_ids: list[int]) -> list[int]:
    """16 greedy tokens from transformers' Gemma 3 on gguf-py-dequantized weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        gemma_path.parent, gguf_file=gemma_path.name, dtype=torch.float32
    )
    model.eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    del model, out
    gc.collect()  # free ~1 GiB before vLLM loads its own copy
    return tokens


