"""Start `python -m entrypoint serve` on 127.0.0.1 for a test or a benchmark, and talk to it.

One helper for every real-server test (tiny model, Gemma GGUF) and the GGUF
benchmark: the server runs in its own session so that it and every vLLM child
can be stopped together, its output goes to `serve.log` in the given folder,
and requests bypass any proxy the environment configures.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from entrypoint import metrics

REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
START_TIMEOUT = 420.0  # a cold CPU start of the tiny model on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    check: Callable[[], object], timeout: float, what: str = "condition", step: float = 0.05
) -> float:
    """Seconds until check() is true; AssertionError after timeout."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(step)
    return time.monotonic() - start


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def session_pids(sid: int) -> list[int]:
    """Live processes of a session (vLLM and its engine/worker children)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat_fields(entry)
        if fields and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def gone(pid: int) -> bool:
    """The process has exited (or is a zombie waiting for its parent)."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    folder: Path
    started: float
    ready_after: float = 0.0

    @property
    def ready(self) -> Path:
        return self.folder / "ready"

    @property
    def status(self) -> Path:
        return self.folder / "status.json"

    @property
    def log(self) -> Path:
        return self.folder / "serve.log"

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> float:
        """Seconds from the start until the readiness file appears; fails with the log."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            return self.ready.exists()

        try:
            wait_for(ready, timeout, "readiness file", step=0.5)
        except AssertionError as error:
            if self.proc.poll() is None:
                raise AssertionError(f"{error}\n{self.log_tail()}") from None
            raise
        self.ready_after = time.monotonic() - self.started
        return self.ready_after

    def get(self, path: str, timeout: float = 30) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}"
        with _OPENER.open(url, timeout=timeout) as response:
            return json.load(response)

    def metrics(self, timeout: float = 30) -> dict[str, float]:
        """vLLM's own /metrics, parsed (it can lag behind the engine under load)."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with _OPENER.open(url, timeout=timeout) as response:
            return metrics.parse(response.read().decode())

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with _OPENER.open(request, timeout=timeout) as response:
            return json.load(response)

    def stream(self, body: dict, timeout: float = 300, seen: dict | None = None,
               cancel: threading.Event | None = None) -> dict:
        """One streaming completion: chunks seen, the last finish_reason, whether
        `data: [DONE]` came, and how it ended (None, or the exception's words).
        `seen`, when given, is filled in as chunks arrive (for a watching thread);
        `cancel`, once set, closes the connection, which makes vLLM abort the request."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        seen = {} if seen is None else seen
        seen.update(chunks=0, finish_reason=None, done=False, error=None)
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                for raw in response:
                    if cancel is not None and cancel.is_set():
                        seen["cancelled"] = True
                        break
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        seen["done"] = True
                    elif line.startswith("data: "):
                        choice = json.loads(line[6:])["choices"][0]
                        seen["chunks"] += 1
                        seen["finish_reason"] = choice.get("finish_reason") or seen["finish_reason"]
        except (OSError, ValueError) as exc:
            seen["error"] = f"{type(exc).__name__}: {exc}"
        seen["ended"] = time.monotonic()
        return seen

    def terminate(self, grace: float = 60) -> None:
        """SIGTERM to the server's session, SIGKILL after the grace period."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def greedy(served: Served, prompt_ids: list[int], tokens: int) -> dict:
    """A greedy completion of exactly *tokens* tokens, with their ids."""
    model = served.get("/v1/models")["data"][0]["id"]
    return served.post("/v1/completions", {
        "model": model, "prompt": prompt_ids, "max_tokens": tokens, "min_tokens": tokens,
        "temperature": 0, "return_token_ids": True,
    })


def spec_counters(served: Served) -> dict:
    """vLLM's spec-decode counters from /metrics (the e2e check's reading of them)."""
    from checks.image.check_reference import spec_counters as read

    return read(f"http://127.0.0.1:{served.port}")


def status_shows_acceptance(served: Served, drafts: int, proposed: int, accepted: int) -> str:
    """Wait for the watcher to read these spec-decode counters, then check that
    `status` prints them as acceptance and mean accepted length; returns its text."""
    want = {"drafts": drafts, "draft_tokens": proposed, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / proposed, 4),
            "mean_accepted_length": round(1 + accepted / drafts, 3)}
    wait_for(lambda: status_json(served).get("speculative") == want, 30,
             "the watcher's next /metrics read")
    summary = run_entrypoint("status", "--ready-file", str(served.ready)).stdout
    assert (f"speculative decoding: acceptance {100 * accepted / proposed:.1f} % "
            f"({accepted} of {proposed} draft tokens), mean accepted length "
            f"{1 + accepted / drafts:.2f}") in summary, summary
    return summary


