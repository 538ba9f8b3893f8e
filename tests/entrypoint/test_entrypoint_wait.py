"""`frontier-serve wait` against the watcher's files, written as the watcher writes them.

The real-server cases (ready after the phases; exit 1 within 2 s of vLLM's exit)
are in test_entrypoint_vllm_server.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from entrypoint.argv.settings import status_path_for
from entrypoint.watch.statusfile import process_start, write_json_atomic, write_ready
from entrypoint.watch.wait import describe, wait
from fixtures.serving import run_entrypoint

pytestmark = pytest.mark.process  # runs `python -m entrypoint wait` as users do


def status(ready: Path, **fields: object) -> None:
    base = {"phase": "starting", "pid": os.getpid(), "heartbeat": time.time(),
            "ever_ready": False}
    write_json_atomic(status_path_for(str(ready)), {**base, **fields})


def test_timeout_exits_124_naming_the_last_phase(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    status(ready)
    start = time.monotonic()
    done = run_entrypoint("wait", "--ready-file", str(ready), "--timeout", "1")
    assert done.returncode == 124, done.stdout + done.stderr
    assert time.monotonic() - start < 30
    assert "not ready after 1 s (timeout); last: starting" in done.stdout


def test_no_status_file_yet_waits_and_says_so(tmp_path: Path) -> None:
    done = run_entrypoint("wait", "--ready-file", str(tmp_path / "ready"), "--timeout", "0.5")
    assert done.returncode == 124
    assert "waiting for the status file" in done.stdout


def test_exited_status_exits_1_with_the_reason(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    reason = "vLLM exited with code 1 before it became ready (model path /x does not exist)"
    status(ready, phase="exited", exit_code=1, reason=reason)
    done = run_entrypoint("wait", "--ready-file", str(ready), "--timeout", "30")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == f"not ready: {reason}"


def test_unhealthy_after_ready_exits_1_but_not_while_starting(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    status(ready, phase="unhealthy", ever_ready=True, reason="3 failed health checks in a row")
    done = run_entrypoint("wait", "--ready-file", str(ready), "--timeout", "30")
    assert done.returncode == 1 and "3 failed health checks" in done.stdout


def test_a_gone_pid_with_a_silent_watcher_ends_the_wait(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    status(ready, pid=2**22 + 12345, heartbeat=time.time() - 120)  # no such pid
    done = run_entrypoint("wait", "--ready-file", str(ready), "--timeout", "30")
    assert done.returncode == 1 and "is gone" in done.stdout


def test_ready_exits_0(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    status(ready, phase="ready", ever_ready=True)
    write_ready(str(ready), {"phase": "ready", "pid": os.getpid(), "heartbeat": time.time(),
                             "pid_start": process_start(os.getpid()), "stale_after": 15})
    done = run_entrypoint("wait", "--ready-file", str(ready), "--timeout", "30")
    assert done.returncode == 0 and done.stdout.startswith("ready after 0 s (ready: pid ")


def test_loading_progress_gives_a_line_per_10_percent(tmp_path: Path) -> None:
    """7 % shares 5 %'s step, so it prints nothing; the rest each print a line."""
    import threading

    ready = tmp_path / "ready"
    total = 10 * 2**30
    status(ready)

    def watcher() -> None:
        for percent in (5, 7, 12, 55, 100):
            time.sleep(0.2)
            status(ready, loading={"ranks": 2, "done_bytes": total * percent // 100,
                                   "total_bytes": total, "percent": percent})
        time.sleep(0.2)
        status(ready, phase="exited", exit_code=1, reason="stop")

    writer = threading.Thread(target=watcher)
    writer.start()
    lines: list[str] = []
    assert wait(str(ready), timeout=30, out=lines.append, poll=0.01) == 1
    writer.join()
    shown = [line.split("] ", 1)[1] for line in lines if "] " in line]
    assert shown == [
        "starting: vLLM is loading (no step reported yet)",
        "starting: loading weights 0.50 of 10.00 GiB (5%, 2 rank(s))",
        "starting: loading weights 1.20 of 10.00 GiB (12%, 2 rank(s))",
        "starting: loading weights 5.50 of 10.00 GiB (55%, 2 rank(s))",
        "starting: loading weights 10.00 of 10.00 GiB (100%, 2 rank(s))",
        "exited",
    ], lines


def test_bad_timeout_is_refused_by_name(tmp_path: Path) -> None:
    for bad in ("0", "-3", "nan"):
        done = run_entrypoint("wait", "--ready-file", str(tmp_path / "r"), "--timeout", bad)
        assert done.returncode == 2
        assert f"frontier-serve: error: --timeout {float(bad)}" in done.stderr
        assert "Traceback" not in done.stderr


def test_describe_without_loading() -> None:
    assert describe({"phase": "validating"}) == "validating"
