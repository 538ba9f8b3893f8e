"""Gemma 3 270M Q4_K_M served on CPU through `serve`, checked against transformers.

One vLLM start for the module. The reference is independent of our code: the same
GGUF dequantized by gguf-py (inside transformers' GGUF loader) and run through
transformers' Gemma 3 on CPU in float32. vLLM also runs in float32, so greedy
tokens must agree exactly; that only happens when every weight landed where it
belongs. Determinism is checked here with two identical requests to the one server;
`make e2e` checks it across two cold starts of the smoke-gguf container.

On the unpatched plugin the server never becomes ready: the first forward (the
warm-up) fails in ops.ggml_dequantize with "Triton dequant kernels require CUDA
tensors", and the fixture reports that log.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import Served, run_entrypoint, start_serve

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
START_TIMEOUT = 900.0  # cold start + one-time dequantization on a loaded 2-core machine
PROMPT = "The capital of France is Paris. The capital of Germany is"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_config(gemma_path: Path) -> Path:
    """Config and tokenizer read from the GGUF by entrypoint.gguf_config (cached)."""
    from entrypoint.gguf_config import extract

    folder, _ = extract(gemma_path)
    return folder


@pytest.fixture(scope="module")
def prompt_ids(gemma_config: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_config)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids]  # Gemma expects <bos>; sent as ids to both sides


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def server(
    gemma_path: Path,
    gemma_config: Path,
    reference: list[int],  # computed first: the two would fight over 2 cores
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    del reference
    served = start_serve(
        tmp_path_factory.mktemp("gemma-serve"),
        # no SERVE_HF_CONFIG_PATH/SERVE_TOKENIZER: serve reads them from the file
        # (entrypoint.gguf_config; the gemma_config fixture warmed the same cache)
        SERVE_MODEL=str(gemma_path),
        SERVE_QUANTIZATION="gguf",
        SERVE_DTYPE="float32",  # the reference runs in float32 too
        SERVE_SEED="0",
        SERVE_HEALTH_INTERVAL="1",
    )
    try:
        served.wait_ready(START_TIMEOUT)
        print(f"\nGemma GGUF server ready after {served.ready_after:.0f}s")
        yield served
    finally:
        served.terminate()


def greedy(server: Served, prompt_ids: list[int]) -> dict:
    return server.post(
        "/v1/completions",
        {
            "model": server_model(server),
            "prompt": prompt_ids,
            "max_tokens": NEW_TOKENS,
            "min_tokens": NEW_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        },
    )


def server_model(server: Served) -> str:
    return server.get("/v1/models")["data"][0]["id"]


def test_serve_took_config_and_tokenizer_from_the_file(
    server: Served, gemma_config: Path
) -> None:
    log = server.log.read_text(errors="replace")
    assert "config and tokenizer from the GGUF file" in log
    assert f"--hf-config-path {gemma_config}" in log and f"--tokenizer {gemma_config}" in log


def test_ready_and_probe(server: Served) -> None:
    probe = run_entrypoint("probe", "--ready-file", str(server.ready))
    assert probe.returncode == 0, probe.stdout + probe.stderr


def test_greedy_tokens_are_deterministic_and_match_transformers(
    server: Served, prompt_ids: list[int], reference: list[int]
) -> None:
    first, second = greedy(server, prompt_ids), greedy(server, prompt_ids)
    tokens = first["choices"][0]["token_ids"]
    text = first["choices"][0]["text"]
    print(f"\nvLLM: {tokens} {text!r}\nref:  {reference}")
    assert first["usage"]["completion_tokens"] == NEW_TOKENS and text.strip()
    assert second["choices"][0]["token_ids"] == tokens
    assert second["choices"][0]["text"] == text
    assert tokens == reference
