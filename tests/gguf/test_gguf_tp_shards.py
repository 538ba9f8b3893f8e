"""Each TP rank keeps its own rows of merged (gate_up) and QKV GGUF weights.

vLLM's real MergedColumnParallelLinear / QKVParallelLinear with the plugin's GGUF
method, loaded in a child process per rank with a stand-in for the TP group
(checks/gguf/tp_shards_child.py). Before plugin patch 0007 every rank kept rank 0's rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
CHILD = Path(__file__).resolve().parents[2] / "checks" / "gguf" / "tp_shards_child.py"


def shards_tp_standin(world: int, rank: int) -> dict[str, list[int]]:
    done = subprocess.run([sys.executable, str(CHILD), str(world), str(rank)],
                          capture_output=True, text=True, timeout=300)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize("rank", [0, 1])
def test_merged_and_qkv_rows_follow_the_rank_tp_standin(rank: int) -> None:
    got = shards_tp_standin(2, rank)
    half = list(range(4 * rank, 4 * rank + 4))
    assert got["gate_up.0"] == half
    assert got["gate_up.1"] == [100 + i for i in half]
    assert got["qkv.q"] == half
    # One KV head and two ranks: both keep all of it (vLLM's num_kv_head_replicas).
    assert got["qkv.k"] == [0, 1] and got["qkv.v"] == [0, 1]


def test_one_rank_keeps_every_row_tp_standin() -> None:
    got = shards_tp_standin(1, 0)
    assert got["gate_up.0"] == list(range(8)) and got["qkv.q"] == list(range(8))
