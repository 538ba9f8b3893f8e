"""Load progress: the plugin's per-rank files, as `serve` prepares and the watcher shows them.

The plugin is imported at collection: importing vLLM runs `file` (cpuinfo), which the
entrypoint tests' no-process tripwire would refuse inside a test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entrypoint.watch import load_progress
from entrypoint.watch.statusfile import read_json
from entrypoint.watch.watcher import Tracker, WatchConfig

gguf_tensors = pytest.importorskip("vllm_gguf_plugin.gguf_tensors")
pytestmark = pytest.mark.vllm


def status_of(tracker: Tracker) -> dict:
    data = read_json(tracker.config.status_file)
    assert data is not None
    return data


def test_loading_ranks_show_in_the_status_until_ready(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks of the patched plugin's real LoadProgress, summed by the watcher."""
    assert load_progress.ENV == gguf_tensors.PROGRESS_DIR_ENV  # one name on both sides
    folder = load_progress.folder_for(str(tmp_path / "status.json"))
    load_progress.clear(folder)
    (Path(folder) / "rank-9.json").write_text("{}")  # an earlier run's leftovers...
    load_progress.clear(folder)  # ...are gone before the next start
    assert list(Path(folder).iterdir()) == []
    blocked = tmp_path / "blocked.load"
    blocked.write_text("a file where the folder goes")
    assert load_progress.clear(str(blocked)) == f"{blocked}: File exists"
    config = WatchConfig(pid=os.getpid(), base_url="http://127.0.0.1:1",
                         ready_file=str(tmp_path / "ready"),
                         status_file=str(tmp_path / "status.json"), argv_digest="sha256:abc",
                         load_progress_dir=folder)
    tracker = Tracker(WatchConfig.from_json(config.to_json()))
    monkeypatch.setenv(load_progress.ENV, folder)
    ranks = []
    for rank in (0, 1):
        monkeypatch.setattr(gguf_tensors, "_rank", lambda rank=rank: rank)
        ranks.append(gguf_tensors.LoadProgress(1000, files=2))
    ranks[0].advance(500)
    ranks[1].finish()
    tracker.record("GET /health: connection refused")
    loading = status_of(tracker)["loading"]
    assert (loading["ranks"], loading["finished_ranks"]) == (2, 1)
    assert (loading["done_bytes"], loading["total_bytes"], loading["percent"]) == (1500, 2000, 75)
    assert loading["per_rank"]["0"]["percent"] == 50
    tracker.record(None)
    assert "loading" not in status_of(tracker)


def test_the_plugins_last_line_is_the_weights_loaded_milestone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On the GGUF path vLLM logs no "Loading weights took"; the plugin's own last
    progress line of a rank marks the step instead."""
    from entrypoint.watch import steps
    from entrypoint.watch.log_capture import milestone

    monkeypatch.delenv(load_progress.ENV, raising=False)
    monkeypatch.setattr(gguf_tensors, "_rank", lambda: 3)
    ticks = iter([0.0, 2.0])
    with caplog.at_level("INFO", logger="vllm.gguf_plugin.load"):
        progress = gguf_tensors.LoadProgress(3 * 2**30, files=1, clock=lambda: next(ticks))
        progress.finish()
    last = caplog.records[-1].getMessage()
    assert last == "GGUF weights rank 3: 3.00 GiB of 3.00 GiB (100%), 1.50 GiB/s, done"
    assert milestone(last) == (steps.LOADED, "3.00 GiB in 2.0 s at 1.50 GiB/s (rank 3)")
    midway = "GGUF weights rank 3: 1.20 GiB of 3.00 GiB (40%), 0.60 GiB/s, 3 s left"
    assert milestone(midway) == (steps.LOADING, "rank 3: 1.20 GiB of 3.00 GiB (40%)")
    first = caplog.records[0].getMessage()
    assert milestone(first) == (steps.LOADING, "rank 3: loading 3.00 GiB from 1 file(s)")
