"""bench/kernels/bench_sparse_mla.py: how many calls one timed graph replay captures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
import bench_sparse_mla as bench  # noqa: E402

L2 = 60_000_000  # the H200's, as torch reports it there


@pytest.mark.parametrize("tokens", [1, 2, 16, 32, 64, 128, 1024, 4096])
def test_a_replay_is_whole_rounds_of_cold_sets(tokens: int) -> None:
    n_sets = bench.index_sets(tokens, L2)
    calls = bench.calls_per_replay(tokens, n_sets)
    assert calls % n_sets == 0  # a set never follows itself, from one replay to the next
    assert n_sets * bench.gathered_bytes(tokens) >= 3 * L2
    gathered = calls * bench.gathered_bytes(tokens)
    enough = calls >= bench.REPLAY_CALLS or gathered >= bench.REPLAY_BYTES
    assert enough, (tokens, n_sets, calls)
    assert calls < bench.REPLAY_CALLS + n_sets  # no more rounds than that takes


def test_batch_64_no_longer_times_two_calls_a_replay() -> None:
    # The replay's own launch (~10 us) was split over two calls here.
    assert bench.calls_per_replay(64, bench.index_sets(64, L2)) == 28  # 27 wanted, 2 sets
    assert bench.calls_per_replay(4096, bench.index_sets(4096, L2)) == 2


def test_the_capture_cycles_through_the_sets() -> None:
    fns = [lambda i=i: i for i in range(3)]
    order = [f() for f in bench.replay_order(fns, bench.calls_per_replay(32, 3))]
    assert order == [0, 1, 2] * 11
    assert [f() for f in bench.replay_order(fns, 0)] == [0, 1, 2]  # never fewer than the sets


def test_the_table_refuses_to_run_without_its_peers(monkeypatch, tmp_path, capsys) -> None:
    # A device call that did not carry .bench-peers printed a table with no peer columns
    # and exited 0; the targets are set against the peers timed in the same run.
    monkeypatch.setattr(bench, "PEERS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench_sparse_mla.py", "run", "--heads", "8"])
    assert bench.main() == 2
    err = capsys.readouterr().err
    assert "bench_sparse_mla: error: peers not prepared:" in err
    assert f"hand ({tmp_path}/triton_decode_attention.py)" in err
    assert f"flashmla ({tmp_path}/vllm/_flashmla_C.abi3.so)" in err
    assert "--no-peers" in err and "Traceback" not in err
    (tmp_path / "vllm").mkdir()
    (tmp_path / "triton_decode_attention.py").write_text("")
    (tmp_path / "vllm/_flashmla_C.abi3.so").write_bytes(b"")
    assert bench.peers_missing() == []


def test_the_table_without_a_gpu_is_one_error(monkeypatch, tmp_path, capsys) -> None:
    for name in bench.PEER_FILES.values():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(bench, "PEERS", tmp_path)
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["bench_sparse_mla.py", "run", "--heads", "8"])
    assert bench.main() == 2
    assert "bench_sparse_mla: error: no CUDA GPU here" in capsys.readouterr().err
