"""`wait`: block until vLLM is ready, reading only the watcher's files.

Exit 0 when `probe` passes; 1 when vLLM has exited or a server that was ready
turned unhealthy (the status's reason is printed); 124 when the timeout passes
first, as timeout(1) does. One line per change of phase or loading progress
(10 % steps); on a terminal, loading progress rewrites one live line instead.
Stdlib-only, like `probe`: it runs in `docker compose exec` and Kubernetes jobs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from entrypoint.argv.settings import status_path_for
from entrypoint.watch import status_summary
from entrypoint.watch.probe import probe
from entrypoint.watch.statusfile import pid_alive, read_json

TIMED_OUT = 124
# The watcher writes the status every health interval (default 2 s); a status
# this old, from a pid that is gone, belongs to a run that has ended.
DEAD_AFTER = 30.0


def describe(status: dict) -> str:
    """One line for a status: the phase and step, the weights loaded while starting,
    and the ETA the last start gives."""
    phase = str(status.get("phase", "unknown"))
    line = status_summary.step_line(status)
    if line == "starting":
        line = "starting: vLLM is loading (no step reported yet)"
    eta = status_summary.eta_line(status)
    if eta and phase in ("validating", "starting") and "loading" not in status:
        line += f"; {eta}"
    return line


def _progress_key(line: str, status: dict) -> object:
    """Changes that deserve a new line: the phase, the step, and loading in 10 % steps
    (not the seconds spent in a step, which change every poll)."""
    loading = status.get("loading")
    percent = int(loading.get("percent", 0)) // 10 if isinstance(loading, dict) else None
    return (status.get("phase"), status.get("step"), status.get("detail"), percent)


def finished(status: dict, now: float) -> str | None:
    """Why waiting is over without readiness, or None while it may still come."""
    phase = status.get("phase")
    if phase == "exited":
        return str(status.get("reason") or f"vLLM exited with code {status.get('exit_code')}")
    if phase == "unhealthy" and status.get("ever_ready"):
        return str(status.get("reason") or status.get("last_error") or "unhealthy")
    pid, heartbeat = status.get("pid"), status.get("heartbeat")
    if (isinstance(pid, int) and isinstance(heartbeat, int | float)
            and now - heartbeat > DEAD_AFTER and not pid_alive(pid)):
        age = now - heartbeat
        return f"vLLM (pid {pid}) is gone and its watcher stopped writing {age:.0f} s ago"
    return None


def wait(
    ready_file: str,
    timeout: float | None,
    out: Callable[[str], None] = print,
    poll: float = 0.5,
    live: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Poll until ready (0), finished without readiness (1) or timed out (124)."""
    start = clock()
    last_key: object = None
    last_text, last_step, open_line = "", None, False

    def emit(line: str, in_place: bool = False) -> None:
        nonlocal open_line
        if in_place:  # a live terminal line: rewrite it
            sys.stdout.write(f"\r\x1b[2K{line}")
            sys.stdout.flush()
            open_line = True
            return
        if open_line:
            sys.stdout.write("\n")
            open_line = False
        out(line)

    while True:
        code, line = probe(ready_file)
        if code == 0:
            emit(f"ready after {clock() - start:.0f} s ({line})")
            return 0
        status = read_json(status_path_for(ready_file)) or {}
        text = describe(status) if status else "waiting for the status file (serve not started)"
        key = _progress_key(text, status)
        step = (status.get("phase"), status.get("step"))
        if live and text != last_text:  # progress within a step rewrites its line
            emit(f"[{clock() - start:5.0f} s] {text}", in_place=step == last_step)
        elif not live and key != last_key:
            emit(f"[{clock() - start:5.0f} s] {text}")
        last_key, last_text, last_step = key, text, step
        why = finished(status, time.time()) if status else None
        if why:
            emit(f"not ready: {why}")
            return 1
        if timeout is not None and clock() - start >= timeout:
            emit(f"not ready after {timeout:g} s (timeout); last: {text}")
            return TIMED_OUT
        time.sleep(poll)
