"""GGUF slices read from the file into their destination (plugin patch 0008, gguf_reads).

Real GGUF files written with gguf-py; the map view (gguf_tensors) is the reference for
what each slice holds. The vLLM case loads the tiny GLM-5 GGUF through vLLM 0.32's
loader as one TP rank (tp-standin: the TP group is told its size and rank) once with
reads and once through the map, where vLLM's own expert loader cuts the experts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from vllm_gguf_plugin import gguf_reads, gguf_tensors
from vllm_gguf_plugin.gguf_headers import read_header

CHILD = Path(__file__).resolve().parents[2] / "checks" / "gguf" / "tp_reads_child.py"


def _write(path: Path, rows: int = 1024) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(1)
    q4 = gguf.quants.quantize(rng.standard_normal((rows, 2048)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("f.weight", rng.standard_normal((rows, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(gguf_reads.MODE_ENV, raising=False)
    path = _write(tmp_path / "m.gguf")
    gguf_tensors.release_maps()
    gguf_reads.close_files()
    gguf_reads.STATS.reset()
    infos = {t.name: t for t in read_header(path).tensors}
    yield path, {n: gguf_tensors.tensor_view(i) for n, i in infos.items()}
    gguf_tensors.release_maps()
    gguf_reads.close_files()


def test_a_row_slice_is_read_into_the_destination(views, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _, v = views
    monkeypatch.setattr(gguf_reads, "PIECE", 4096)  # many pieces: the reader threads run
    src = v["q.weight"].narrow(0, 384, 256)
    dest = torch.empty_like(src)
    gguf_reads.copy_into(dest, src)
    assert torch.equal(dest, src)
    assert gguf_reads.STATS.pread == src.numel() and gguf_reads.STATS.mapped == 0


def test_a_column_slice_is_gathered(views) -> None:  # type: ignore[no-untyped-def]
    _, v = views
    src = v["q.weight"].narrow(1, 3 * 34 * 8, 34 * 8)  # rank 3 of 8: 8 Q8_0 blocks a row
    dest = torch.empty(src.shape, dtype=src.dtype)
    gguf_reads.copy_into(dest, src)
    assert torch.equal(dest, src)
    assert gguf_reads.STATS.gathered == src.numel() and gguf_reads.STATS.pread == 0


def test_plain_tensors_and_mmap_mode(views, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _, v = views
    src = v["f.weight"][10:20]
    dest = torch.empty_like(src)
    gguf_reads.copy_into(dest, src)
    assert torch.equal(dest, src) and gguf_reads.STATS.pread == src.numel() * 4
    monkeypatch.setenv(gguf_reads.MODE_ENV, "mmap")
    again = torch.zeros_like(src)
    gguf_reads.copy_into(again, src)
    assert torch.equal(again, src) and gguf_reads.STATS.mapped == src.numel() * 4


def test_a_tensor_that_is_no_view_is_copied_as_is(views) -> None:  # type: ignore[no-untyped-def]
    src = torch.arange(10.0)
    dest = torch.empty(10)
    gguf_reads.copy_into(dest, src)
    assert torch.equal(dest, src) and gguf_reads.STATS.copied() == 0


def test_a_file_cut_short_is_named(views) -> None:  # type: ignore[no-untyped-def]
    path, v = views
    src = v["q.weight"]
    os.truncate(path, src.numel() // 2)  # cuts q.weight; the map still spans the old size
    with pytest.raises(OSError, match=r"GGUF file ended early: .*m\.gguf"):
        gguf_reads.copy_into(torch.empty_like(src), src)


@pytest.mark.parametrize(("name", "value"), [("FRONTIER_GGUF_READS", "fast"),
                                             ("FRONTIER_GGUF_READERS", "0"),
                                             ("FRONTIER_GGUF_READERS", "many")])
def test_bad_settings_are_named(monkeypatch, name: str, value: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(name, value)
    check = gguf_reads.mode if name == gguf_reads.MODE_ENV else gguf_reads.readers
    with pytest.raises(ValueError, match=name):
        check()


def test_serve_refuses_what_the_reader_refuses() -> None:
    """The entrypoint checks these settings before the start; the ranks read the same."""
    from entrypoint.start import preflight

    assert (preflight.GGUF_READS, preflight.GGUF_READS_MODES) == (
        gguf_reads.MODE_ENV, gguf_reads.MODES)
    assert (preflight.GGUF_READERS, preflight.GGUF_READERS_MAX) == (
        gguf_reads.READERS_ENV, gguf_reads.READERS_MAX)


@pytest.mark.vllm
@pytest.mark.slow
def test_each_rank_holds_what_vllms_own_cut_gives_tp_standin(tiny_gguf: Path) -> None:
    """Every parameter of TP2 rank 1, TP2 rank 0 with expert parallelism and TP4 rank 3,
    byte for byte, read from the file (our cut of the experts) and through the map
    (vLLM's RoutedExperts loader's cut)."""
    cases = ["2:1", "2:0:ep", "4:3"]
    done = subprocess.run([sys.executable, str(CHILD), str(tiny_gguf), str(tiny_gguf.parent),
                           *cases], capture_output=True, text=True, timeout=600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(lines[-1].removeprefix("RESULT "))
    for case in cases:
        read, mapped = report[f"{case}/pread"], report[f"{case}/mmap"]
        assert read["params"] == mapped["params"], case
        assert sum(1 for d in read["params"].values() if d != "empty") >= 60, case
        assert read["stats"]["mapped"] == 0 and read["stats"]["pread"] > 0, case
        assert mapped["stats"]["pread"] == 0 and mapped["stats"]["gathered"] == 0, case
        if not case.endswith(":ep"):  # without EP, w2 and o_proj columns are gathered
            assert read["stats"]["gathered"] > 0, case
