"""The watcher's phase machine, its files, and its HTTP checks (in-process only)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from entrypoint.watch.statusfile import (
    describe_wait_status,
    pid_alive,
    process_start,
    read_json,
    write_json_atomic,
    zombie_exit_status,
)
from entrypoint.watch.watcher import Tracker, WatchConfig, check_health
from fixtures.loopback import loopback_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tracker(tmp_path: Path) -> Tracker:
    config = WatchConfig(
        pid=os.getpid(),
        base_url="http://127.0.0.1:1",
        ready_file=str(tmp_path / "ready"),
        status_file=str(tmp_path / "status.json"),
        argv_digest="sha256:abc",
        failures=3,
    )
    return Tracker(config, clock=Clock())


def status_of(tracker: Tracker) -> dict:
    data = read_json(tracker.config.status_file)
    assert data is not None
    return data


def ready_exists(tracker: Tracker) -> bool:
    return Path(tracker.config.ready_file).exists()


def test_starting_failures_are_expected(tracker: Tracker) -> None:
    for _ in range(10):
        tracker.record("GET /health: connection refused")
    status = status_of(tracker)
    assert status["phase"] == "starting" and not ready_exists(tracker)
    assert status["last_error"] == "GET /health: connection refused"
    errored_at = status["last_error_at"]
    tracker.clock.now += 30  # type: ignore[attr-defined]
    tracker.record(None)
    status = status_of(tracker)
    # Ready now; the old error is kept, with the time that shows it is old.
    assert status["phase"] == "ready" and status["failures_in_row"] == 0
    assert status["last_error_at"] == errored_at < status["since"]


def test_ready_writes_both_files(tracker: Tracker) -> None:
    tracker.clock.now = 1005.0  # type: ignore[attr-defined]
    tracker.record(None)
    assert Path(tracker.config.ready_file).read_text() == (
        f"argv_digest=sha256:abc\nheartbeat=1005.0\nphase=ready\npid={os.getpid()}\n"
        f"pid_start={process_start(os.getpid())}\nstale_after=15.0\n"
    )
    status = status_of(tracker)
    assert status["phase"] == "ready" and status["since"] == 1005.0
    assert status["argv_digest"] == "sha256:abc" and status["pid"] == os.getpid()


def test_the_ready_file_never_runs_ahead_of_the_status(
    tracker: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a reader finds on disk at each file operation, in order: the readiness file
    # must never exist while the status says anything but ready.
    import entrypoint.watch.watcher as watcher

    seen: list[tuple[bool, str | None]] = []

    def after(fn):  # noqa: ANN001, ANN202 - wraps the module's own functions
        def wrapped(*args: object, **kwargs: object) -> None:
            fn(*args, **kwargs)
            status = read_json(tracker.config.status_file) or {}
            seen.append((ready_exists(tracker), status.get("phase")))

        return wrapped

    for name in ("write_ready", "write_json_atomic", "remove_quietly"):
        monkeypatch.setattr(watcher, name, after(getattr(watcher, name)))
    tracker.record("GET /health: connection refused")
    tracker.record(None)  # ready
    for _ in range(3):
        tracker.record("GET /health: HTTP 500")  # unhealthy
    tracker.record(None)  # ready again
    assert (False, "ready") in seen and (True, "ready") in seen
    assert (False, "unhealthy") in seen
    assert all(phase == "ready" for exists, phase in seen if exists), seen


def test_n_failures_in_a_row_make_unhealthy(tracker: Tracker) -> None:
    tracker.record(None)
    tracker.record("GET /health: HTTP 503")
    tracker.record("GET /health: HTTP 503")
    assert ready_exists(tracker)  # two are tolerated
    tracker.record(None)
    tracker.record("GET /health: HTTP 503")
    tracker.record("GET /health: HTTP 503")
    assert ready_exists(tracker)  # the count restarted after a success
    tracker.record("GET /health: HTTP 503")
    assert not ready_exists(tracker)
    status = status_of(tracker)
    assert status["phase"] == "unhealthy"
    assert status["reason"] == "3 failed health checks in a row: GET /health: HTTP 503"
    tracker.record(None)
    assert ready_exists(tracker) and status_of(tracker)["phase"] == "ready"


def test_an_unhealthy_reason_follows_the_latest_failure(tracker: Tracker) -> None:
    """A lost node found a round after /health failed names the cause, not the symptom
    (CI once saw the leader unhealthy with only the API's error in its reason)."""
    tracker.record(None)
    for _ in range(3):
        tracker.record("GET /health: timed out")
    since = status_of(tracker)["since"]
    tracker.record("lost a worker node (node rank 1) at 10.0.0.2 (and the API fails: timed out)")
    status = status_of(tracker)
    assert status["phase"] == "unhealthy" and status["since"] == since
    assert status["reason"].startswith("4 failed health checks in a row: lost a worker node")


@pytest.mark.parametrize(
    ("wait_status", "code", "words"),
    [
        (0, 0, "exited with code 0"),
        (256, 1, "exited with code 1"),
        (signal.SIGKILL, 137, "killed by SIGKILL"),
        (None, None, "exit code unknown"),
    ],
)
def test_exit_removes_ready_and_records_code(
    tracker: Tracker, wait_status: int | None, code: int | None, words: str
) -> None:
    tracker.record(None)
    tracker.exited(wait_status)
    assert not ready_exists(tracker)
    status = status_of(tracker)
    assert status["phase"] == "exited" and status["exit_code"] == code
    assert status["reason"].startswith(f"vLLM {words}")
    assert status["reason"].endswith("after it was ready")


def test_exit_before_ready_says_so(tracker: Tracker) -> None:
    tracker.record("GET /health: connection refused")
    tracker.exited(256)
    status = status_of(tracker)
    assert status["reason"] == "vLLM exited with code 1 before it became ready"
    assert status["ever_ready"] is False


def test_config_round_trip(tracker: Tracker) -> None:
    assert WatchConfig.from_json(tracker.config.to_json()) == tracker.config


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_json_atomic(str(target), {"a": 1})
    write_json_atomic(str(target), {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_process_facts() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(2**22 + 12345)  # above pid_max
    assert zombie_exit_status(os.getpid()) is None  # running, not a zombie
    assert describe_wait_status(2 << 8) == (2, "exited with code 2")


class Handler(BaseHTTPRequestHandler):
    health = 200
    models: bytes = b'{"data": [{"id": "m"}]}'
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        Handler.seen_auth.append(self.headers.get("Authorization"))
        code, body = (Handler.health, b"") if self.path == "/health" else (200, Handler.models)
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_vllm() -> Iterator[str]:
    Handler.health, Handler.seen_auth = 200, []
    Handler.models = b'{"data": [{"id": "m"}]}'
    with loopback_server(Handler) as url:
        yield url


def test_check_health_ok_and_key(fake_vllm: str) -> None:
    assert check_health(fake_vllm, 2.0, "k") is None
    assert Handler.seen_auth == ["Bearer k", "Bearer k"]


def test_check_health_errors(fake_vllm: str, free_tcp_port: int) -> None:
    Handler.health = 503
    assert check_health(fake_vllm, 2.0, None) == "GET /health: HTTP 503"
    Handler.health, Handler.models = 200, b'{"data": []}'
    assert check_health(fake_vllm, 2.0, None) == "GET /v1/models: no model listed"
    refused = check_health(f"http://127.0.0.1:{free_tcp_port}", 2.0, None)
    assert refused is not None and refused.startswith("GET /health: ") and "refused" in refused


def test_check_health_ignores_proxy_settings(
    fake_vllm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert check_health(fake_vllm, 2.0, None) is None


def test_api_key_for_health_checks() -> None:
    from entrypoint.watch.watcher import api_key_from

    assert api_key_from({}) is None
    assert api_key_from({"SERVE_API_KEY": "k1"}) == "k1"
    assert api_key_from({"SERVE_API_KEY": '["k1", "k2"]'}) == "k1"
    assert api_key_from({"VLLM_API_KEY": "v"}) == "v"

