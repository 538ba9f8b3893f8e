"""`serve` against a real vLLM on CPU, with the tiny model built by `fixtures.tiny_model`.

Three vLLM starts in all: one shared server (ready file, completion, probe, then a
clean SIGTERM), one that is killed with SIGKILL, and one whose model does not exist.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.statusfile import read_ready
from tests.serving import (
    START_TIMEOUT,
    Served,
    gone,
    run_entrypoint,
    session_pids,
    start_serve,
    start_wait,
    status_json,
    stop,
    wait_for,
)

pytestmark = pytest.mark.vllm_server


@pytest.fixture(scope="module")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(tmp_path_factory.mktemp("shared"), SERVE_MODEL=tiny_model)
    waiting = start_wait(served, START_TIMEOUT)
    try:
        took = served.wait_ready(START_TIMEOUT)
        print(f"\nshared server ready after {took:.0f}s")
        out, _ = waiting.communicate(timeout=10)
        served.wait_output = (waiting.returncode, out)  # type: ignore[attr-defined]
        yield served
    finally:
        waiting.kill()
        stop(served)


def test_ready_file_and_status(server: Served) -> None:
    fields = read_ready(str(server.ready))
    assert fields is not None and fields["pid"] == str(server.proc.pid)  # exec kept the pid
    status = status_json(server)
    assert status["phase"] == "ready" and status["pid"] == server.proc.pid
    assert status["argv_digest"] == fields["argv_digest"]
    assert status["url"] == f"http://127.0.0.1:{server.port}"
    probe = run_entrypoint("probe", "--ready-file", str(server.ready))
    assert probe.returncode == 0 and probe.stdout.startswith(f"ready: pid {server.proc.pid}")


def test_wait_printed_the_phases_and_returned_0_at_ready(server: Served) -> None:
    code, out = server.wait_output  # type: ignore[attr-defined]
    lines = out.splitlines()
    print("\n" + out)
    assert code == 0, out
    assert lines[-1].startswith("ready after ") and f"pid {server.proc.pid}" in lines[-1]
    assert any("starting" in line or "validating" in line or "status file" in line
               for line in lines[:-1]), out


def test_completion_over_loopback(server: Served, tiny_model: str) -> None:
    body = {"model": tiny_model, "prompt": "the quick", "max_tokens": 4}
    answer = server.post("/v1/completions", body, timeout=60)
    assert answer["usage"]["completion_tokens"] == 4
    assert isinstance(answer["choices"][0]["text"], str)


def test_sigterm_shuts_down_cleanly(server: Served) -> None:
    """Runs last on the shared server: vLLM gets SIGTERM itself (it is the exec'd pid)."""
    watcher = status_json(server)["watcher_pid"]
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: status_json(server).get("phase") == "exited", 60, "status exited")
    status = status_json(server)
    assert server.proc.wait(timeout=30) == 0, server.log_tail()
    assert status["exit_code"] == 0
    assert status["reason"] == "vLLM exited with code 0 after it was ready"
    assert not server.ready.exists()
    wait_for(lambda: not session_pids(server.proc.pid), 15, "no vLLM process left")
    wait_for(lambda: gone(watcher), 10, "watcher ends with vLLM")


def test_sigkill_withdraws_readiness_within_2s(tiny_model: str, tmp_path: Path) -> None:
    served = start_serve(tmp_path / "killed", SERVE_MODEL=tiny_model)
    try:
        served.wait_ready(START_TIMEOUT)
        watcher = status_json(served)["watcher_pid"]
        os.kill(served.proc.pid, signal.SIGKILL)
        took = wait_for(lambda: not served.ready.exists(), 5, "ready file removed")
        print(f"\nready file removed {took:.2f}s after SIGKILL")
        assert took <= 2.0
        # Reaped only now, so the watcher could read the code from the zombie.
        wait_for(lambda: status_json(served).get("phase") == "exited", 5, "status exited")
        status = status_json(served)
        assert status["exit_code"] == 137
        assert status["reason"] == "vLLM killed by SIGKILL after it was ready"
        assert served.proc.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: gone(watcher), 10, "watcher ends with vLLM")
    finally:
        stop(served)


def test_missing_model_never_ready(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    served = start_serve(tmp_path / "missing", SERVE_MODEL=missing)
    waiting = start_wait(served, START_TIMEOUT)
    try:
        wait_for(
            lambda: gone(served.proc.pid),  # not poll(): reaping would hide the code
            START_TIMEOUT,
            "vLLM gives up",
        )
        exited = time.monotonic()
        out, _ = waiting.communicate(timeout=30)
        after = time.monotonic() - exited
        print(f"\n{out}wait ended {after:.1f} s after vLLM")
        assert waiting.returncode == 1 and after < 2.0, out
        assert "not ready: vLLM exited with code" in out and "does not exist" in out
        wait_for(lambda: status_json(served).get("phase") == "exited", 10, "status exited")
        status = status_json(served)
        assert not served.ready.exists() and status["ever_ready"] is False
        assert status["exit_code"] == served.proc.wait(timeout=10) != 0
        assert status["reason"] == (
            f"vLLM exited with code {status['exit_code']} before it became ready "
            f"(model path {missing} does not exist)"
        )
        assert "does not exist" in served.log.read_text()  # the warning serve printed
    finally:
        waiting.kill()
        stop(served)
