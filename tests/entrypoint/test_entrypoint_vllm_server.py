"""`serve` against a real vLLM on CPU, with the tiny model built by `tiny-model`.

Three vLLM starts in all: one shared server (ready file, completion, probe, then a
clean SIGTERM), one that is killed with SIGKILL, and one whose model does not exist.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from entrypoint.statusfile import read_json, read_ready

pytestmark = pytest.mark.vllm_server
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 420.0  # a cold CPU start on a loaded 2-core machine
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def wait_for(check: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(step)
    return time.monotonic() - start


def session_pids(sid: int) -> list[int]:
    """Live processes of a session (vLLM and its engine/worker children)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    ready: Path
    status: Path
    log: Path

    def status_json(self) -> dict:
        return read_json(str(self.status)) or {}

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        """Leave nothing behind: the whole session, then the watcher (its own session)."""
        watcher = self.status_json().get("watcher_pid")
        for pid in session_pids(self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if watcher:
            wait_for(
                lambda: not Path(f"/proc/{watcher}").exists() or _zombie(watcher),
                10,
                "watcher ends with vLLM",
            )


def _zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rfind(")") + 2 :].split()[0] in ("Z", "X")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Built with the project's own command, as the CPU smoke image does."""
    folder = tmp_path_factory.mktemp("tiny") / "model"
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "tiny-model", str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    return str(folder)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_serve(model: str, folder: Path, **extra: str) -> Served:
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env.update(
        PYTHONPATH=PYTHONPATH,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        SERVE_MODEL=model,
        SERVE_HOST="127.0.0.1",
        SERVE_PORT=str(port),
        SERVE_MAX_MODEL_LEN="512",
        SERVE_ENFORCE_EAGER="true",  # skips the CPU compile warm-up: a quicker start
        SERVE_READY_FILE=str(folder / "ready"),
        SERVE_HEALTH_INTERVAL="0.5",
        **extra,
    )
    log = folder / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "serve"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one group to clean up; the pid stays vLLM's
        )
    return Served(proc, port, folder / "ready", folder / "status.json", log)


def wait_ready(served: Served) -> float:
    def ready() -> bool:
        if served.proc.poll() is not None:
            raise AssertionError(f"serve exited early:\n{served.log_tail()}")
        return served.ready.exists()

    return wait_for(ready, START_TIMEOUT, "readiness file", step=0.5)


@pytest.fixture(scope="module")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(tiny_model, tmp_path_factory.mktemp("shared"))
    try:
        took = wait_ready(served)
        print(f"\nshared server ready after {took:.0f}s")
        yield served
    finally:
        served.stop()


def test_ready_file_and_status(server: Served) -> None:
    fields = read_ready(str(server.ready))
    assert fields is not None and fields["pid"] == str(server.proc.pid)  # exec kept the pid
    status = server.status_json()
    assert status["phase"] == "ready" and status["pid"] == server.proc.pid
    assert status["argv_digest"] == fields["argv_digest"]
    assert status["url"] == f"http://127.0.0.1:{server.port}"
    probe = subprocess.run(
        [sys.executable, "-m", "entrypoint", "probe", "--ready-file", str(server.ready)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        cwd=REPO,
    )
    assert probe.returncode == 0 and probe.stdout.startswith(f"ready: pid {server.proc.pid}")


def test_completion_over_loopback(server: Served, tiny_model: str) -> None:
    body = json.dumps({"model": tiny_model, "prompt": "the quick", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=60) as response:
        answer = json.load(response)
    assert answer["usage"]["completion_tokens"] == 4
    assert isinstance(answer["choices"][0]["text"], str)


def test_sigterm_shuts_down_cleanly(server: Served) -> None:
    """Runs last on the shared server: vLLM gets SIGTERM itself (it is the exec'd pid)."""
    watcher = server.status_json()["watcher_pid"]
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.status_json().get("phase") == "exited", 60, "status exited")
    status = server.status_json()
    assert server.proc.wait(timeout=30) == 0, server.log_tail()
    assert status["exit_code"] == 0
    assert status["reason"] == "vLLM exited with code 0 after it was ready"
    assert not server.ready.exists()
    wait_for(lambda: not session_pids(server.proc.pid), 15, "no vLLM process left")
    wait_for(lambda: _zombie(watcher), 10, "watcher ends with vLLM")


def test_sigkill_withdraws_readiness_within_2s(tiny_model: str, tmp_path: Path) -> None:
    served = start_serve(tiny_model, tmp_path / "killed")
    try:
        wait_ready(served)
        watcher = served.status_json()["watcher_pid"]
        os.kill(served.proc.pid, signal.SIGKILL)
        gone = wait_for(lambda: not served.ready.exists(), 5, "ready file removed")
        print(f"\nready file removed {gone:.2f}s after SIGKILL")
        assert gone <= 2.0
        # Reaped only now, so the watcher could read the code from the zombie.
        wait_for(lambda: served.status_json().get("phase") == "exited", 5, "status exited")
        status = served.status_json()
        assert status["exit_code"] == 137
        assert status["reason"] == "vLLM killed by SIGKILL after it was ready"
        assert served.proc.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: _zombie(watcher), 10, "watcher ends with vLLM")
    finally:
        served.stop()


def test_missing_model_never_ready(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    served = start_serve(missing, tmp_path / "missing")
    try:
        wait_for(
            lambda: _zombie(served.proc.pid),  # not poll(): reaping would hide the code
            START_TIMEOUT,
            "vLLM gives up",
        )
        wait_for(lambda: served.status_json().get("phase") == "exited", 10, "status exited")
        status = served.status_json()
        assert not served.ready.exists() and status["ever_ready"] is False
        assert status["exit_code"] == served.proc.wait(timeout=10) != 0
        assert status["reason"] == (
            f"vLLM exited with code {status['exit_code']} before it became ready "
            f"(model path {missing} does not exist)"
        )
        assert "does not exist" in served.log.read_text()  # the warning serve printed
    finally:
        served.stop()
