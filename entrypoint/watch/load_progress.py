"""Per-rank GGUF load progress, as the patched plugin writes it and the watcher shows it.

`serve` names a folder beside the status file in FRONTIER_LOAD_PROGRESS_DIR (the
plugin's gguf_tensors.py reads the same name) and empties it before each start,
so a file there is always this run's. Each loading rank keeps `rank-<r>.json`
there (done and total bytes, written atomically); the watcher sums them into the
status JSON's `loading` entry. Stdlib only: the watcher imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

ENV = "FRONTIER_LOAD_PROGRESS_DIR"


def folder_for(status_file: str) -> str:
    """The progress folder of one status file (one per served instance)."""
    return status_file + ".load"


def clear(folder: str) -> str | None:
    """Create *folder* and remove an earlier run's rank files from it.

    Returns why that failed (e.g. a file where the folder should be), or None.
    Progress is advice: the caller turns it off rather than refusing to start.
    """
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("rank-*.json"):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    return None


def summary(folder: str) -> dict[str, Any] | None:
    """Bytes loaded over all ranks so far, or None before any rank has started."""
    ranks: dict[str, dict[str, Any]] = {}
    try:
        files = sorted(Path(folder).glob("rank-*.json"))
    except OSError:
        return None
    for file in files:
        try:
            record = json.loads(file.read_text())
            done, total = int(record["done_bytes"]), int(record["total_bytes"])
            ranks[str(int(record["rank"]))] = {
                "done_bytes": done, "total_bytes": total,
                "percent": 100 if total <= 0 else min(100, done * 100 // total),
                "finished": bool(record.get("finished")),
            }
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a rank file being replaced, or not ours: the next round reads it
    if not ranks:
        return None
    done = sum(r["done_bytes"] for r in ranks.values())
    total = sum(r["total_bytes"] for r in ranks.values())
    return {
        "ranks": len(ranks),
        "finished_ranks": sum(r["finished"] for r in ranks.values()),
        "done_bytes": done,
        "total_bytes": total,
        "percent": 100 if total <= 0 else min(100, done * 100 // total),
        "per_rank": ranks,
    }


def export(folder: str | None, environ: dict[str, str] | os._Environ[str]) -> None:
    """Tell vLLM's processes (the plugin) where to write."""
    if folder:
        environ[ENV] = folder
