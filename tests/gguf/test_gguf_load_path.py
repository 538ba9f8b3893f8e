"""The GGUF load path: one header parse, zero-copy views, rank-aware reads, progress.

Real GGUF files written with gguf-py; gguf-py's own GGUFReader is the reference for
what each tensor holds. Page-cache residency (mincore, after posix_fadvise
DONTNEED) shows which bytes a step actually made the kernel read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from vllm_gguf_plugin import gguf_headers, gguf_tensors
from vllm_gguf_plugin.gguf_headers import read_array, read_header

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gguf"))
from bench_gguf_load import PAGE, resident  # noqa: E402
from synthetic_glm5 import evict  # noqa: E402


def _write(path: Path, tokens: int = 1000, rows: int = 512) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"t{i}" for i in range(tokens)])
    w.add_token_scores([float(i) for i in range(tokens)])
    w.add_array("small.list", [1, 2, 3])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((rows, 256)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal(64).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((rows, 4096)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_file_is_parsed_once_until_it_changes(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf")
    first = read_header(path)
    assert read_header(path) is first
    _write(path, tokens=1200)  # rewritten: size and mtime change
    again = read_header(path)
    assert again is not first and again.array_lengths["tokenizer.ggml.tokens"] == 1200


def test_large_arrays_are_skipped_and_read_on_request(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf")
    header = read_header(path)
    assert header.fields["tokenizer.ggml.tokens"] is None  # not decoded by the parse
    assert header.fields["small.list"] == [1, 2, 3]
    reader = gguf.GGUFReader(path)
    tokens = reader.get_field("tokenizer.ggml.tokens").contents()
    assert read_array(header, "tokenizer.ggml.tokens") == tokens
    assert read_array(header, "tokenizer.ggml.scores") == pytest.approx(
        reader.get_field("tokenizer.ggml.scores").contents())
    assert read_array(header, "small.list") == [1, 2, 3]
    with pytest.raises(KeyError, match="no array general.architecture"):
        read_array(header, "general.architecture")


def test_views_hold_what_gguf_py_reads_without_copying(tiny_gguf: Path) -> None:
    """Every tensor of the tiny GLM-5 file (F32, F16, BF16, Q8_0, Q4_0, Q4_K)."""
    reference = {t.name: t for t in gguf.GGUFReader(tiny_gguf).tensors}
    infos = read_header(tiny_gguf).tensors
    assert {i.type_name for i in infos} >= {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K"}
    for info in infos:
        view = gguf_tensors.tensor_view(info)
        want = np.asarray(reference[info.name].data)
        if info.type_name == "BF16":
            got = view.view(torch.int16).numpy().view(np.uint8).reshape(-1)
            want = want.view(np.uint8).reshape(-1)
        else:
            got = view.numpy()
        assert got.shape == want.shape or info.type_name == "BF16", info.name
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8),
                                      want.reshape(-1).view(np.uint8), err_msg=info.name)
        # A second view of the same tensor is the same memory: nothing was copied.
        assert gguf_tensors.tensor_view(info).data_ptr() == view.data_ptr()


def test_a_rank_reads_only_the_rows_it_copies_tp_standin(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in: `_sharded()` says this process is one rank of eight (no vLLM group)."""
    monkeypatch.setattr(gguf_tensors, "_sharded", lambda: True)
    path = _write(tmp_path / "big.gguf", rows=4096)  # c.weight: 4096 rows of 4352 bytes
    info = next(t for t in read_header(path).tensors if t.name == "c.weight")
    gguf_tensors.release_maps()
    evict([path])
    view = gguf_tensors.tensor_view(info)
    assert resident(path, [(info.offset, info.nbytes)])[0] <= 2 * PAGE  # a view reads nothing
    tp, rank = 8, 3
    rows = view.shape[0] // tp
    mine = view.narrow(0, rank * rows, rows)
    gguf_tensors.will_read(mine)  # what the plugin's loaders do before their copy
    kept = mine.clone()
    read = resident(path, [(info.offset, info.nbytes)])[0]
    share = info.nbytes // tp
    assert kept.numel() == share
    assert share <= read <= share + 2 * PAGE, (read, share)
    # The next rank's rows, unhinted: with readahead off (MADV_RANDOM on sharded
    # maps) a fault reads its own page only, so still nothing beyond the slice.
    view.narrow(0, (rank + 1) * rows, rows).clone()
    assert resident(path, [(info.offset, info.nbytes)])[0] <= 2 * share + 4 * PAGE


