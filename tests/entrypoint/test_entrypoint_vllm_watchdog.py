"""The wedge watchdog and the generation check on a real vLLM (CPU, tiny model).

SIGSTOP on the EngineCore process alone wedges the engine the way a stuck kernel
does: the API server keeps answering /health with 200, since the engine process
is not dead. The watcher must see it from /metrics (a request running, nothing
moving) or, for an idle engine, from a one-token request, and SIGCONT must bring
readiness back. The same server runs with SERVE_LOG_CAPTURE=false, so it also
shows the status without the log capture.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from entrypoint import metrics, steps
from tests.serving import (
    START_TIMEOUT,
    Served,
    engine_core,
    run_entrypoint,
    start_serve,
    status_json,
    stop,
    wait_for,
)

pytestmark = pytest.mark.vllm_server

WEDGE_SECONDS = 4.0
CHECK_INTERVAL, CHECK_TIMEOUT = 3.0, 5.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(
        tmp_path_factory.mktemp("watchdog"),
        SERVE_MODEL=tiny_model,
        SERVE_MAX_MODEL_LEN="1024",  # the tiny model's max_position_embeddings
        SERVE_WEDGE_SECONDS=str(WEDGE_SECONDS),
        SERVE_GENERATION_CHECK_INTERVAL=str(CHECK_INTERVAL),
        SERVE_GENERATION_CHECK_TIMEOUT=str(CHECK_TIMEOUT),
        SERVE_LOG_CAPTURE="false",
    )
    try:
        served.wait_ready(START_TIMEOUT)
        yield served
    finally:
        stop(served)


def health_code(served: Served) -> int:
    with _OPENER.open(f"http://127.0.0.1:{served.port}/health", timeout=10) as response:
        return response.status


def phase(served: Served) -> str | None:
    return status_json(served).get("phase")


def test_without_log_capture_the_status_works_as_before(server: Served) -> None:
    status = status_json(server)
    assert status["phase"] == "ready" and status["log_capture"] == "off: SERVE_LOG_CAPTURE=false"
    assert "error" not in status and "log_tail" not in status
    # Without vLLM's log only serve's and the watcher's own steps are known.
    assert [s["step"] for s in status["steps"]] == [
        steps.VALIDATING, steps.PREFLIGHT, steps.STARTING_VLLM, steps.SERVING]
    assert not list(server.folder.glob("status.json.log*"))
    assert run_entrypoint("probe", "--ready-file", str(server.ready)).returncode == 0


def running_requests(served: Served) -> float:
    """vLLM's own count of running requests, from its /metrics (the API server
    answers it while the engine is stopped: the count from the engine's last step)."""
    with _OPENER.open(f"http://127.0.0.1:{served.port}/metrics", timeout=10) as response:
        return metrics.parse(response.read().decode()).get(metrics.RUNNING, 0.0)


def stop_engine_mid_request(server: Served, tiny_model: str, core: int
                            ) -> tuple[threading.Thread, dict, float]:
    """SIGSTOP the engine while one long request runs: the stream's thread, what it
    saw and when the engine stopped. The tiny model writes its 1000 tokens in about
    a second, so on a loaded machine the request can end before the stop lands;
    then the engine goes on and a new request is tried."""
    body = {"model": tiny_model, "prompt": "the quick", "max_tokens": 1000,
            "min_tokens": 1000, "temperature": 0}
    for attempt in range(1, 6):
        seen: dict = {}
        streaming = threading.Thread(target=server.stream, args=(body, 300, seen),
                                     daemon=True)
        streaming.start()
        # A generation check starts only while the engine is idle, so only before
        # this stream; 20 decode steps on, any such check has had its one token.
        wait_for(lambda s=seen: s.get("chunks", 0) >= 20, 60, "20 tokens")
        os.kill(core, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            running = running_requests(server)
        except BaseException:
            os.kill(core, signal.SIGCONT)
            raise
        if running == 1:
            print(f"\nstopped mid-request at try {attempt}")
            return streaming, seen, stopped
        os.kill(core, signal.SIGCONT)
        streaming.join(120)
        wait_for(lambda: phase(server) == "ready", 60, "ready before the next try", step=0.1)
    pytest.fail("the request ended before the engine stopped, 5 times")


def test_sigstop_engine_with_a_running_request_turns_unhealthy_and_sigcont_recovers(
    server: Served, tiny_model: str
) -> None:
    core = engine_core(server)
    streaming, seen, stopped = stop_engine_mid_request(server, tiny_model, core)
    try:
        took = wait_for(lambda: phase(server) == "unhealthy", WEDGE_SECONDS + 15,
                        "unhealthy", step=0.1)
        print(f"\nunhealthy {took:.1f} s after SIGSTOP (window {WEDGE_SECONDS:g} s)")
        status = status_json(server)
        assert status["reason"].startswith("engine wedged: 1 request(s) running and no "
                                           "engine progress"), status["reason"]
        assert health_code(server) == 200  # what vLLM itself says meanwhile
        assert not server.ready.exists()
        probe = run_entrypoint("probe", "--ready-file", str(server.ready))
        assert probe.returncode == 1 and "engine wedged" in probe.stdout, probe.stdout
        waited = run_entrypoint("wait", "--ready-file", str(server.ready), "--timeout", "30")
        assert waited.returncode == 1 and "not ready: engine wedged" in waited.stdout
        assert time.monotonic() - stopped >= WEDGE_SECONDS
    finally:
        os.kill(core, signal.SIGCONT)
    took = wait_for(lambda: phase(server) == "ready", 60, "ready again", step=0.1)
    print(f"ready {took:.1f} s after SIGCONT")
    streaming.join(120)
    assert seen["finish_reason"] == "length" and seen["error"] is None, seen


def test_generation_check_catches_an_idle_engine_that_takes_no_work(server: Served) -> None:
    wait_for(lambda: phase(server) == "ready", 60, "ready")
    core = engine_core(server)
    os.kill(core, signal.SIGSTOP)
    try:
        took = wait_for(lambda: phase(server) == "unhealthy",
                        CHECK_INTERVAL + CHECK_TIMEOUT + 15, "unhealthy", step=0.1)
        print(f"\nidle engine unhealthy {took:.1f} s after SIGSTOP")
        reason = status_json(server)["reason"]
        assert reason == f"generation check: no token within {CHECK_TIMEOUT:g} s", reason
        assert health_code(server) == 200
    finally:
        os.kill(core, signal.SIGCONT)
    wait_for(lambda: phase(server) == "ready", 60, "ready again", step=0.1)
