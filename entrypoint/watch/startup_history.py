"""The step durations of the last start that became ready, kept for the next start's ETA.

The watcher writes `startup-history.json` beside the status file when a start first
becomes ready; `status` and `wait` read it while the next start runs. The status
folder sits on a volume in compose and Kubernetes, so it outlives the container.
Stdlib-only.
"""

from __future__ import annotations

import os
from typing import Any

from entrypoint.watch.statusfile import read_json, write_json_atomic

NAME = "startup-history.json"


def path_for(status_file: str) -> str:
    return os.path.join(os.path.dirname(status_file) or ".", NAME)


def save(path: str, steps: list[dict[str, Any]], argv_digest: str, ready_at: float) -> None:
    """`steps`: Steps.durations() of the start, up to readiness."""
    started = steps[0]["at"] if steps else ready_at
    write_json_atomic(path, {
        "argv_digest": argv_digest,
        "started": started,
        "ready_at": ready_at,
        "total_s": round(ready_at - started, 1),
        "steps": [{"step": s["step"], "seconds": s["seconds"], "detail": s.get("detail")}
                  for s in steps],
    })


def load(path: str) -> dict[str, Any] | None:
    history = read_json(path)
    if not history or not isinstance(history.get("total_s"), int | float):
        return None
    return history


def estimate(history: dict[str, Any] | None, started: float | None, now: float,
             argv_digest: str | None) -> dict[str, Any] | None:
    """The next start's expected total and what is left of it, from the last start."""
    if history is None or started is None:
        return None
    total = float(history["total_s"])
    return {
        "last_total_s": total,
        "eta_s": round(max(0.0, total - (now - started)), 1),
        "same_config": history.get("argv_digest") == argv_digest,
    }
