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

from entrypoint.watch import metrics, steps
from fixtures.serving import (
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
# Tokens in the request the engine is stopped under, cancelled once it has shown it
# outlived the stop. The engine must still be at it when the stop lands, and on a
# loaded machine it runs ahead of the API server that streams its tokens: a CI run
# stopped an idle engine after 1000 tokens (about a second of the tiny model). With
# two other busy processes on two cores it made all 30000 while the client read 2000,
# so the test also lowers the engine's priority (engine_yields_cpu).
LONG = 30000
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(
        tmp_path_factory.mktemp("watchdog"),
        SERVE_MODEL=tiny_model,
        # Room for one LONG request (RoPE has no limit past the tiny model's 1024).
        SERVE_MAX_MODEL_LEN=str(LONG + 64),
        SERVE_HF_OVERRIDES=f'{{"max_position_embeddings": {LONG + 64}}}',
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


def engine_yields_cpu(core: int) -> None:
    """Nice 19 for each of the engine's threads (Linux keeps a nice value per thread,
    and threads made later inherit it): the API server and the test's client then
    keep up with what the engine makes, however loaded the machine is."""
    for tid in os.listdir(f"/proc/{core}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), 19)


def idle(served: Served) -> bool:
    sample = served.metrics()
    return not sample.get(metrics.RUNNING) and not sample.get(metrics.WAITING)


def phase(served: Served) -> str | None:
    return status_json(served).get("phase")


def test_without_log_capture_the_status_works_as_before(server: Served) -> None:
    status = status_json(server)
    assert status["phase"] == "ready" and status["log_capture"] == "off: SERVE_LOG_CAPTURE=false"
    assert "error" not in status and "log_tail" not in status
    # Without vLLM's log only serve's and the watcher's own steps are known.
    assert [s["step"] for s in status["steps"]] == [
        steps.VALIDATING, steps.IMPORTING_VLLM, steps.PREFLIGHT, steps.STARTING_VLLM, steps.SERVING]
    assert not list(server.folder.glob("status.json.log*"))
    assert run_entrypoint("probe", "--ready-file", str(server.ready)).returncode == 0


def test_sigstop_engine_with_a_running_request_turns_unhealthy_and_sigcont_recovers(
    server: Served, tiny_model: str
) -> None:
    core = engine_core(server)
    engine_yields_cpu(core)
    seen: dict = {}
    cancel = threading.Event()
    body = {"model": tiny_model, "prompt": "the quick", "max_tokens": LONG,
            "min_tokens": LONG, "temperature": 0}
    streaming = threading.Thread(target=server.stream, args=(body, 600, seen, cancel),
                                 daemon=True)
    streaming.start()
    # A generation check starts only while the engine is idle, so only before this
    # stream; 20 decode steps on, any such check has had its one token.
    wait_for(lambda: seen.get("chunks", 0) >= 20, 60, "20 tokens")
    os.kill(core, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert "ended" not in seen, f"the request ended before the stop: {seen}"
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
    # Ready again means the engine moved, and this request was all it had: it
    # outlived the stop. Its stream flows on, with no error, until cancelled.
    at_resume = seen["chunks"]
    wait_for(lambda: seen["chunks"] > at_resume + 100 or "ended" in seen, 120, "more tokens")
    cancel.set()
    streaming.join(120)
    assert seen["error"] is None and seen.get("cancelled"), seen
    assert seen["finish_reason"] is None  # still running when it was cancelled


def test_generation_check_catches_an_idle_engine_that_takes_no_work(server: Served) -> None:
    wait_for(lambda: phase(server) == "ready", 60, "ready")
    # A request cancelled before is aborted in vLLM by the disconnect.
    wait_for(lambda: idle(server), 60, "an idle engine", step=0.2)
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
