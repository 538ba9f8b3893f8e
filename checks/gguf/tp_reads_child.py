"""Child process of tests/gguf/test_gguf_reads.py: the tiny GLM-5 GGUF through vLLM 0.32's
GGUF loader as TP rank R of W (tp-standin: vLLM's TP group told the world size and rank
this process plays), once with every slice read from the file (FRONTIER_GGUF_READS=pread,
plugin patch 0008) and once copied through the map as before (mmap).

    python checks/gguf/tp_reads_child.py GGUF CONFIG_DIR W:R[:ep] ...

Prints one RESULT line: per case and mode, the sha256 of every parameter this rank
holds (data, or each shard of a merged layer) and gguf_reads' byte counters.
The sparse-MLA backend is chosen for construction only (vllm_load_probe's stub).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.nn.parameter import UninitializedParameter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_load_probe import stub_sparse_backend  # noqa: E402


def digest(model: torch.nn.Module) -> dict[str, str]:
    out = {}
    for name, param in model.named_parameters():
        parts = list(getattr(param, "data_container", []) or [])
        if not isinstance(param, UninitializedParameter) and param.data.numel():
            parts.insert(0, param.data)
        h = hashlib.sha256()
        for part in parts:
            h.update(str(tuple(part.shape)).encode())
            h.update(part.detach().contiguous().view(torch.uint8).numpy().tobytes())
        out[name] = h.hexdigest() if parts else "empty"
    return out


def main(gguf: str, config_dir: str, cases: list[str]) -> dict:
    import vllm_gguf_plugin
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        parallel_state,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_gguf_plugin import gguf_reads
    from vllm_gguf_plugin import loader as gguf_loader

    vllm_gguf_plugin.register()
    stub_sparse_backend()
    gguf_loader.process_weights_after_loading = lambda *a, **k: None
    report: dict = {}
    started = False
    for case in cases:
        world, rank, *rest = case.split(":")
        tp, r, ep = int(world), int(rank), rest == ["ep"]
        for mode in gguf_reads.MODES:
            os.environ[gguf_reads.MODE_ENV] = mode
            args = EngineArgs(model=gguf, hf_config_path=config_dir, tokenizer=config_dir,
                              skip_tokenizer_init=True, dtype="float32", max_model_len=256,
                              max_num_batched_tokens=256, max_num_seqs=2, enforce_eager=True)
            config = args.create_engine_config()
            config.parallel_config.enable_expert_parallel = ep
            with set_current_vllm_config(config):
                if not started:
                    init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0,
                                                 backend="gloo")
                    initialize_model_parallel(1, 1)
                    started = True
                group = parallel_state.get_tp_group()  # tp-standin
                group.world_size, group.rank_in_group, group.ranks = tp, r, list(range(tp))
                config.parallel_config.tensor_parallel_size = tp
                gguf_reads.STATS.reset()
                model = get_model_loader(config.load_config).load_model(
                    config, config.model_config)
            report[f"{case}/{mode}"] = {"params": digest(model),
                                        "stats": gguf_reads.STATS.as_dict()}
            del model
    return report


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])))
