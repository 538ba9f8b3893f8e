"""A start budget that follows progress: a start that stops moving is ended within its
step's stall limit, one that keeps moving is never ended, and `probe --live` says which.

In-process cases drive the watcher's Tracker with a clock of their own; the process
cases run the real watcher (`python -m entrypoint.watch.watcher`) over a stand-in for vLLM (a
sleeping process with a child, as vLLM's engine) whose load progress files the test
writes as the plugin's ranks do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.argv import settings
from entrypoint.errors import ConfigError
from entrypoint.watch import probe, stall, status_summary
from entrypoint.watch.statusfile import pid_alive, read_json, write_json_atomic
from entrypoint.watch.steps import COMPILING, LOADING
from entrypoint.watch.watcher import STARTING, Tracker, WatchConfig
from fixtures.serving import gone, wait_for
from tests.entrypoint.test_entrypoint_process import ENV, REPO, FakeVllm, fake_server  # noqa: F401

GIB = 2**30


def rank_file(folder: Path, done: int, total: int = 10 * GIB, rank: int = 0) -> None:
    write_json_atomic(str(folder / f"rank-{rank}.json"),
                      {"rank": rank, "done_bytes": done, "total_bytes": total,
                       "finished": done >= total})


def tracker(tmp_path: Path, now: list[float], **limits: float) -> Tracker:
    folder = tmp_path / "status.json.load"
    folder.mkdir(exist_ok=True)
    config = WatchConfig(pid=1, base_url="http://127.0.0.1:9", ready_file=str(tmp_path / "r"),
                         status_file=str(tmp_path / "status.json"), argv_digest="d",
                         load_progress_dir=str(folder),
                         stall={**settings.DEFAULT_STALL, **limits})
    return Tracker(config, clock=lambda: now[0])


def test_a_load_that_stops_is_stalled_after_its_limit(tmp_path: Path) -> None:
    now = [1000.0]
    t = tracker(tmp_path, now, SERVE_STALL_LOAD=60.0)
    folder = Path(t.config.load_progress_dir or "")
    rank_file(folder, 1 * GIB)
    assert t.stalled() is None
    rank_file(folder, 2 * GIB)
    now[0] += 30
    assert t.stalled() is None  # moved
    now[0] += 60
    assert t.stalled() is None  # 60 s still: at the limit, not past it
    now[0] += 1
    why = t.stalled()
    assert why == ("start stalled: starting vLLM made no progress for 61.0 s "
                   "(limit 60 s, SERVE_STALL_LOAD)")
    t.give_up(why)
    status = read_json(t.config.status_file)
    assert status is not None and status["phase"] == "unhealthy" and status["reason"] == why
    t.exited(15)  # SIGTERM
    status = read_json(t.config.status_file)
    assert status is not None and status["reason"].startswith(why + "; vLLM killed by SIGTERM")


def test_a_slow_load_that_keeps_moving_is_never_stalled(tmp_path: Path) -> None:
    now = [0.0]
    t = tracker(tmp_path, now, SERVE_STALL_LOAD=60.0)
    folder = Path(t.config.load_progress_dir or "")
    for step in range(200):  # 50 MB every 55 s: a 10 GiB load over 3 hours
        rank_file(folder, step * 50 * 2**20)
        assert t.stalled() is None, step
        now[0] += 55
    status = t.status()  # 55 s after the last write
    assert status["progress"]["quiet_s"] == 55.0 and status["loading"]["rate"] > 0


def test_each_step_has_its_own_limit_and_zero_is_off(tmp_path: Path) -> None:
    now = [0.0]
    t = tracker(tmp_path, now, SERVE_STALL_COMPILE=600.0, SERVE_STALL_OTHER=100.0)
    t.steps.enter(COMPILING, now[0])
    assert t.stalled() is None  # a new step: progress (the watcher looks every round)
    now[0] += 500
    assert t.stalled() is None  # compiling reports nothing within: the long limit
    now[0] += 101
    assert "compiling made no progress for 601 s (limit 600 s, SERVE_STALL_COMPILE)" in (
        t.stalled() or "")
    off = tracker(tmp_path, [0.0], SERVE_STALL_OTHER=0.0)
    off.clock = lambda: 10**6
    assert off.stalled() is None
    assert stall.limit_for(LOADING, False, settings.DEFAULT_STALL) == (
        settings.STALL_COMPILE, 2700.0)  # no bytes reported: a quiet step
    assert stall.limit_for(None, True, settings.DEFAULT_STALL)[0] == settings.STALL_LOAD


def test_a_ready_server_has_no_stall_watch(tmp_path: Path) -> None:
    now = [0.0]
    t = tracker(tmp_path, now, SERVE_STALL_OTHER=60.0)
    t.record(None)  # answered: ready
    now[0] += 10**5
    assert t.stalled() is None and "progress" not in t.status()


@pytest.mark.parametrize(("name", "value"), [("SERVE_STALL_LOAD", "-1"),
                                             ("SERVE_STALL_COMPILE", "nan"),
                                             ("SERVE_STALL_OTHER", "5"),
                                             ("SERVE_START_LIMIT", "10")])
def test_stall_settings_are_checked(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        settings.watch_settings({name: value})
    assert settings.watch_settings({"SERVE_STALL_LOAD": "0"}).stall["SERVE_STALL_LOAD"] == 0


def live_status(tmp_path: Path, **fields: object) -> str:
    ready = tmp_path / "ready"
    base = {"phase": STARTING, "heartbeat": 1000.0, "stale_after": 15.0, "step": LOADING,
            "progress": {"quiet_s": 10.0, "stall_limit_s": 600.0, "start_s": 100.0,
                         "limit_setting": "SERVE_STALL_LOAD", "step": LOADING,
                         "start_limit_s": 21600.0}}
    write_json_atomic(str(tmp_path / "status.json"), {**base, **fields})
    return str(ready)


def test_probe_live_follows_progress(tmp_path: Path) -> None:
    ready = live_status(tmp_path)
    code, line = probe.live(ready, now=1005.0)
    assert code == 0 and line == "starting: loading weights, last progress 15 s ago (limit 600 s)"
    code, line = probe.live(ready, now=1010.0 + 0.0)
    assert code == 0
    quiet = {"quiet_s": 598.0, "stall_limit_s": 600.0, "start_s": 700.0, "step": LOADING,
             "limit_setting": "SERVE_STALL_LOAD", "start_limit_s": 21600.0}
    ready = live_status(tmp_path, progress=quiet)
    assert probe.live(ready, now=1001.0)[0] == 0
    code, line = probe.live(ready, now=1003.0)  # 601 s without progress
    assert code == 1 and line.startswith("stalled: loading weights made no progress for 601 s")
    code, line = probe.live(ready, now=1020.0)  # the watcher stopped writing
    assert code == 1 and "heartbeat is 20.0s old" in line
    long = {**quiet, "quiet_s": 1.0, "start_s": 21599.0}
    code, line = probe.live(live_status(tmp_path, progress=long), now=1002.0)
    assert code == 1 and "SERVE_START_LIMIT" in line
    code, line = probe.live(live_status(tmp_path, phase="exited", reason="vLLM exited"), 1001.0)
    assert code == 1 and line.startswith("exited")


def test_status_shows_rate_eta_and_the_stall_limit() -> None:
    text = status_summary.summarize(
        {"phase": "starting", "step": LOADING,
         "loading": {"done_bytes": 4 * GIB, "total_bytes": 10 * GIB, "percent": 40, "ranks": 8,
                     "rate": GIB, "eta_s": 6.0},
         "progress": {"quiet_s": 3.0, "stall_limit_s": 600.0,
                      "limit_setting": "SERVE_STALL_LOAD"}}, now=0.0)
    assert "loading weights 4.00 of 10.00 GiB (40%, 8 rank(s)), 1.00 GiB/s, about 6 s left" in text
    assert "last progress 3 s ago; the start is ended after 10.0 min without" in text


@pytest.fixture
def stalled_start(tmp_path: Path, fake_server: str) -> Iterator[tuple[subprocess.Popen, dict]]:  # noqa: F811
    """A stand-in vLLM with an 'engine' child; health answers 503 (still starting)."""
    FakeVllm.health = 503
    target = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, text=True)
    engine = int(target.stdout.readline())  # type: ignore[union-attr]
    folder = tmp_path / "status.json.load"
    folder.mkdir()
    config = WatchConfig(pid=target.pid, base_url=fake_server, ready_file=str(tmp_path / "ready"),
                         status_file=str(tmp_path / "status.json"), argv_digest="d",
                         interval=0.2, timeout=0.5, load_progress_dir=str(folder),
                         stall={**settings.DEFAULT_STALL, "SERVE_STALL_LOAD": 3.0},
                         stall_grace=1.0)
    watcher = subprocess.Popen([sys.executable, "-m", "entrypoint.watch.watcher", config.to_json()],
                               env=ENV, cwd=REPO)
    yield target, {"engine": engine, "folder": folder, "config": config, "watcher": watcher}
    FakeVllm.health = 200
    for proc in (target, watcher):
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.process
def test_a_start_stalled_mid_load_is_ended_within_its_limit(stalled_start) -> None:  # type: ignore[no-untyped-def]
    target, parts = stalled_start
    rank_file(parts["folder"], 3 * GIB)
    began = time.monotonic()
    # Not reaped until the watcher has read its exit status from the zombie, as in a
    # container, where no one reaps vLLM (PID 1): a wait() here would race that read.
    wait_for(lambda: gone(target.pid), 30, "the stand-in vLLM ended")
    took = time.monotonic() - began
    print(f"\nstalled start ended {took:.1f} s after its last progress (limit 3 s)")
    assert 3.0 <= took <= 3.0 + 1.0 + 3.0  # the limit, the grace, a few rounds
    assert parts["watcher"].wait(timeout=10) == 0
    code = target.wait(timeout=5)
    assert code == -15 and not pid_alive(parts["engine"])  # the engine went first
    status = read_json(parts["config"].status_file)
    assert status is not None and status["phase"] == "exited"
    assert status["reason"].startswith("start stalled: starting vLLM made no progress for ")
    assert "(limit 3 s, SERVE_STALL_LOAD); vLLM killed by SIGTERM before it became ready" in (
        status["reason"])
    assert f"SIGKILL {parts['engine']}" in status["stall_signals"]


@pytest.mark.process
def test_a_slow_start_that_keeps_moving_is_not_ended(stalled_start) -> None:  # type: ignore[no-untyped-def]
    target, parts = stalled_start
    for step in range(1, 9):  # a byte count that moves every second for 8 s (limit 3 s)
        rank_file(parts["folder"], step * GIB)
        time.sleep(1.0)
        assert target.poll() is None, step
    code, line = probe.live(parts["config"].ready_file)
    assert code == 0 and line.startswith("starting:"), line
    FakeVllm.health = 200
    deadline = time.monotonic() + 10
    while not Path(parts["config"].ready_file).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probe.live(parts["config"].ready_file)[0] == 0
    assert target.poll() is None
