"""Load progress: the plugin's per-rank files, as `serve` prepares and the watcher shows them.

The plugin is imported at collection: importing vLLM runs `file` (cpuinfo), which the
entrypoint tests' no-process tripwire would refuse inside a test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entrypoint import load_progress
from entrypoint.statusfile import read_json
from entrypoint.watcher import Tracker, WatchConfig

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
