"""A headless worker node's end (entrypoint/start/vllm_serve.py): named when asked, never 0
when not.

The node here is a real process that does what vLLM's `run_headless` does for a
worker node: it installs a SIGTERM/SIGINT handler that raises a bare SystemExit, then
waits on its rank's sentinel (`multiprocessing.connection.wait`) and returns when the
rank exits. vLLM itself is not imported: the wrapper sees only the handler and the end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fixtures.serving import REPO

pytestmark = pytest.mark.process

NODE = textwrap.dedent("""
    import multiprocessing, multiprocessing.connection, signal, sys, time
    from entrypoint.start.vllm_serve import run_headless_node

    def rank():
        time.sleep(float(sys.argv[1]))

    def run_headless():  # vLLM's shape: a bare SystemExit on a stop signal
        def on_stop(signum, frame):
            raise SystemExit
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        proc = multiprocessing.get_context("fork").Process(target=rank, daemon=True)
        proc.start()
        print("waiting", flush=True)
        multiprocessing.connection.wait([proc.sentinel])

    if __name__ == "__main__":
        sys.exit(run_headless_node(run_headless))
""")


def start(rank_seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", NODE, str(rank_seconds)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
    return proc


def test_a_node_asked_to_stop_says_so_and_exits_0() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        node = start(60)
        time.sleep(0.2)
        node.send_signal(sig)
        _, err = node.communicate(timeout=30)
        assert node.returncode == 0, err
        assert f"frontier-serve: this node's vLLM received {sig.name}: stopping" in err


def test_a_node_that_ends_on_its_own_exits_1_saying_why() -> None:
    # Its rank exits after 0.5 s; vLLM's run_headless would return, and exit 0.
    node = start(0.5)
    _, err = node.communicate(timeout=60)
    assert node.returncode == 1, err
    assert "frontier-serve: error: this worker node's vLLM ended without being asked to" in err
    assert "received" not in err
