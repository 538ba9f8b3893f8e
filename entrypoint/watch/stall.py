"""A start that stops moving: its step's stall limit, how long it has been still, and its end.

Progress is what a start shows from outside: a new step (vLLM's log milestones), a new
detail within one, or more weight bytes loaded (the plugin's per-rank progress files).
Each step has a limit of its own (entrypoint/argv/settings.py, SERVE_STALL_*): weight loading
reports bytes, so its limit is short; compilation and CUDA graph capture report nothing
until they finish, so theirs is long. A start still past its limit is ended, so that a
restart policy can act, instead of a fixed budget that kills a slow disk's load midway
or leaves a hung one for an hour. Stdlib-only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from entrypoint.argv import settings
from entrypoint.watch.statusfile import pid_alive, process_start
from entrypoint.watch.steps import CAPTURING, COMPILING, LOADING, WARMING_UP

# Steps that say nothing until they end. Loading is one where no rank reports bytes
# (safetensors; a hub download inside vLLM), so it gets the long limit too.
QUIET_STEPS = frozenset({LOADING, COMPILING, CAPTURING, WARMING_UP})


def limit_for(step: str | None, loading: bool, limits: dict[str, float]) -> tuple[str, float]:
    """(setting name, seconds; 0 is off) for the current step. While GGUF ranks report
    bytes (*loading*) the load's limit applies whatever step vLLM's log last named."""
    if loading:
        name = settings.STALL_LOAD
    else:
        name = settings.STALL_COMPILE if step in QUIET_STEPS else settings.STALL_OTHER
    return name, float(limits.get(name, settings.DEFAULT_STALL[name]))


class Progress:
    """The time of the last change of a start's progress key."""

    def __init__(self, now: float) -> None:
        self.at, self.key = now, None  # type: ignore[var-annotated]

    def quiet(self, key: object, now: float) -> float:
        """Seconds since *key* last changed (0 when it changes now)."""
        if key != self.key:
            self.key, self.at = key, now
        return max(0.0, now - self.at)


def reason(step: str | None, quiet: float, name: str, limit: float) -> str | None:
    if limit <= 0 or quiet <= limit:
        return None
    shown = f"{quiet:.1f}" if quiet < 100 else f"{quiet:.0f}"
    return (f"start stalled: {step or 'the start'} made no progress for {shown} s "
            f"(limit {limit:g} s, {name})")


def end_start(pid: int, tree: dict[int, str], grace: float) -> list[str]:
    """Stop a stalled vLLM: its engine and workers (SIGKILL, so the API server fails the
    start with an error of its own), then, if it is still there after *grace* seconds,
    the server itself (SIGTERM, then SIGKILL). In a container vLLM is PID 1, which no
    SIGKILL from inside reaches: its workers' end is what makes it exit non-zero."""
    done: list[str] = []
    for child, started in tree.items():
        if child != pid and pid_alive(child) and process_start(child) == started:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
                done.append(f"SIGKILL {child}")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pid_alive(pid):
            break
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
            done.append(f"{signal.Signals(sig).name} {pid}")
    return done
