"""vLLM's process tree, remembered while it lives, so that what it leaves behind can
be stopped.

When the API server dies abruptly (SIGKILL, OOM killer) outside a container, its
EngineCore and workers are re-parented and keep running, holding GPU memory. The
watcher (itself a child of vLLM) records the descendants on every round; once vLLM
has gone it stops those that are still the same processes (same pid and start time).
In a container the runtime kills the whole PID namespace anyway. Stdlib-only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from entrypoint.watch.statusfile import pid_alive, process_start


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                found.extend(int(x) for x in handle.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int, exclude: int | None = None) -> dict[int, str]:
    """pid -> start time of every process below `pid` (not `exclude`'s own subtree)."""
    found: dict[int, str] = {}
    stack = [pid]
    while stack:
        for child in _children(stack.pop()):
            if child == exclude or child in found:
                continue
            start = process_start(child)
            if start is not None:
                found[child] = start
                stack.append(child)
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def still_running(known: dict[int, str]) -> dict[int, str]:
    """Those of `known` that are alive and still the processes recorded (no reused pid)."""
    return {pid: start for pid, start in known.items()
            if pid_alive(pid) and process_start(pid) == start}  # fmt: skip


def _signal(pids: dict[int, str], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # gone since it was checked
            os.kill(pid, sig)


def stop_leftovers(known: dict[int, str], grace: float = 5.0) -> list[str]:
    """SIGTERM what is left of `known`, SIGKILL after `grace` s; returns 'name (pid)'."""
    left = still_running(known)
    stopped = [f"{_name(pid)} ({pid})" for pid in sorted(left)]
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while still_running(left) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal(still_running(left), signal.SIGKILL)
    return stopped
