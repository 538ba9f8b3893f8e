"""Child script of tests/backend/test_dflash_cpu.py: greedy tokens of a target through
vLLM on CPU (float32, enforce-eager), alone and with DFlash drafters, one engine after
the other in this process (one vLLM import for all of them).

    python checks/backend/dflash_cpu.py MODEL_DIR REQUEST.json

REQUEST.json: {"prompts": [[ids...], ...], "max_tokens": N, "runs": [{"name": NAME,
"speculative_config": {"method": "dflash", "model": DRAFTER_DIR,
"num_speculative_tokens": K} or null for the target alone}, ...], "llm": {more LLM(...)
arguments}}. Prints one line "DFLASH-CPU-REPORT {json}" per run: its name, the tokens
per prompt, the spec-decode counters of LLM.get_metrics()
(spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens,
_num_accepted_tokens_per_pos), the drafts the drafter proposed at every step
(recorded around the model runner's propose_draft_token_ids) and timings.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _spec_counters(metrics) -> dict:
    out: dict = {}
    for m in metrics:
        if not m.name.startswith("vllm:spec_decode"):
            continue
        name = m.name.removeprefix("vllm:")
        if hasattr(m, "values"):  # Vector: one count per draft position
            out[name] = [int(v) for v in m.values]
        else:
            out[name] = int(m.value)
    return out


def _record_drafts() -> dict[str, list[list[int]]]:
    """Wrap the model runner's propose_draft_token_ids: every step's drafts by request
    id (this process runs the engine, VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    drafts: dict[str, list[list[int]]] = {}
    inner = GPUModelRunner.propose_draft_token_ids
    if hasattr(inner, "recorded"):
        inner = inner.inner

    def propose(self, *args, **kwargs):
        out = inner(self, *args, **kwargs)
        rows = out.tolist() if hasattr(out, "tolist") else out
        for req_id, row in zip(self.input_batch.req_ids, rows, strict=False):
            drafts.setdefault(req_id, []).append(list(row))
        return out

    propose.recorded = True  # type: ignore[attr-defined]
    propose.inner = inner  # type: ignore[attr-defined]
    GPUModelRunner.propose_draft_token_ids = propose  # type: ignore[method-assign]
    return drafts


def run_one(model: str, req: dict, spec: dict | None) -> dict:
    from vllm import LLM, SamplingParams

    drafts = _record_drafts() if spec else {}

    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        gpu_memory_utilization=0.05,
        seed=0,
        disable_log_stats=False,
        speculative_config=spec,
        **req.get("llm", {}),
    )
    t1 = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in req["prompts"]],
        SamplingParams(max_tokens=req["max_tokens"], temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    t2 = time.perf_counter()
    sc = llm.llm_engine.vllm_config.speculative_config
    report = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "spec": _spec_counters(llm.get_metrics()),
        "method": sc.method if sc else None,
        "num_speculative_tokens": sc.num_speculative_tokens if sc else 0,
        "draft_architectures": list(sc.draft_model_config.architectures) if sc else [],
        # each prompt's drafts, one list of num_speculative_tokens ids per step
        # (the engine's request id is the output's plus a "-suffix")
        "drafts": [next((d for r, d in drafts.items() if r.rsplit("-", 1)[0] == o.request_id),
                        []) for o in outs],
        "load_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 2),
    }
    del llm, outs
    gc.collect()
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    return report


def main() -> None:
    model, request_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        req = json.load(f)
    for run in req["runs"]:
        report = {"name": run["name"]} | run_one(model, req, run.get("speculative_config"))
        print("DFLASH-CPU-REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
