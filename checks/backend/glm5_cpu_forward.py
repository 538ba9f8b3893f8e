"""Child script of tests/backend/test_glm5_cpu_forward.py: greedy tokens of a GLM-5
checkpoint through vLLM on CPU (TRITON_MLA_SPARSE, float32, enforce-eager).

    python checks/backend/glm5_cpu_forward.py MODEL_DIR REQUEST.json

REQUEST.json: {"prompts": [[ids...], ...], "max_tokens": N, "max_num_batched_tokens": M,
"llm": {more LLM(...) arguments, e.g. "quantization": "gguf", "hf_config_path": DIR,
"speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
"disable_log_stats": false}}.
Prints one line "GLM5-CPU-REPORT {json}" with the tokens per prompt and the backend;
with stats on (disable_log_stats false) also vLLM's speculative-decoding counters
(`spec_decode`: num_drafts, num_draft_tokens, num_accepted_tokens, accepted per
position), from LLM.get_metrics(); with a speculative config the draft's method and
config (`draft`).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def spec_decode_counters(llm) -> dict:  # type: ignore[no-untyped-def]
    """vllm:spec_decode_* counters (totals; per position as a list)."""
    out: dict = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name == metric.name:
            continue
        out[name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def main() -> None:
    model, request_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        req = json.load(f)
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=req["max_num_batched_tokens"],
        enable_chunked_prefill=True,
        gpu_memory_utilization=0.05,
        seed=0,
        **req.get("llm", {}),
    )
    t1 = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in req["prompts"]],
        SamplingParams(max_tokens=req["max_tokens"], temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    t2 = time.perf_counter()
    engine = llm.llm_engine
    cfg = engine.vllm_config
    report = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "block_size": cfg.cache_config.block_size,
        "chunked_prefill": cfg.scheduler_config.enable_chunked_prefill,
        "load_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 2),
    }
    if not req.get("llm", {}).get("disable_log_stats", True):
        report["spec_decode"] = spec_decode_counters(llm)
    if cfg.speculative_config is not None:
        draft = cfg.speculative_config.draft_model_config.hf_config
        report["draft"] = {
            "method": cfg.speculative_config.method,
            "num_speculative_tokens": cfg.speculative_config.num_speculative_tokens,
            "architectures": list(draft.architectures or []),
            "indexer_rope_interleave": getattr(draft, "indexer_rope_interleave", None),
        }
    print("GLM5-CPU-REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
