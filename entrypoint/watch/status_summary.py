"""`status` for a person: the watcher's status JSON as a few lines. Stdlib-only.

`wait` prints the same one-line step description while it waits.
"""

from __future__ import annotations

from typing import Any

from entrypoint.watch.steps import LOADING, STARTING_ENGINE, STARTING_VLLM

GIB = 2**30
# Steps during which the weights' byte count is the news (without vLLM's log the
# step stays "starting vLLM" until the server answers).
LOADING_STEPS = (None, STARTING_VLLM, STARTING_ENGINE, LOADING)


def _seconds(value: float) -> str:
    if value < 90:
        return f"{value:.0f} s"
    if value < 5400:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def loading_line(loading: dict[str, Any]) -> str:
    done, total = loading.get("done_bytes", 0), loading.get("total_bytes", 0)
    line = (f"loading weights {done / GIB:.2f} of {total / GIB:.2f} GiB "
            f"({int(loading.get('percent', 0))}%, {loading.get('ranks', 1)} rank(s))")
    if isinstance(loading.get("rate"), int | float) and loading["rate"] > 0:
        line += f", {loading['rate'] / GIB:.2f} GiB/s"
    if isinstance(loading.get("eta_s"), int | float):
        line += f", about {_seconds(loading['eta_s'])} left"
    return line


def progress_line(moving: dict[str, Any]) -> str | None:
    """How long the start has been still, against the limit that would end it."""
    quiet, limit = moving.get("quiet_s"), moving.get("stall_limit_s")
    if not isinstance(quiet, int | float) or not isinstance(limit, int | float):
        return None
    if limit <= 0:
        return (f"last progress {_seconds(quiet)} ago "
                f"(no stall limit: {moving.get('limit_setting')}=0)")
    return (f"last progress {_seconds(quiet)} ago; the start is ended after "
            f"{_seconds(limit)} without ({moving.get('limit_setting')})")


def step_line(status: dict[str, Any], now: float | None = None) -> str:
    """`phase: step (detail)[, N s in it]`: what the start is doing now (the time in the
    step only given `now`)."""
    phase = str(status.get("phase", "unknown"))
    step, detail = status.get("step"), status.get("detail")
    loading = status.get("loading")
    if (isinstance(loading, dict) and loading.get("total_bytes") and phase != "ready"
            and step in LOADING_STEPS):
        return f"{phase}: {loading_line(loading)}"
    if not step or step == phase:
        return phase
    line = f"{phase}: {step}"
    if detail:
        line += f" ({detail})"
    steps = status.get("steps")
    if (now is not None and isinstance(steps, list) and steps
            and isinstance(steps[-1].get("at"), int | float)):
        line += f", {_seconds(max(0.0, now - steps[-1]['at']))} in it"
    return line


def eta_line(status: dict[str, Any]) -> str | None:
    eta = status.get("eta")
    if not isinstance(eta, dict) or not isinstance(eta.get("eta_s"), int | float):
        return None
    line = (f"expected ready in about {_seconds(eta['eta_s'])} "
            f"(the last start took {_seconds(float(eta['last_total_s']))}")
    return line + (")" if eta.get("same_config") else ", with another configuration)")


def speculative_line(spec: dict[str, Any]) -> str:
    rate, length = spec.get("acceptance_rate"), spec.get("mean_accepted_length")
    rate_text = "no drafts yet" if rate is None else f"acceptance {100 * rate:.1f} %"
    line = (f"speculative decoding: {rate_text} ({spec.get('accepted_tokens')} of "
            f"{spec.get('draft_tokens')} draft tokens)")
    if length is not None:
        line += f", mean accepted length {length:.2f}"
    return line


def summarize(status: dict[str, Any], now: float) -> str:
    # An exited start's last step ended with it: no running time to show.
    lines = [step_line(status, None if status.get("phase") == "exited" else now)]
    pid = status.get("pid")
    url = status.get("url")
    if pid or url:
        lines.append(f"  vLLM pid {pid}" + (f" at {url}" if url else ""))
    if status.get("reason"):
        lines.append(f"  reason: {status['reason']}")
    if status.get("error") and status.get("phase") != "ready":
        lines.append(f"  vLLM's error: {status['error']}")
    eta = eta_line(status)
    if eta and status.get("phase") not in ("ready", "exited"):
        lines.append(f"  {eta}")
    moving = status.get("progress")
    progress = progress_line(moving) if isinstance(moving, dict) else None
    if progress and status.get("phase") == "starting":
        lines.append(f"  {progress}")
    steps = status.get("steps")
    if isinstance(steps, list) and steps:
        parts = [f"{s.get('step')} {_seconds(float(s.get('seconds', 0)))}" for s in steps]
        lines.append("  steps: " + ", ".join(parts))
    if status.get("model_runner"):
        lines.append(f"  model runner: {status['model_runner']}")
    spec = status.get("speculative")
    if isinstance(spec, dict):
        lines.append(f"  {speculative_line(spec)}")
    if status.get("log_capture"):
        lines.append(f"  vLLM log capture {status['log_capture']}")
    tail = status.get("log_tail")
    if isinstance(tail, list) and tail:
        lines.append(f"  vLLM's last {len(tail)} log lines:")
        lines.extend(f"    {line}" for line in tail)
    return "\n".join(lines)
