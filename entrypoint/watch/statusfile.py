"""Atomic JSON files and process facts shared by the watcher, `probe` and `status`.

Stdlib-only: `probe` imports this and must stay fast.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # importing typing costs probe ~5 ms
if TYPE_CHECKING:
    from typing import Any


def write_atomic(path: str, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target.

    Readers therefore see either the old or the new file, never a torn one.
    """
    import tempfile  # only writers need it; probe only reads

    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    import json

    write_atomic(path, json.dumps(data, sort_keys=True) + "\n")


def write_ready(path: str, fields: dict[str, object]) -> None:
    """The readiness file: `key=value` lines, so `probe` needs no json (re costs ~15 ms)."""
    write_atomic(path, "".join(f"{key}={value}\n" for key, value in sorted(fields.items())))


def read_ready(path: str) -> dict[str, str] | None:
    """The readiness file's fields, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError):
        return None
    fields = dict(line.partition("=")[::2] for line in lines if "=" in line)
    return fields or None


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing or unreadable."""
    return read_json_or_why(path)[0]


def read_json_or_why(path: str) -> tuple[dict[str, Any] | None, str]:
    """(the JSON object in `path`, "") or (None, why not): missing, unreadable or corrupt."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None, f"no status file at {path}"
    except OSError as exc:
        return None, f"cannot read the status file {path}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"corrupt status file {path}: {exc}"
    if not isinstance(data, dict):
        return None, f"corrupt status file {path}: not a JSON object"
    return data, ""


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return


def proc_stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from field 3 (state) on; the name may contain spaces."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def process_start(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22), or None.

    A pid and its start time name one process: a restarted container's new PID 1
    has the old pid but not the old start time."""
    fields = proc_stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def pid_alive(pid: int) -> bool:
    """True for a running process; False for a missing one or a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = proc_stat_fields(pid)
    return fields is None or fields[0] not in ("Z", "X")


def zombie_exit_status(pid: int) -> int | None:
    """The wait status of an exited, not yet reaped process, read from /proc/PID/stat.

    Field 52 (`exit_code`, Linux >= 3.5) holds it while the process is a zombie. A
    process that is not our child cannot be wait()ed, so this is the only way for the
    watcher to learn how vLLM ended. None once the parent has reaped it.
    """
    fields = proc_stat_fields(pid)
    if fields is None or fields[0] not in ("Z", "X") or len(fields) < 50:
        return None
    try:
        return int(fields[49])
    except ValueError:
        return None


def describe_wait_status(status: int | None) -> tuple[int | None, str]:
    """(shell-style exit code, words) for a wait status; code 128+N for signal N."""
    if status is None:
        return None, "exit code unknown (reaped before it could be read)"
    if os.WIFSIGNALED(status):
        import signal  # here, not at the top: probe imports this module

        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return 128 + sig, f"killed by {name}"
    code = os.WEXITSTATUS(status)
    return code, f"exited with code {code}"
