"""bench/kernels/bench_sparse_mla.py: how many calls one timed graph replay captures."""

from __future__ import annotations

import statistics
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


def test_rounds_turn_the_order_and_take_each_entrys_median() -> None:
    seen: list[str] = []
    reads = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0]), "c": iter([7.0, 7.0, 6.0])}

    def timer(fns: list, calls: int) -> float:
        assert calls == 28
        seen.append(fns[0])
        return next(reads[fns[0]])

    runs, errors = bench.time_rounds({n: [n] for n in "abc"}, 28, 3, timer)
    assert seen == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert runs == {"a": [5.0, 1.0, 3.0], "b": [2.0, 9.0, 4.0], "c": [7.0, 7.0, 6.0]}
    medians = {n: statistics.median(v) for n, v in runs.items()}
    assert medians == {"a": 3.0, "b": 4.0, "c": 7.0} and errors == {}
    seen.clear()
    reads = {"a": iter([5.0]), "b": iter([2.0])}
    assert bench.time_rounds({"a": ["a"], "b": ["b"]}, 28, 1, timer)[0] == {"a": [5.0], "b": [2.0]}
    assert seen == ["a", "b"]  # one round keeps the order given (peers first in the table)


def test_an_entry_whose_timing_raises_is_dropped_and_named() -> None:
    order: list[str] = []

    def timer(fns: list, calls: int) -> float:
        order.append(fns[0])
        if fns[0] == "ours":
            raise RuntimeError("launch failed")
        return 1.0

    runs, errors = bench.time_rounds({"fm": ["fm"], "ours": ["ours"]}, 2, 4, timer)
    assert runs == {"fm": [1.0] * 4}
    assert errors == {"ours": "RuntimeError: launch failed"}
    assert order.count("ours") == 1 and order.count("fm") == 4


def test_rounds_out_of_range_is_one_error(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_sparse_mla.py", "run", "--rounds", "0"])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    assert "--rounds must be 1..99, got 0" in capsys.readouterr().err
