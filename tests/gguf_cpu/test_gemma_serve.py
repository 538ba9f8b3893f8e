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

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.watch import steps
from fixtures.serving import Served, greedy, run_entrypoint, start_serve, start_wait, status_json
from tests.gguf_cpu.conftest import NEW_TOKENS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
START_TIMEOUT = 900.0  # cold start + one-time dequantization on a loaded 2-core machine


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
        # (entrypoint.start.gguf_config; the gemma_config fixture warmed the same cache)
        SERVE_MODEL=str(gemma_path),
        SERVE_QUANTIZATION="gguf",
        SERVE_DTYPE="float32",  # the reference runs in float32 too
        SERVE_SEED="0",
        SERVE_HEALTH_INTERVAL="1",
    )
    waiting = start_wait(served, START_TIMEOUT)  # what a user watching the start sees
    try:
        served.wait_ready(START_TIMEOUT)
        print(f"\nGemma GGUF server ready after {served.ready_after:.0f}s")
        out, _ = waiting.communicate(timeout=30)
        served.wait_output = (waiting.returncode, out)  # type: ignore[attr-defined]
        yield served
    finally:
        waiting.kill()
        served.terminate()


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
    first = greedy(server, prompt_ids, NEW_TOKENS)
    second = greedy(server, prompt_ids, NEW_TOKENS)
    tokens = first["choices"][0]["token_ids"]
    text = first["choices"][0]["text"]
    print(f"\nvLLM: {tokens} {text!r}\nref:  {reference}")
    assert first["usage"]["completion_tokens"] == NEW_TOKENS and text.strip()
    assert second["choices"][0]["token_ids"] == tokens
    assert second["choices"][0]["text"] == text
    assert tokens == reference


def test_the_load_reported_bytes_per_rank(server: Served, gemma_path: Path) -> None:
    """The plugin in vLLM's worker wrote its progress where serve told it to."""
    import json

    from entrypoint.start.plugin_files import module as plugin_module
    from entrypoint.watch import load_progress

    tensors = plugin_module("headers").read_header(gemma_path).tensors
    folder = Path(load_progress.folder_for(str(server.status)))
    record = json.loads((folder / "rank-0.json").read_text())
    assert record["finished"] and record["percent"] == 100
    assert record["done_bytes"] == record["total_bytes"] == sum(t.nbytes for t in tensors)
    log = server.log.read_text(errors="replace")
    assert "GGUF weights rank 0: loading 0.23 GiB from 1 file(s)" in log
    assert "GGUF weights rank 0: 0.23 GiB of 0.23 GiB (100%)" in log


def test_steps_in_order_and_progress_while_loading(server: Served) -> None:
    status = status_json(server)
    names = [s["step"] for s in status["steps"]]
    assert names == [steps.VALIDATING, steps.IMPORTING_VLLM, steps.PREFLIGHT, steps.STARTING_VLLM,
                     steps.STARTING_ENGINE, steps.LOADING, steps.LOADED, steps.KV_CACHE,
                     steps.WARMING_UP, steps.API_SERVER, steps.SERVING], names
    code, out = server.wait_output  # type: ignore[attr-defined]
    print("\n" + out)
    assert code == 0, out
    # The load takes well under a second here, less than wait's poll, so the progress
    # is checked where the status keeps it: the plugin's progress lines became the
    # loading step's detail while it ran, and its last line the loaded step's.
    detail = {s["step"]: s["detail"] or "" for s in status["steps"]}
    assert re.fullmatch(r"rank 0: 0\.\d\d GiB of 0\.23 GiB \(\d+%\)", detail[steps.LOADING])
    assert re.fullmatch(r"0\.23 GiB in [\d.]+ s at [\d.]+ GiB/s \(rank 0\)",
                        detail[steps.LOADED])