def status_json(served: Served) -> dict:
    """The watcher's status file of `served`, {} while there is none."""
    from entrypoint.statusfile import read_json

    return read_json(str(served.status)) or {}


def engine_core(served: Served) -> int:
    """The one EngineCore process below a server (vLLM titles it VLLM::EngineCore)."""
    from entrypoint.process_tree import descendants

    names = {}
    for pid in descendants(served.proc.pid):
        try:
            names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    cores = [pid for pid, name in names.items() if name.startswith("VLLM::EngineCor")]
    assert len(cores) == 1, names
    return cores[0]


def stop(served: Served) -> None:
    """Leave nothing behind: the whole session, then the watcher (its own session)."""
    watcher = status_json(served).get("watcher_pid")
    for pid in session_pids(served.proc.pid):
        os.kill(pid, signal.SIGKILL)
    if served.proc.poll() is None:
        served.proc.kill()
    served.proc.wait()
    if watcher:
        wait_for(lambda: gone(watcher), 10, "watcher ends with vLLM")


def has_pp_fix() -> bool:
    """Whether the installed vLLM carries patch 0011 (the CPU PP receive buffer)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm.v1.worker.cpu_model_runner")
    source = Path(spec.origin).read_text() if spec and spec.origin else ""
    return "Pipeline stages after the first receive activations" in source


def node_settings(
    model: str, rank: int, ports: tuple[int, int], cpu: int, split: str
) -> dict[str, str]:
    """One of two nodes on this host: `split` is the SERVE_* size set to 2 across them
    (SERVE_TENSOR_PARALLEL_SIZE or SERVE_PIPELINE_PARALLEL_SIZE); ports = (store, heartbeat)."""
    store_port, heartbeat_port = ports
    return {
        "SERVE_HEARTBEAT_PORT": str(heartbeat_port),
        "SERVE_MODEL": model,
        "SERVE_NNODES": "2",
        "SERVE_NODE_RANK": str(rank),
        "SERVE_MASTER_ADDR": "127.0.0.1",
        "SERVE_MASTER_PORT": str(store_port),
        split: "2",
        "SERVE_LEADER_TIMEOUT": str(int(START_TIMEOUT)),
        # One host plays two nodes: each binds its rank to its own core (both would
        # take core 0 and run ~10x slower), and vLLM's message queues use loopback.
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "VLLM_HOST_IP": "127.0.0.1",
    }


def start_serve(folder: Path, **settings: str) -> Served:
    """`serve` with SERVE_* settings on top of a small-CPU default; returns at once.

    Defaults: loopback on a free port, readiness file in folder, 512-token
    context, eager mode (no CPU compile warm-up), 1 GiB KV cache, offline hub.
    The runner's own SERVE_* variables never leak in.
    """
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env.update(
        PYTHONPATH=PYTHONPATH,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        SERVE_HOST="127.0.0.1",
        SERVE_PORT=str(port),
        SERVE_MAX_MODEL_LEN="512",
        SERVE_ENFORCE_EAGER="true",
        SERVE_READY_FILE=str(folder / "ready"),
        SERVE_HEALTH_INTERVAL="0.5",
    )
    env.update(settings)
    started = time.monotonic()
    with (folder / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "serve"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one group to stop; the pid stays vLLM's (exec)
        )
    return Served(proc, port, folder, started)


def start_wait(served: Served, timeout: float) -> subprocess.Popen[str]:
    """`wait --timeout` on *served*'s readiness file, as a user would run it; returns at once."""
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "wait", "--ready-file", str(served.ready),
         "--timeout", str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH}, cwd=REPO,
    )


def run_entrypoint(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m entrypoint ARGS` from the repository, output captured."""
    return run_module("entrypoint", *args, timeout=timeout)


def run_module(
    module: str, *args: str, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` from the repository (e.g. fixtures.tiny_model), output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        cwd=REPO,
        check=False,
        timeout=timeout,
    )


def start_gemma(dtype: str) -> tuple[Served, Path]:
    """`serve` Gemma 3 270M Q4_K_M on 127.0.0.1 in its own session; returns at once."""
    from entrypoint.gguf_config import extract
    from fixtures.gguf_models import gemma_gguf

    model = gemma_gguf()
    extract(model)  # the entrypoint's config cache, warm: extraction stays out of the timing
    served = start_serve(
        Path(tempfile.mkdtemp(prefix="gguf-cpu-")),
        SERVE_MODEL=str(model),  # serve finds config + tokenizer in the cache warmed above
        SERVE_QUANTIZATION="gguf",
        SERVE_DTYPE=dtype,
    )
    return served, model
