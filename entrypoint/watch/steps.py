"""The steps of one start, as `status`, `wait` and the startup history name them.

`serve` records the first three (validating, importing vLLM, preflight); the watcher
the rest, from vLLM's log (entrypoint/watch/log_capture.py) and its health checks.
Stdlib-only.
"""

from __future__ import annotations

from typing import Any

VALIDATING = "validating"
IMPORTING_VLLM = "importing vLLM"  # its parser; the start then runs in this interpreter
PREFLIGHT = "preflight"
STARTING_VLLM = "starting vLLM"
STARTING_ENGINE = "starting engine"
LOADING = "loading weights"
LOADED = "weights loaded"
COMPILING = "compiling"
KV_CACHE = "KV cache"
CAPTURING = "capturing CUDA graphs"
WARMING_UP = "warming up"
API_SERVER = "starting API server"
SERVING = "serving"

# The order a start goes through them. CAPTURING and WARMING_UP are alternatives;
# vLLM also compiles during warm-up, which stays part of that step.
ORDER = (VALIDATING, IMPORTING_VLLM, PREFLIGHT, STARTING_VLLM, STARTING_ENGINE, LOADING,
         LOADED, COMPILING, KV_CACHE, CAPTURING, WARMING_UP, API_SERVER, SERVING)


def rank(step: str | None) -> int:
    return ORDER.index(step) if step in ORDER else -1


class Steps:
    """An ordered list of {"step", "at", "detail"}: one entry per change of step."""

    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self.entries: list[dict[str, Any]] = [dict(e) for e in entries or []]

    @property
    def current(self) -> str | None:
        return self.entries[-1]["step"] if self.entries else None

    def enter(self, step: str, at: float, detail: str | None = None) -> bool:
        """Start `step` (True), or only update the detail when it is the current one.

        A step from earlier in ORDER is ignored: with several ranks, a slow rank's
        "loading" message may come after another rank's "loaded"."""
        if step == self.current:
            if detail:
                self.entries[-1]["detail"] = detail
            return False
        if rank(step) < rank(self.current):
            return False
        self.entries.append({"step": step, "at": at, "detail": detail})
        return True

    def note(self, detail: str) -> None:
        """Detail for the current step (e.g. "captured in 12 s") without a new step."""
        if self.entries:
            self.entries[-1]["detail"] = detail

    def durations(self, until: float) -> list[dict[str, Any]]:
        """Each step with its seconds: up to the next step, the last one up to `until`."""
        out = []
        for entry, following in zip(self.entries, [*self.entries[1:], None], strict=True):
            end = following["at"] if following else until
            out.append({**entry, "seconds": round(max(0.0, end - entry["at"]), 3)})
        return out
