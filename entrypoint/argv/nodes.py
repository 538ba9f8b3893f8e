"""Multi-node roles on vLLM's own multi-node engine (`--nnodes`, `--node-rank`,
`--master-addr`, `--master-port`, `--headless`).

The role follows from two vLLM options, so there is nothing extra to keep in step:
- single: `--nnodes 1` (the default), as before;
- leader: `--nnodes N > 1`, `--node-rank 0`: the API server, ranks 0..k-1 of the group;
- worker: `--node-rank r > 0`: a headless node (no HTTP), ranks r·k..r·k+k-1. The
  entrypoint adds `--headless` and execs `entrypoint.start.vllm_serve`, since vLLM's
  api_server module ignores `--headless`.

Everything here is checked from the parsed options and the environment alone (no
network), except `wait_for_leader`, which a worker runs last before the exec.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from entrypoint.argv import settings
from entrypoint.argv.settings import SettingError
from entrypoint.errors import ConfigError
from entrypoint.host import gpus

SINGLE, LEADER, WORKER = "single", "leader", "worker"
HEADLESS = "SERVE_HEADLESS"
MASTER_ADDR = "SERVE_MASTER_ADDR"
NODE_RANK = "SERVE_NODE_RANK"
NNODES = "SERVE_NNODES"
DEFAULT_LEADER_TIMEOUT = 600.0
HEARTBEAT_PORT_OFFSET = 1000  # the heartbeat's default port: the store's + this


@dataclass(frozen=True)
class Node:
    role: str
    nnodes: int
    rank: int
    master_addr: str
    master_port: int
    world: int = 1  # ranks over all nodes

    @property
    def remote_ranks(self) -> int:
        """Ranks on the other nodes: the leader expects each connected to its store."""
        return self.world - self.world // max(self.nnodes, 1)

    @property
    def leader_endpoint(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"{host}:{self.master_port}"

    def describe(self) -> dict[str, object]:
        """The status file's `node` entry."""
        return {"role": self.role, "rank": self.rank, "nnodes": self.nnodes,
                "leader": self.leader_endpoint, "store_port": self.master_port,
                "local_ranks": self.world // max(self.nnodes, 1),
                "remote_ranks": self.remote_ranks if self.role == LEADER else None}  # fmt: skip


def node_of(namespace: argparse.Namespace) -> Node:
    nnodes = int(getattr(namespace, "nnodes", None) or 1)
    rank = int(getattr(namespace, "node_rank", None) or 0)
    role = SINGLE if nnodes <= 1 else LEADER if rank == 0 else WORKER
    world = math.prod(v for _, v in world_factors(namespace))
    return Node(role, nnodes, rank, str(getattr(namespace, "master_addr", "") or ""),
                int(getattr(namespace, "master_port", 0) or 0), world)  # fmt: skip


def wants_headless(env: Mapping[str, str]) -> bool | None:
    """SERVE_HEADLESS as the operator set it (None: not set)."""
    raw = env.get(HEADLESS, "").strip()
    return None if not raw else settings.parse_bool(HEADLESS, raw)


def world_factors(namespace: argparse.Namespace) -> list[tuple[str, int]]:
    """The factors of vLLM's world size (all ranks over all nodes), named by variable."""
    names = [
        ("SERVE_TENSOR_PARALLEL_SIZE", "tensor_parallel_size"),
        ("SERVE_PIPELINE_PARALLEL_SIZE", "pipeline_parallel_size"),
        ("SERVE_PREFILL_CONTEXT_PARALLEL_SIZE", "prefill_context_parallel_size"),
        ("SERVE_DATA_PARALLEL_SIZE", "data_parallel_size"),
    ]
    factors = [(name, int(getattr(namespace, dest, None) or 1)) for name, dest in names]
    return [(n, v) for n, v in factors if v > 1 or n in {names[0][0], names[1][0]}]


def layout_problems(
    namespace: argparse.Namespace, given: set[str], env: Mapping[str, str]
) -> list[str]:
    """Problems with the multi-node options, before anything loads.

    `given` holds the dests of the options the operator set (vLLM's defaults, such as
    master_addr 127.0.0.1, are no answer on a real cluster)."""
    node = node_of(namespace)
    problems: list[str] = []
    try:
        headless = wants_headless(env)
    except SettingError as exc:
        return list(exc.problems)
    if node.role == SINGLE:
        if node.rank > 0:
            problems.append(
                f"{NODE_RANK}={node.rank} is out of range: {NNODES} is {node.nnodes}, so the only "
                f"node rank is 0; set {NNODES} to the number of nodes"
            )
        return problems
    if not 0 <= node.rank < node.nnodes:
        problems.append(
            f"{NODE_RANK}={node.rank} is out of range for {NNODES}={node.nnodes}: node ranks "
            f"are 0 (the leader) to {node.nnodes - 1}"
        )
    if "master_addr" not in given or not node.master_addr.strip():
        problems.append(
            f"{MASTER_ADDR} is not set: with {NNODES}={node.nnodes} every node needs the "
            "leader's address (a name or IP the other nodes reach; under LeaderWorkerSet, "
            "$(LWS_LEADER_ADDRESS))"
        )
    if node.rank == 0 and headless:
        problems.append(
            f"{HEADLESS}=true on node rank 0: the leader is the node that serves the API; "
            f"only workers ({NODE_RANK} > 0) run headless, and the entrypoint sets that itself"
        )
    if node.rank > 0 and headless is False:
        problems.append(
            f"{HEADLESS}=false on node rank {node.rank}: a worker node has no API server "
            f"in vLLM's multi-node engine; leave {HEADLESS} unset"
        )
    backend = getattr(namespace, "distributed_executor_backend", None)
    if backend not in (None, "mp"):
        problems.append(
            f"SERVE_DISTRIBUTED_EXECUTOR_BACKEND={backend}: {NNODES} > 1 runs on vLLM's own "
            "multi-node engine, which needs the mp backend (leave it unset)"
        )
    factors = world_factors(namespace)
    world = math.prod(v for _, v in factors)
    if world % node.nnodes:
        product = " × ".join(f"{n}={v}" for n, v in factors)
        problems.append(
            f"{product} gives {world} ranks, which do not split evenly over {NNODES}="
            f"{node.nnodes} nodes: TP × PP must equal nodes × GPUs per node (the usual "
            "layout: tensor parallel = GPUs per node, pipeline parallel = nodes)"
        )
    return problems


