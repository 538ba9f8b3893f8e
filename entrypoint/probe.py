"""`probe` and `status`: read the watcher's files. Stdlib-only and import-light.

Compose healthchecks and Kubernetes exec probes run `probe` every few seconds, so
its whole run must stay well under 100 ms: no typer, no vLLM, no HTTP.
"""

from __future__ import annotations

import sys
import time

from entrypoint.settings import ready_file_from, status_path_for
from entrypoint.statusfile import pid_alive, read_json, read_ready

USAGE = (
    "usage: frontier-serve {probe|status} [--ready-file PATH] [--env-file FILE]... "
    "[--max-age SECONDS]"
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
        age = now - float(ready.get("heartbeat", "0"))
        pid = int(ready.get("pid", "0"))
    except ValueError:
        return 1, f"unreadable readiness file {ready_file}"
    if age > limit:
        return 1, f"stale: heartbeat {age:.1f}s old (limit {limit:g}s)"
    if not pid_alive(pid):
        return 1, f"exited: vLLM pid {pid} is not running"
    return 0, f"{ready.get('phase', 'ready')}: pid {pid}, heartbeat {age:.1f}s ago"


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
    status = read_json(path)
    if status is None:
        return 1, json.dumps({"phase": "unknown", "error": f"no status file at {path}"}, indent=2)
    for key in ("since", "heartbeat", "last_error_at"):
        if isinstance(status.get(key), int | float):
            status[f"{key}_utc"] = _iso(status[key])
            status[f"{key}_age_s"] = round(now - status[key], 1)
    return 0, json.dumps(status, indent=2, sort_keys=True)


def main(argv: list[str]) -> int:
    """Parse `probe|status [--ready-file P] [--env-file F]... [--max-age S]` by hand
    (argparse costs too much). --env-file: the files `serve --env-file` was given, so
    a SERVE_READY_FILE set only there is found too; --ready-file wins over both."""
    command, rest = argv[0], argv[1:]
    ready_file, env_files, max_age = None, [], None
    try:
        while rest:
            opt, *rest = rest
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
            else:
                raise ValueError(f"unknown option {key}")
    except ValueError as exc:
        print(f"{USAGE}\nerror: {exc}", file=sys.stderr)
        return 2
    if ready_file is None and not env_files:
        ready_file = ready_file_from()
    elif ready_file is None:
        from entrypoint.envfile import layered_environment
        from entrypoint.errors import ConfigError

        try:
            ready_file = ready_file_from(layered_environment(env_files))
        except ConfigError as exc:
            print(f"frontier-serve: error: {exc}", file=sys.stderr)
            return 2
    code, text = probe(ready_file, max_age) if command == "probe" else status_text(ready_file)
    print(text)
    return code
