"""Faults on a real tiny vLLM on CPU: an engine that dies after ready, SIGTERM with
streams in flight, an API server killed outright, and a restart that finds the last
run's ready file. Each prints the times it measured."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from entrypoint.watch import probe
from entrypoint.watch.statusfile import read_json, read_ready, write_ready
from fixtures.serving import (
    START_TIMEOUT,
    Served,
    engine_core,
    gone,
    session_pids,
    start_serve,
    status_json,
    stop,
    wait_for,
)

pytestmark = pytest.mark.vllm_server


def test_engine_killed_after_ready_gives_a_non_zero_exit(tiny_model: str, tmp_path: Path) -> None:
    served = start_serve(tmp_path / "engine", SERVE_MODEL=tiny_model)
    try:
        served.wait_ready(START_TIMEOUT)
        os.kill(engine_core(served), signal.SIGKILL)
        started = time.monotonic()
        wait_for(lambda: gone(served.proc.pid), 60, "the API server stops")
        took = time.monotonic() - started
        wait_for(lambda: status_json(served).get("phase") == "exited", 10, "status exited")
        code = served.proc.wait(timeout=10)
        print(f"\nengine killed: API server exited {code} after {took:.1f} s")
        assert code == 1, served.log_tail()
        assert status_json(served)["exit_code"] == 1
        assert "Engine is dead" in served.log.read_text()
        wait_for(lambda: not session_pids(served.proc.pid), 15, "no vLLM process left")
    finally:
        stop(served)


def _streams(served: Served, model: str, n: int, max_tokens: int) -> list[dict]:
    results: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        body = {"model": model, "prompt": f"count {i}", "max_tokens": max_tokens,
                "ignore_eos": True}  # fmt: skip
        served.stream(body, seen=results[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    served.threads = threads  # type: ignore[attr-defined]
    return results


# The abort case must outlast its 2 s timeout on any CPU: a CI machine once ran five
# 1000-token streams to "length" inside it. 30000 tokens take a minute at 500 tokens/s,
# so the tiny model's 1024 positions are raised for that case (RoPE has no limit).
# The drain case's streams must still run at the SIGTERM, sent once each client has
# read a token: on a loaded machine the clients read late, and five of 400 tokens had
# ended before it. 2000 tokens take seconds, well inside its 30 s.
@pytest.mark.parametrize(
    ("shutdown_timeout", "max_model_len", "max_tokens", "finish"),
    [("2", 32768, 30000, "abort"), ("30", 2048 + 64, 2000, "length")],
    ids=["timeout-aborts", "drain-completes"],
)
def test_sigterm_with_streams_in_flight_drains_within_its_bound(
    tiny_model: str,
    tmp_path: Path,
    shutdown_timeout: str,
    max_model_len: int,
    max_tokens: int,
    finish: str,
) -> None:
    """Every stream ends with a finish_reason and [DONE]: "length" when the drain
    lets it finish, "abort" when the timeout cuts it; vLLM exits 0 within
    --shutdown-timeout plus teardown, and leaves no process."""
    positions = f'{{"max_position_embeddings": {max_model_len}}}'
    served = start_serve(tmp_path / "drain", SERVE_MODEL=tiny_model,
                         SERVE_SHUTDOWN_TIMEOUT=shutdown_timeout,
                         SERVE_MAX_MODEL_LEN=str(max_model_len),
                         SERVE_HF_OVERRIDES=positions)  # fmt: skip
    try:
        served.wait_ready(START_TIMEOUT)
        results = _streams(served, tiny_model, 5, max_tokens)
        wait_for(lambda: all(r.get("chunks", 0) > 0 for r in results), 60,
                 "five streams under way", step=0.05)  # fmt: skip
        started = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        bound = float(shutdown_timeout) + 15
        # gone(), not wait(): reaping first would hide the exit code from the watcher.
        wait_for(lambda: gone(served.proc.pid), bound, "vLLM exits", step=0.1)
        took = time.monotonic() - started
        wait_for(lambda: status_json(served).get("phase") == "exited", 10, "status exited")
        code = served.proc.wait(timeout=10)
        for thread in served.threads:  # type: ignore[attr-defined]
            thread.join(30)
        print(
            f"\nSIGTERM, shutdown-timeout {shutdown_timeout}: exit {code} after {took:.1f} s; "
            + ", ".join(f"{r['chunks']} chunks {r['finish_reason']}" for r in results)
        )
        assert code == 0, served.log_tail()
        for result in results:
            assert result["error"] is None and result["done"], result
            assert result["finish_reason"] == finish, result
            assert started < result["ended"] <= started + bound  # in flight at SIGTERM
        wait_for(lambda: not session_pids(served.proc.pid), 15, "no vLLM process left")
        assert status_json(served)["exit_code"] == 0
    finally:
        stop(served)


def test_api_server_killed_outright_leaves_no_process(tiny_model: str, tmp_path: Path) -> None:
    """Outside a container nothing reaps vLLM's children: the watcher stops them."""
    served = start_serve(tmp_path / "orphans", SERVE_MODEL=tiny_model)
    try:
        served.wait_ready(START_TIMEOUT)
        time.sleep(1.5)  # a watcher round has seen the whole tree
        core = engine_core(served)
        os.kill(served.proc.pid, signal.SIGKILL)
        started = time.monotonic()
        wait_for(lambda: gone(core), 20, "the EngineCore is stopped")
        took = time.monotonic() - started
        wait_for(lambda: not session_pids(served.proc.pid), 20, "no vLLM process left")
        print(f"\nAPI server SIGKILLed: leftovers stopped after {took:.1f} s")
        wait_for(lambda: "stopped_leftovers" in status_json(served), 10, "status names them")
        status = status_json(served)
        assert any("EngineCor" in name for name in status["stopped_leftovers"]), status
    finally:
        stop(served)


def test_a_restart_never_reads_the_last_runs_ready_file(tiny_model: str, tmp_path: Path) -> None:
    """Kubernetes keeps /run/serve across a container restart, and the new PID 1 has
    the old pid. Forge exactly that: the last run's ready file, fresh, naming the new
    process's pid. probe must fail from the first poll until the new run is ready."""
    folder = tmp_path / "restart"
    first = start_serve(folder, SERVE_MODEL=tiny_model)
    try:
        first.wait_ready(START_TIMEOUT)
        old = read_ready(str(first.ready))
        assert old is not None
    finally:
        stop(first)
    second = start_serve(folder, SERVE_MODEL=tiny_model)
    forged = {**old, "pid": str(second.proc.pid), "heartbeat": str(time.time())}
    write_ready(str(second.ready), forged)
    started = time.monotonic()
    try:
        passed_early: list[float] = []
        cleared: float | None = None
        while True:
            fields = read_ready(str(second.ready))
            if fields == forged:
                if probe.probe(str(second.ready))[0] == 0:
                    passed_early.append(round(time.monotonic() - started, 2))
            elif cleared is None:
                cleared = time.monotonic() - started
            if fields is not None and fields != forged and fields.get("phase") == "ready":
                break
            assert second.proc.poll() is None, second.log_tail()
            assert time.monotonic() - started < START_TIMEOUT, second.log_tail()
            time.sleep(0.05)
        print(
            f"\nrestart: the old ready file was removed after {cleared:.2f} s; "
            f"ready again after {time.monotonic() - started:.0f} s"
        )
        assert passed_early == []
        assert cleared is not None and cleared < 10
        assert probe.probe(str(second.ready))[0] == 0
        status = read_json(str(second.status))
        assert status is not None and status["phase"] == "ready"
    finally:
        stop(second)
