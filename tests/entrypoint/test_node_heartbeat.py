"""The leader's heartbeat (entrypoint/watch/node_heartbeat.py): real sockets on 127.0.0.1 and a
real process that is stopped (SIGSTOP) and continued, as a frozen node's watcher is."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from entrypoint.watch import node_heartbeat, node_links, watcher
from fixtures.serving import free_port, stopped, wait_for

REPO = Path(__file__).resolve().parents[2]


def test_a_watcher_answers_and_a_silent_listener_does_not() -> None:
    port = free_port()
    server = node_heartbeat.start_answering(port)
    try:
        assert node_heartbeat.ping("127.0.0.1", port)
        assert node_heartbeat.ping("127.0.0.1", port)  # and again: one connection a ping
    finally:
        node_heartbeat.stop_answering(server)
    assert not node_heartbeat.ping("127.0.0.1", port, timeout=0.5)  # nothing listens
    # A socket that listens but never answers: the kernel accepts, nobody writes.
    with socket.create_server(("127.0.0.1", 0)) as mute:
        started = time.monotonic()
        assert not node_heartbeat.ping("127.0.0.1", mute.getsockname()[1], timeout=0.5)
        assert time.monotonic() - started < 2


@pytest.mark.process
def test_a_stopped_process_stops_answering_and_answers_again() -> None:
    port = free_port()
    code = (
        "import time\nfrom entrypoint.watch import node_heartbeat\n"
        f"node_heartbeat.start_answering({port})\ntime.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        wait_for(lambda: node_heartbeat.ping("127.0.0.1", port, 0.5), 30, "answers", step=0.2)
        proc.send_signal(signal.SIGSTOP)
        # The stop lands when the kernel next schedules the process; on a loaded machine
        # a ping sent at once can still be answered (seen with make test's shards).
        wait_for(lambda: stopped(proc.pid), 10, "stopped", step=0.05)
        assert not node_heartbeat.ping("127.0.0.1", port, timeout=1.0)
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: node_heartbeat.ping("127.0.0.1", port, 0.5), 10, "answers again",
                 step=0.2)  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_silence_counts_from_the_last_answer() -> None:
    clock = Clock()
    answers = {"10.0.0.2": True, "10.0.0.3": True}
    beat = node_heartbeat.Heartbeat(29502, clock, lambda a, p: answers[a])
    beat.watch(["10.0.0.2", "10.0.0.3"])
    beat.round()
    answers["10.0.0.3"] = False
    clock.now += node_heartbeat.SILENCE  # not past it yet
    beat.round()
    assert beat.silent() == {}
    clock.now += 1
    assert beat.silent() == {"10.0.0.3": node_heartbeat.SILENCE + 1}
    error = node_heartbeat.silent_node_error(beat.silent(), 29502, 3)
    assert error == (
        "lost a worker node at 10.0.0.3 (silent 11 s): no answer to the leader's heartbeat "
        "(port 29502) although its connections to the leader's store stay open: a frozen "
        "node or a cut network; the group cannot serve"
    )
    answers["10.0.0.3"] = True
    beat.round()
    assert beat.silent() == {} and node_heartbeat.silent_node_error({}, 29502, 3) is None


def test_the_leader_names_a_node_that_went_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its store connections stay (a frozen node closes nothing): only the heartbeat tells.
    monkeypatch.setattr(node_links, "remote_ranks", lambda port, pids: Counter({"127.0.0.1": 1}))
    port = free_port()
    group = watcher.NodeGroup({"role": "leader", "nnodes": 2, "store_port": 29500,
                               "remote_ranks": 1, "local_ranks": 1,
                               "heartbeat_port": port})  # fmt: skip
    assert group.heartbeat is not None
    clock = Clock()
    group.heartbeat.clock = clock
    assert group.check([1], ever_ready=True) is None  # serving: the node is watched now
    group.heartbeat.round()  # nothing answers on the port
    clock.now += node_heartbeat.SILENCE + 2
    lost = group.check([1], ever_ready=True) or ""
    assert lost.startswith("lost a worker node (node rank 1) at 127.0.0.1 (silent 12 s)"), lost
    assert f"heartbeat (port {port})" in lost
    server = node_heartbeat.start_answering(port)
    try:
        group.heartbeat.round()
        assert group.check([1], ever_ready=True) is None
    finally:
        node_heartbeat.stop_answering(server)


def test_a_worker_group_answers_from_its_watcher() -> None:
    port = free_port()
    group = watcher.NodeGroup({"role": "worker", "nnodes": 2, "store_port": 29500,
                               "local_ranks": 1, "heartbeat_port": port})  # fmt: skip
    assert group.heartbeat is None
    assert group.start(threading_event()) is None
    assert node_heartbeat.ping("127.0.0.1", port)
    # A second one on the same port says why it cannot answer.
    again = watcher.NodeGroup({"role": "worker", "heartbeat_port": port})
    assert f"SERVE_HEARTBEAT_PORT={port}" in (again.start(threading_event()) or "")


def test_a_lost_node_comes_before_the_apis_failure() -> None:
    # The e2e kill once saw the leader's /health fail before the store check ran, and
    # the reason named no node (CI at a9145ae).
    lost = "lost a worker node (node rank 1) at 10.0.0.2: 0 of the 1 remote ranks ..."
    health = "/health: HTTP 500"
    assert watcher.root_cause_first(lost, health) == f"{lost} (and the API fails: {health})"
    assert watcher.root_cause_first(None, health) == health
    assert watcher.root_cause_first(lost, None) == lost
    assert watcher.root_cause_first(None, None) is None


def threading_event():  # noqa: ANN201 - a fresh stop event
    import threading

    return threading.Event()
