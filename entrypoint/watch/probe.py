"""`probe` and `status`: read the watcher's files. Stdlib-only and import-light.

Compose healthchecks and Kubernetes exec probes run `probe` every few seconds, so
its whole run must stay well under 100 ms: no typer, no vLLM, no HTTP.
"""

from __future__ import annotations

import sys
import time

from entrypoint.argv.settings import ready_file_from, status_path_for
from entrypoint.watch.statusfile import (
    pid_alive,
    process_start,
    read_json,
    read_json_or_why,
    read_ready,
)

# Clock steps between the watcher's write and the probe's read; beyond this a heartbeat
# "in the future" is a bad file, not skew.
FUTURE_SLACK = 2.0

USAGE = (
    "usage: frontier-serve probe [--ready-file PATH] [--env-file FILE]... [--max-age SECONDS]"
    " [--live]\n"
    "       frontier-serve status [--ready-file PATH] [--env-file FILE]... [--json]"
)


def probe(
    ready_file: str, max_age: float | None = None, now: float | None = None
) -> tuple[int, str]:
    """(exit code, one line): 0 only for a present, fresh ready file whose pid is alive."""
    now = time.time() if now is None else now
    ready = read_ready(ready_file)
    if ready is None:
        status = read_json(status_path_for(ready_file)) or {}
        phase = status.get("phase", "unknown")
        why = status.get("reason") or status.get("last_error") or "no readiness file"
        return 1, f"{phase}: {why}"
    try:
        limit = float(ready.get("stale_after", "15") if max_age is None else max_age)
        age = now - float(ready.get("heartbeat", "nan"))
        pid = int(ready.get("pid", "0"))
    except ValueError:
        return 1, f"unreadable readiness file {ready_file}"
    # Comparisons with nan are False, so every test is written to pass only for
    # finite, sane values.
    if age != age:  # nan
        return 1, f"unreadable readiness file {ready_file}: heartbeat {ready.get('heartbeat')!r}"
    if not 0 < limit < 1e9:
        return 1, f"unreadable readiness file {ready_file}: stale limit {limit}"
    if not age > -FUTURE_SLACK:
        return 1, f"unreadable readiness file {ready_file}: heartbeat {-age:.1f}s in the future"
    if not age <= limit:
        return 1, f"stale: heartbeat {age:.1f}s old (limit {limit:g}s)"
    if not pid_alive(pid):
        return 1, f"exited: vLLM pid {pid} is not running"
    if ready.get("pid_start") != process_start(pid):
        # A restarted container: the file outlived its process, and pid 1 is a new one.
        return 1, f"stale: readiness file {ready_file} is from an earlier run of pid {pid}"
    return 0, f"{ready.get('phase', 'ready')}: pid {pid}, heartbeat {age:.1f}s ago"


def live(ready_file: str, now: float | None = None) -> tuple[int, str]:
    """(exit code, one line) for a liveness probe: 0 while ready, and while a start keeps
    moving (the watcher's heartbeat fresh, its step's progress within its stall limit,
    the whole start within SERVE_START_LIMIT); 1 once it has stalled, exited or lost
    its watcher. A stalled start is also ended by the watcher itself."""
    now = time.time() if now is None else now
    code, line = probe(ready_file, now=now)
    if code == 0:
        return code, line
    status = read_json(status_path_for(ready_file)) or {}
    phase = status.get("phase", "unknown")
    try:
        heartbeat = float(status.get("heartbeat", "nan"))
        stale = float(status.get("stale_after", 15.0))
    except (TypeError, ValueError):
        return 1, f"unreadable status beside {ready_file}"
    age = now - heartbeat
    if phase == "validating":
        pid = status.get("pid")
        if isinstance(pid, int) and pid_alive(pid):
            return 0, f"validating: pid {pid}, for {max(0.0, age):.0f} s"
        return 1, f"validating: pid {pid} is not running"
    if phase != "starting":
        return 1, line
    if not -FUTURE_SLACK < age <= stale:  # False for nan
        return 1, f"starting, but the watcher's heartbeat is {age:.1f}s old (limit {stale:g}s)"
    moving = status.get("progress")
    if not isinstance(moving, dict):
        return 0, f"starting: {status.get('step')}"
    try:
        quiet = float(moving["quiet_s"]) + max(0.0, age)
        limit, whole = float(moving["stall_limit_s"]), float(moving["start_s"]) + max(0.0, age)
        start_limit = float(moving["start_limit_s"])
    except (KeyError, TypeError, ValueError):
        return 1, f"unreadable progress in the status beside {ready_file}"
    step = moving.get("step") or "the start"
    if limit > 0 and quiet > limit:
        return 1, (f"stalled: {step} made no progress for {quiet:.0f} s "
                   f"(limit {limit:g} s, {moving.get('limit_setting')})")
    if whole > start_limit:
        return 1, (f"start not ready after {whole:.0f} s (SERVE_START_LIMIT {start_limit:g} s), "
                   f"still in {step}")
    return 0, f"starting: {step}, last progress {quiet:.0f} s ago (limit {limit:g} s)"