def gpus_per_node_problems(namespace: argparse.Namespace, env: Mapping[str, str]) -> list[str]:
    """On a CUDA build, a node must see exactly its share of the ranks: vLLM gives each
    node world/nnodes local ranks, one per GPU, so more GPUs than that sit idle (a
    layout that does not match the nodes). Fewer is gpus.require_enough_gpus's to say."""
    node = node_of(namespace)
    if node.role == SINGLE or not gpus.vllm_is_cuda_build():
        return []
    factors = world_factors(namespace)
    world = math.prod(v for _, v in factors)
    if world % node.nnodes:
        return []  # layout_problems names it
    per_node = world // node.nnodes
    view = gpus.gpu_view(env)
    if view.count <= per_node:
        return []
    product = " × ".join(f"{n}={v}" for n, v in factors)
    return [
        f"{product} over {NNODES}={node.nnodes} nodes puts {per_node} ranks on each node, "
        f"but this node sees {view.count} GPUs ({view.detail}), {view.count - per_node} of "
        f"them idle: set the sizes so that TP × PP = nodes × GPUs per node, or give every "
        f"node exactly {per_node} GPUs (CUDA_VISIBLE_DEVICES, nvidia.com/gpu)"
    ]


def leader_timeout(env: Mapping[str, str]) -> float:
    return settings.number(env, settings.LEADER_TIMEOUT, DEFAULT_LEADER_TIMEOUT, 1, 86400)


def heartbeat_port(env: Mapping[str, str], node: Node) -> int:
    """The port each worker node's watcher answers the leader's heartbeat on
    (entrypoint/watch/node_heartbeat.py): SERVE_HEARTBEAT_PORT, else the store's + 1000."""
    name = settings.HEARTBEAT_PORT
    raw = env.get(name, "").strip()
    if not raw:
        port = node.master_port + HEARTBEAT_PORT_OFFSET
        if port > 65535:
            raise SettingError(
                [f"{name} is not set and SERVE_MASTER_PORT={node.master_port} + "
                 f"{HEARTBEAT_PORT_OFFSET} is past 65535: set {name} to a free port (1-65535)"]
            )  # fmt: skip
        return port
    port = settings.count(env, name, 0, 1, 65535)
    if port == node.master_port:
        raise SettingError(
            [f"{name}={port} is SERVE_MASTER_PORT's too: the heartbeat needs a port of its own"]
        )
    return port


def try_connect(host: str, port: int, timeout: float) -> str | None:
    """None when host:port accepts a TCP connection, else why not (closed at once:
    torch's TCPStore server, which listens there, drops a client that says nothing)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def wait_for_leader(
    node: Node,
    timeout: float,
    connect: Callable[[str, int, float], str | None] = try_connect,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    step: float = 2.0,
) -> float:
    """A worker waits for the leader's torch.distributed store (master addr:port) to
    accept a connection; seconds waited, or a ConfigError naming the address.

    The leader opens that port only once its own ranks start, so a worker started at
    the same time (LeaderWorkerSet starts a group together) waits here, not inside
    vLLM, where a leader that never comes ends in a torch traceback much later."""
    start = clock()
    announced = False
    while True:
        why = connect(node.master_addr, node.master_port, min(step, 5.0))
        waited = clock() - start
        if why is None:
            return waited
        if waited >= timeout:
            raise ConfigError(
                f"the leader at {node.leader_endpoint} ({MASTER_ADDR}, SERVE_MASTER_PORT) "
                f"did not accept a connection within {timeout:g} s ({why}); check that "
                f"node rank 0 is running and that this node can reach it "
                f"({settings.LEADER_TIMEOUT} sets the wait)"
            )
        if not announced:
            print(f"frontier-serve: waiting up to {timeout:g} s for the leader at "
                  f"{node.leader_endpoint} ({why})", file=sys.stderr, flush=True)  # fmt: skip
            announced = True
        sleep(step)