@pytest.mark.parametrize(("name", "owned", "draft", "skipped"), [
    ("blk.3.attn_q_a.weight", range(0, 4), False, False),
    ("blk.5.attn_q_a.weight", range(0, 4), False, True),   # another pipeline stage
    ("blk.5.attn_q_a.weight", None, False, False),         # no pipeline parallelism
    ("blk.78.nextn.eh_proj.weight", None, False, True),    # MTP block, main model
    ("blk.78.nextn.eh_proj.weight", None, True, False),    # MTP block, the draft
    ("token_embd.weight", range(0, 4), False, False),
])
def test_what_a_stage_leaves_unread(name: str, owned: range | None, draft: bool,
                                    skipped: bool) -> None:
    assert gguf_tensors.other_stage(name, 78, owned, draft_blocks=draft) is skipped


def test_progress_is_logged_by_bytes_and_kept_in_a_file(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(gguf_tensors.PROGRESS_DIR_ENV, str(tmp_path))
    now = [100.0]
    caplog.set_level("INFO", logger="vllm.gguf_plugin.load")
    progress = gguf_tensors.LoadProgress(10 * 2**30, files=3, clock=lambda: now[0])
    record = json.loads((tmp_path / "rank-0.json").read_text())
    assert (record["done_bytes"], record["finished"]) == (0, False)
    assert record["total_bytes"] == 10 * 2**30
    for _ in range(4):
        now[0] += 1
        progress.advance(int(2.5 * 2**30 / 2))
    lines = [r.getMessage() for r in caplog.records if "GGUF weights rank 0" in r.getMessage()]
    assert lines[0] == "GGUF weights rank 0: loading 10.00 GiB from 3 file(s)"
    assert lines[-1] == ("GGUF weights rank 0: 5.00 GiB of 10.00 GiB (50%), 1.25 GiB/s, "
                         "4 s left")
    assert len(lines) == 5  # 12%, 25%, 37%, 50%: one line per 10% step crossed
    progress.finish()
    record = json.loads((tmp_path / "rank-0.json").read_text())
    assert record["finished"] and record["percent"] == 100 and record["pid"] == os.getpid()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_progress_file_moves_between_the_ten_percent_lines(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher ends a start whose bytes stop moving: a slow disk's 10% takes minutes,
    so the file is rewritten every WRITE_EVERY seconds in between."""
    monkeypatch.setenv(gguf_tensors.PROGRESS_DIR_ENV, str(tmp_path))
    now = [0.0]
    progress = gguf_tensors.LoadProgress(100 * 2**30, files=1, clock=lambda: now[0])
    seen = []
    for _ in range(5):  # 0.5% a step, a step every 3 s: no 10% line yet
        now[0] += 3.0
        progress.advance(2**29)
        seen.append(json.loads((tmp_path / "rank-0.json").read_text())["done_bytes"])
    assert seen == [n * 2**29 for n in range(1, 6)]
    now[0] += 0.5  # sooner than WRITE_EVERY: the file waits
    progress.advance(2**29)
    assert json.loads((tmp_path / "rank-0.json").read_text())["done_bytes"] == 5 * 2**29


def test_ahead_hands_errors_over_and_stops_with_its_consumer() -> None:
    def failing():  # type: ignore[no-untyped-def]
        yield 1
        raise ValueError("bad tensor")

    got = []
    with pytest.raises(ValueError, match="bad tensor"):
        for item in gguf_tensors.ahead(failing()):
            got.append(item)
    assert got == [1]

    made = []

    def endless():  # type: ignore[no-untyped-def]
        i = 0
        while True:
            made.append(i)
            yield i
            i += 1

    stream = gguf_tensors.ahead(endless(), depth=2)
    assert next(stream) == 0
    stream.close()  # joins the producer
    count = len(made)
    time.sleep(0.3)
    assert len(made) == count <= 5


def test_the_plugin_iterator_yields_views_in_its_old_names(tiny_gguf: Path) -> None:
    from vllm_gguf_plugin.weight_utils import gguf_quant_weights_iterator_multi

    reference = {t.name: t for t in gguf.GGUFReader(tiny_gguf).tensors}
    names = {"blk.0.attn_q_a.weight": "model.layers.0.self_attn.q_a_proj.weight",
             "output_norm.weight": "model.norm.weight"}
    got = dict(gguf_quant_weights_iterator_multi([str(tiny_gguf)], names))
    q_type = reference["blk.0.attn_q_a.weight"].tensor_type
    plain = q_type.name in ("F32", "F16", "BF16")
    key = "model.layers.0.self_attn.q_a_proj." + ("weight" if plain else "qweight")
    assert set(got) == {key, "model.norm.weight"} | (
        set() if plain else {"model.layers.0.self_attn.q_a_proj.qweight_type"})
    np.testing.assert_array_equal(got["model.norm.weight"].numpy(),
                                  reference["output_norm.weight"].data)
    if not plain:
        assert int(got["model.layers.0.self_attn.q_a_proj.qweight_type"]) == int(q_type)
    assert gguf_headers.read_header(tiny_gguf) is read_header(tiny_gguf)