def _iso(value: object) -> object:
    from datetime import UTC, datetime

    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
    return value


def status_text(ready_file: str, now: float | None = None) -> tuple[int, str]:
    """(exit code, pretty JSON) of the status file, with readable times and ages added."""
    import json

    now = time.time() if now is None else now
    path = status_path_for(ready_file)
    status, why = read_json_or_why(path)
    if status is None:
        return 1, json.dumps({"phase": "unknown", "error": why}, indent=2)
    for key in ("since", "heartbeat", "last_error_at"):
        if isinstance(status.get(key), int | float):
            status[f"{key}_utc"] = _iso(status[key])
            status[f"{key}_age_s"] = round(now - status[key], 1)
    return 0, json.dumps(status, indent=2, sort_keys=True)


def status_summary(ready_file: str, now: float | None = None) -> tuple[int, str]:
    """(exit code, a few lines for a person) of the status file."""
    from entrypoint.watch.status_summary import summarize

    now = time.time() if now is None else now
    status, why = read_json_or_why(status_path_for(ready_file))
    if status is None:
        return 1, f"unknown: {why}"
    return 0, summarize(status, now)


def main(argv: list[str]) -> int:
    """Parse `probe|status [--ready-file P] [--env-file F]... [--max-age S] [--json]` by
    hand (argparse costs too much). --env-file: the files `serve --env-file` was given,
    so a SERVE_READY_FILE set only there is found too; --ready-file wins over both."""
    command, rest = argv[0], argv[1:]
    ready_file, env_files, max_age, as_json, liveness = None, [], None, False, False
    try:
        while rest:
            opt, *rest = rest
            if opt == "--json" and command == "status":
                as_json = True
                continue
            if opt == "--live" and command == "probe":
                liveness = True
                continue
            key, eq, value = opt.partition("=")
            if not eq:
                if not rest:
                    raise ValueError(f"{opt} needs a value")
                value, *rest = rest
            if key == "--ready-file":
                ready_file = value
            elif key == "--env-file":
                env_files.append(value)
            elif key == "--max-age" and command == "probe":
                max_age = float(value)
                if not 0 < max_age < 1e9:  # also refuses nan and inf
                    raise ValueError(f"--max-age {value}: must be a positive number of seconds")
            else:
                raise ValueError(f"unknown option {key}")
    except ValueError as exc:
        print(f"{USAGE}\nerror: {exc}", file=sys.stderr)
        return 2
    if ready_file is None and not env_files:
        ready_file = ready_file_from()
    elif ready_file is None:
        from entrypoint.argv.envfile import layered_environment
        from entrypoint.errors import ConfigError

        try:
            ready_file = ready_file_from(layered_environment(env_files))
        except ConfigError as exc:
            print(f"frontier-serve: error: {exc}", file=sys.stderr)
            return 2
    if command == "probe" and liveness:
        if max_age is not None:
            print(f"{USAGE}\nerror: --live takes the ready file's own stale limit, "
                  "not --max-age", file=sys.stderr)
            return 2
        code, text = live(ready_file)
    elif command == "probe":
        code, text = probe(ready_file, max_age)
    else:
        code, text = status_text(ready_file) if as_json else status_summary(ready_file)
    print(text)
    return code
