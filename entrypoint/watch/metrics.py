"""What the watcher reads from vLLM's /metrics: the wedge watchdog and speculative decoding.

A wedged engine (a stuck kernel, vLLM issue 51921's SM120 stall, a stopped process)
keeps /health at 200, because the API server only asks whether the engine process
is dead. Its Prometheus counters tell: requests stay running while nothing that an
engine step moves (tokens, finished requests, KV-cache use, preemptions, the number
of running or waiting requests) changes. Stdlib-only, like the watcher.
"""

from __future__ import annotations

import math
import re
from typing import Any

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# Each changes with every engine step that does work: generation tokens per decode
# step; KV-cache use per prefill chunk (blocks are allocated chunk by chunk); the rest
# when a request is admitted, finished or preempted.
PROGRESS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total_count",
    RUNNING,
    WAITING,
)
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


def parse(text: str) -> dict[str, float]:
    """Prometheus text format to {metric name: value}, summed over label sets
    (one per engine or model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match[2])
        except ValueError:
            continue
        if math.isfinite(value):
            values[match[1]] = values.get(match[1], 0.0) + value
    return values


class QuietClock:
    """Seconds since the engine last moved anything in PROGRESS, busy or idle.

    One clock serves the wedge watch and the generation check, so both measure
    from the same scrape. PROGRESS holds the running and waiting gauges, so the
    clock restarts when a request arrives at an idle engine."""

    def __init__(self) -> None:
        self.key: tuple[float | None, ...] | None = None
        self.since = 0.0

    def update(self, sample: dict[str, float], now: float) -> float:
        """Seconds without progress up to `now`. Call once per scrape."""
        key = tuple(sample.get(name) for name in PROGRESS)
        if key != self.key:
            self.key, self.since = key, now
        return now - self.since


class WedgeWatch:
    """Requests running and no progress for `seconds`: the engine is wedged."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def update(self, sample: dict[str, float], quiet: float) -> str | None:
        """The reason it is wedged, or None. `quiet`: QuietClock.update's answer."""
        running = sample.get(RUNNING, 0.0)
        if running <= 0 or quiet < self.seconds:
            return None
        return (f"engine wedged: {running:g} request(s) running and no engine progress "
                f"(tokens, KV cache, finished requests) for {quiet:.0f} s")


def speculative(sample: dict[str, float]) -> dict[str, Any] | None:
    """Acceptance of speculative decoding so far, or None when it is off.

    Mean accepted length counts the token every verification step yields anyway,
    as vLLM's own log line does: 1 + accepted / drafts."""
    drafts, proposed = sample.get(DRAFTS), sample.get(DRAFT_TOKENS)
    if drafts is None or proposed is None:
        return None
    accepted = sample.get(ACCEPTED, 0.0)
    return {
        "drafts": int(drafts),
        "draft_tokens": int(proposed),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / proposed, 4) if proposed else None,
        "mean_accepted_length": round(1 + accepted / drafts, 3) if drafts else None,
    }
