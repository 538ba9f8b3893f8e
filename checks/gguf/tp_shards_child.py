"""Child process of tests/gguf/test_gguf_tp_shards.py: real vLLM merged/QKV layers with the
plugin's GGUF method, loaded as TP rank R of W (tp-standin: vLLM's TP group told
the world size and rank this process plays). Prints, per shard, the first byte of
each row it kept; every source row is filled with its own index."""

from __future__ import annotations

import json
import sys
import tempfile

import torch


def rows(n: int, row_bytes: int = 34) -> torch.Tensor:
    """n rows of Q8_0 bytes (one 32-value block each) tagged by row index."""
    return (torch.arange(n, dtype=torch.int32) % 251).to(torch.uint8)[:, None].repeat(1, row_bytes)


def main() -> None:
    world, rank = int(sys.argv[1]), int(sys.argv[2])
    import vllm_gguf_plugin
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        parallel_state,
    )
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
    from vllm_gguf_plugin.quantization.config import GGUFConfig

    vllm_gguf_plugin.register()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        group = parallel_state.get_tp_group()
        group.world_size, group.rank_in_group, group.ranks = world, rank, list(range(world))

        q8 = 8  # GGMLQuantizationType.Q8_0
        out: dict[str, list[int]] = {}
        gate_up = MergedColumnParallelLinear(32, [8, 8], bias=False, quant_config=GGUFConfig(),
                                             prefix="mlp.gate_up_proj")
        for shard in (0, 1):
            gate_up.qweight.weight_loader(gate_up.qweight, rows(8) + 100 * shard, shard)
            gate_up.qweight_type.weight_loader(gate_up.qweight_type, torch.tensor(q8), shard)
        for shard, data in zip(gate_up.qweight.shard_id, gate_up.qweight.data_container,
                               strict=True):
            out[f"gate_up.{shard}"] = data[:, 0].tolist()

        # 4 query heads, 1 KV head of size 2: at TP 2 both ranks keep the KV head.
        qkv = QKVParallelLinear(32, 2, 4, 1, bias=False, quant_config=GGUFConfig(),
                                prefix="attn.qkv_proj")
        for shard, n in (("q", 8), ("k", 2), ("v", 2)):
            qkv.qweight.weight_loader(qkv.qweight, rows(n), shard)
            qkv.qweight_type.weight_loader(qkv.qweight_type, torch.tensor(q8), shard)
        for shard, data in zip(qkv.qweight.shard_id, qkv.qweight.data_container, strict=True):
            out[f"qkv.{shard}"] = data[:, 0].tolist()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
