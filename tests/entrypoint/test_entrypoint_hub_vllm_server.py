"""vLLM itself starts offline from what `fetch-config` took from a stand-in hub.

The GLM-5 flow without the 402 GB: weights in a local folder, config and tokenizer named
as a hub repo. One real vLLM start on CPU, with HF_HUB_OFFLINE=1 (start_serve's default).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from fixtures.serving import run_entrypoint, run_module, session_pids, start_serve
from tests.entrypoint.stand_in_hub import running_stand_in_hub

pytestmark = pytest.mark.vllm_server
REPO_ID = "acme/tiny-qwen3"


def test_offline_start_from_config_and_tokenizer_fetched_from_the_stand_in_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    built = run_module("fixtures.tiny_model", str(model), timeout=300)
    assert built.returncode == 0, built.stderr
    weights = tmp_path / "weights"  # what the GGUF folder is for GLM-5: no config.json
    weights.mkdir()
    shutil.copy(model / "model.safetensors", weights)
    files = {p.name: p.read_bytes() for p in model.iterdir()}

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with running_stand_in_hub({REPO_ID: files}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        fetched = run_entrypoint("fetch-config", REPO_ID, timeout=120)
        assert fetched.returncode == 0, fetched.stderr
        assert "model.safetensors" not in hub.requested_files()

    served = start_serve(tmp_path / "run", SERVE_MODEL=str(weights),
                         SERVE_HF_CONFIG_PATH=REPO_ID, SERVE_TOKENIZER=REPO_ID)  # fmt: skip
    try:
        served.wait_ready(420)
        body = {"model": str(weights), "prompt": "the quick", "max_tokens": 3}
        answer = served.post("/v1/completions", body)
        assert answer["usage"]["completion_tokens"] == 3
        assert f"config/tokenizer in {tmp_path / 'hf-home'}" in served.log.read_text()
    finally:
        for pid in session_pids(served.proc.pid):
            os.kill(pid, signal.SIGKILL)
        served.proc.wait()
