"""A node that stops answering, in bounded time: the leader's heartbeat. Stdlib-only.

node_links.py sees a worker node go when the kernel closes its connections to the
leader's store. A frozen node (every process stopped, or a host that hangs) or a cut
network closes nothing: the connections stay ESTABLISHED on the leader for as long
as TCP's keepalive (off on those sockets) would take. So each worker node's watcher
answers a one-line ping on SERVE_HEARTBEAT_PORT, and the leader's watcher pings every
node it saw serving: a node that has not answered for SILENCE seconds is lost. The
answer comes from the worker's watcher, a process of the node's own group: stopping
the node stops it as well, and the listening socket's kernel backlog, which would
still accept connections, never writes the answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable

PING, PONG = b"ping\n", b"pong\n"
PERIOD = 2.0  # seconds between the leader's pings of a node (and each one's timeout)
# A node silent this long is lost: five pings missed. With the watcher's default 3
# failed rounds of 2 s, a frozen node turns the leader unhealthy in about 16-20 s.
SILENCE = 10.0


def listen(port: int) -> socket.socket:
    """The worker's listening socket on every address (IPv6 and IPv4 where both exist)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def answer_forever(server: socket.socket) -> None:
    """Answer each ping with a pong, one connection at a time (the leader sends one
    ping every PERIOD seconds)."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed
        with conn:
            try:
                conn.settimeout(PERIOD)
                if conn.recv(16).startswith(PING):
                    conn.sendall(PONG)
            except OSError:
                continue


def start_answering(port: int) -> socket.socket:
    """Bind the port now (an error the caller reports) and answer in a daemon thread."""
    server = listen(port)
    threading.Thread(target=answer_forever, args=(server,), name="heartbeat", daemon=True).start()
    return server


def stop_answering(server: socket.socket) -> None:
    """Close the port and end the answering thread (a bare close leaves it in accept)."""
    with contextlib.suppress(OSError):  # not connected or already closed
        server.shutdown(socket.SHUT_RDWR)
    server.close()


def ping(address: str, port: int, timeout: float = PERIOD) -> bool:
    """Whether the node at `address` answers its heartbeat within `timeout` seconds."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(PING)
            return conn.recv(16).startswith(PONG)
    except OSError:
        return False


class Heartbeat:
    """The leader's side: ping every known node every PERIOD seconds from a daemon
    thread, and keep when each last answered."""

    def __init__(
        self,
        port: int,
        clock: Callable[[], float] = time.monotonic,
        pinger: Callable[[str, int], bool] = ping,
    ) -> None:
        self.port = port
        self.clock = clock
        self.pinger = pinger
        self.last_answer: dict[str, float] = {}
        self._lock = threading.Lock()

    def watch(self, addresses: Iterable[str]) -> None:
        """Start counting these nodes' silence from now (those not watched yet)."""
        now = self.clock()
        with self._lock:
            for address in addresses:
                self.last_answer.setdefault(address, now)

    def round(self) -> None:
        with self._lock:
            addresses = list(self.last_answer)
        for address in addresses:
            if self.pinger(address, self.port):
                with self._lock:
                    self.last_answer[address] = self.clock()

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = self.clock()
            self.round()
            stop.wait(max(0.0, PERIOD - (self.clock() - started)))

    def silent(self) -> dict[str, float]:
        """Nodes silent for longer than SILENCE: address -> seconds since their last answer."""
        now = self.clock()
        with self._lock:
            return {a: now - t for a, t in self.last_answer.items() if now - t > SILENCE}


def silent_node_error(silent: dict[str, float], port: int, nnodes: int) -> str | None:
    """None while every node answers; else which node went quiet, in words."""
    if not silent:
        return None
    rank = " (node rank 1)" if nnodes == 2 else ""
    where = ", ".join(f"{a} (silent {s:.0f} s)" for a, s in sorted(silent.items()))
    return (
        f"lost a worker node{rank} at {where}: no answer to the leader's heartbeat (port "
        f"{port}) although its connections to the leader's store stay open: a frozen node "
        "or a cut network; the group cannot serve"
    )
