"""The tiny GLM-5 GGUF served through `serve` on CPU, checked against transformers.

One server for the module: `python -m entrypoint serve` with the GGUF preflight
(check-gguf on the GLM-5 layout), the readiness file and vLLM's OpenAI server,
float32, TRITON_MLA_SPARSE, a 32-token chunked-prefill budget, and
profiles/glm5.env's MTP speculative config (method mtp, 3 tokens, the GGUF's own
`nextn` block as drafter). The folder and the reference come from
fixtures/glm5_served.py: transformers' GlmMoeDsaForCausalLM on gguf-py's
dequantization of the same file; transformers has no MTP, so its ids are those
of the model alone.

- Greedy ids equal transformers' for prompts of 10, 28 and 44 tokens (index_topk
  16; 44 > the 32-token budget, so its prefill is chunked).
- Prompt logprobs of prompt + reference continuation agree within LOGPROB_TOL.
  They are the measure that carries over to GPUs: the CUDA indexer's fp8 may
  flip a top-k choice near the cut-off, which changes a token only when the
  logits are close.
- With MTP the ids are still transformers'. The nextn block is the echo block
  (fixtures/glm5_gguf.echo_mtp_block: its draft is the last token), so the
  acceptance counters that /metrics reports are known from the ids alone.
- The reference with the indexer bypassed (dense attention) gives other tokens,
  so the comparison tells sparse attention from dense.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from fixtures import glm5_served
from fixtures.serving import (
    REPO,
    Served,
    greedy,
    run_entrypoint,
    spec_counters,
    start_serve,
    status_shows_acceptance,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
START_TIMEOUT = 600.0
MAX_BATCHED = 32
# float32 on both sides; they differ only in summation order (vLLM's fused
# MoE and absorbed MLA against transformers' per-expert loop and full k/v).
LOGPROB_TOL = 2e-4  # measured worst: 2.3e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("glm5-served")
    glm5_served.build(out, types="mixed", mtp=True)
    return out


def profile_speculative_config() -> dict:
    env = read_env_file(str(REPO / "profiles" / "glm5.env"))
    return json.loads(env["SERVE_SPECULATIVE_CONFIG"])


@pytest.fixture(scope="module")
def ref(folder: Path) -> dict:
    return json.loads((folder / glm5_served.REFERENCE).read_text())


@pytest.fixture(scope="module")
def server(folder: Path, ref: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    del ref  # built first: the two would fight over 2 cores
    served = start_serve(
        tmp_path_factory.mktemp("glm5-serve"),
        SERVE_MODEL=str(folder / glm5_served.GGUF_NAME),
        SERVE_QUANTIZATION="gguf",
        SERVE_HF_CONFIG_PATH=str(folder),
        SERVE_TOKENIZER=str(folder),
        SERVE_SERVED_MODEL_NAME="tiny-glm5",
        SERVE_DTYPE="float32",
        SERVE_MAX_MODEL_LEN="256",
        SERVE_MAX_NUM_BATCHED_TOKENS=str(MAX_BATCHED),
        SERVE_MAX_NUM_SEQS="4",
        SERVE_SEED="0",
        SERVE_SPECULATIVE_CONFIG=json.dumps(profile_speculative_config()),
    )
    try:
        served.wait_ready(START_TIMEOUT)
        print(f"\ntiny GLM-5 GGUF server ready after {served.ready_after:.1f}s")
        yield served
    finally:
        served.terminate()


def test_ready_after_preflight_on_the_sparse_backend(server: Served) -> None:
    probe = run_entrypoint("probe", "--ready-file", str(server.ready))
    assert probe.returncode == 0, probe.stdout + probe.stderr
    log = server.log.read_text(errors="replace")
    assert "check-gguf: OK" in log, server.log_tail()
    assert "Using TRITON_MLA_SPARSE backend" in log


def test_greedy_ids_equal_transformers_with_mtp(server: Served, ref: dict) -> None:
    before = spec_counters(server)
    for prompt, want in zip(ref["prompts"], ref["tokens"], strict=True):
        t0 = time.perf_counter()
        reply = greedy(server, prompt, ref["new_tokens"])
        took = time.perf_counter() - t0
        got = reply["choices"][0]["token_ids"]
        print(f"\n{len(prompt)}-token prompt: {len(got)} tokens in {took:.2f}s "
              f"({len(got) / took:.1f} tok/s)\n  vLLM {got}\n  ref  {want}")
        assert got == want, f"prompt of {len(prompt)} tokens"
    after = spec_counters(server)
    k = profile_speculative_config()["num_speculative_tokens"]
    seen = {key: (after[key] - before.get(key, 0)) if key != "num_accepted_tokens_per_pos"
            else [a - b for a, b in zip(after[key], before[key] or [0] * k, strict=True)]
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                        "num_accepted_tokens_per_pos")}
    print(f"/metrics spec decode (k={k}): {seen}")
    assert seen["num_draft_tokens"] > 0 and seen["num_accepted_tokens"] > 0
    assert seen == glm5_served.echo_counters(ref["tokens"], k)


def test_status_shows_the_acceptance_of_mtp(server: Served) -> None:
    """`status` reads the same counters: acceptance and mean accepted length."""
    totals = spec_counters(server)
    drafts, proposed = totals["num_drafts"], totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    assert drafts > 0
    print("\n" + status_shows_acceptance(server, drafts, proposed, accepted))


def test_the_reference_tells_sparse_from_dense(ref: dict) -> None:
    """Dense attention (indexer bypassed) changes the tokens of a prompt longer
    than index_topk, so the equality above needs the indexer's top-k."""
    assert ref["dense_tokens"] != ref["tokens"]
    assert ref["dense_tokens"][0] == ref["tokens"][0]  # 10 + 16 tokens: mostly under index_topk


def test_prompt_logprobs_match_transformers(server: Served, ref: dict) -> None:
    model = server.get("/v1/models")["data"][0]["id"]
    worst = 0.0
    for prompt, tokens, want in zip(ref["prompts"], ref["tokens"], ref["logprobs"], strict=True):
        ids = prompt + tokens
        reply = server.post("/v1/completions", {
            "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 0,
        })
        rows = reply["choices"][0]["prompt_logprobs"]
        assert rows[0] is None and len(rows) == len(ids)
        got = [row[str(tok)]["logprob"] for row, tok in zip(rows[1:], ids[1:], strict=True)]
        diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
        worst = max(worst, diff)
        print(f"\n{len(ids)} tokens: max |logprob vLLM - transformers| = {diff:.2e}")
        assert diff <= LOGPROB_TOL, (len(prompt), got, want)
    print(f"worst {worst:.2e} (tolerance {LOGPROB_TOL})")
