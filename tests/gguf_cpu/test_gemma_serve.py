"""Gemma 3 270M Q4_K_M served on CPU through `serve`, checked against transformers.

One vLLM start for the module. The reference is independent of our code: the same
GGUF dequantized by gguf-py (inside transformers' GGUF loader) and run through
transformers' Gemma 3 on CPU in float32. vLLM also runs in float32, so greedy
tokens must agree exactly; that only happens when every weight landed where it
belongs. Determinism is checked with two identical requests to the one server
(a second cold start would cost minutes on a 2-core machine).

On the unpatched plugin the server never becomes ready: the first forward (the
warm-up) fails in ops.ggml_dequantize with "Triton dequant kernels require CUDA
tensors", and the fixture reports that log.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
START_TIMEOUT = 900.0  # cold start + one-time dequantization on a loaded 2-core machine
PROMPT = "The capital of France is Paris. The capital of Germany is"
NEW_TOKENS = 16


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    ready: Path
    log: Path
    started: float
    ready_after: float = 0.0

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=300) as response:
            return json.load(response)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    folder = tmp_path_factory.mktemp("gemma-serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env.update(
        PYTHONPATH=PYTHONPATH,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        # no SERVE_HF_CONFIG_PATH/SERVE_TOKENIZER: serve reads them from the file
        # (entrypoint.gguf_config; the gemma_config fixture warmed the same cache)
        SERVE_MODEL=str(gemma_path),
        SERVE_QUANTIZATION="gguf",
        SERVE_DTYPE="float32",  # the reference runs in float32 too
        SERVE_MAX_MODEL_LEN="512",
        SERVE_ENFORCE_EAGER="true",
        SERVE_SEED="0",
        SERVE_HOST="127.0.0.1",
        SERVE_PORT=str(port),
        SERVE_READY_FILE=str(folder / "ready"),
        SERVE_HEALTH_INTERVAL="1",
        # check-gguf knows the GLM-5/DeepSeek layouts only; Gemma is out of its scope
        SERVE_PREFLIGHT_GGUF="false",
    )
    log = folder / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "serve"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(proc, port, folder / "ready", log, time.monotonic())
    try:
        while not served.ready.exists():
            if proc.poll() is not None:
                pytest.fail(f"serve exited with {proc.returncode}:\n{served.log_tail()}")
            if time.monotonic() - served.started > START_TIMEOUT:
                pytest.fail(f"not ready within {START_TIMEOUT:.0f}s:\n{served.log_tail()}")
            time.sleep(1)
        served.ready_after = time.monotonic() - served.started
        print(f"\nGemma GGUF server ready after {served.ready_after:.0f}s")
        yield served
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # our own session only
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


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
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{server.port}/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


def test_serve_took_config_and_tokenizer_from_the_file(
    server: Served, gemma_config: Path
) -> None:
    log = server.log.read_text(errors="replace")
    assert "config and tokenizer from the GGUF file" in log
    assert f"--hf-config-path {gemma_config}" in log and f"--tokenizer {gemma_config}" in log


def test_ready_and_probe(server: Served) -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "entrypoint", "probe", "--ready-file", str(server.ready)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        cwd=REPO,
    )
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
