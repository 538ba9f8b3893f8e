"""Shared fixtures. Unit tests get exec and process starts replaced by tripwires."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.start import vllm_in_process
from fixtures.serving import free_port, run_module
from tests.entrypoint.recording import Recorder

# Markers of tests that are allowed to start real processes.
PROCESS_MARKERS = ("vllm_server", "process")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need the installed vLLM (its parser or a server) get the `vllm` marker."""
    for item in items:
        uses_parser = "vllm_table" in getattr(item, "fixturenames", ())
        if uses_parser or item.get_closest_marker("vllm_server"):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(autouse=True)
def clean_serve_env(monkeypatch: pytest.MonkeyPatch, restored_environ: None) -> None:
    """The runner's own SERVE_*/VLLM_API_KEY must not leak into a test, and what a test's
    in-process `serve` exports for vLLM (VLLM_LOGGING_CONFIG_PATH, the load progress
    folder) must not leak into later tests' real servers (restored_environ)."""
    for name in list(os.environ):
        if name.startswith("SERVE_") or name == "VLLM_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def no_exec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests must never exec or spawn: make any attempt fail loudly."""
    if any(request.node.get_closest_marker(m) for m in PROCESS_MARKERS):
        return

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a unit test tried to start a process: {args!r}")

    monkeypatch.setattr(os, "execvp", tripwire)
    monkeypatch.setattr(os, "execv", tripwire)
    monkeypatch.setattr(vllm_in_process, "run_module", tripwire)
    monkeypatch.setattr(subprocess, "Popen", tripwire)


@pytest.fixture(scope="session")
def vllm_table():  # type: ignore[no-untyped-def]
    """vLLM's real option table (importing vLLM takes seconds, so once per session)."""
    from entrypoint.argv.vllm_options import OptionTable, vllm_parser

    return OptionTable.of(vllm_parser())


@pytest.fixture
def free_tcp_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (as far as we can tell)."""
    return free_port()


@pytest.fixture
def base_env(tmp_path: Path, free_tcp_port: int) -> dict[str, str]:
    """A minimal valid serve environment on a free loopback port (render/serve tests)."""
    return {
        "SERVE_MODEL": "org/model",
        "SERVE_HOST": "127.0.0.1",
        "SERVE_PORT": str(free_tcp_port),
        "SERVE_READY_FILE": str(tmp_path / "run" / "ready"),
    }


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """exec and the watcher's Popen, recorded instead of started."""
    import entrypoint.start.serve as serve_module

    rec = Recorder()
    monkeypatch.setattr(os, "execvp", rec.execvp)
    monkeypatch.setattr(vllm_in_process, "run_module", rec.run_module)
    monkeypatch.setattr(serve_module.subprocess, "Popen", rec.popen)
    return rec


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Qwen3, built with the project's own command as the CPU smoke image does."""
    folder = tmp_path_factory.mktemp("tiny") / "model"
    result = run_module("fixtures.tiny_model", str(folder), timeout=300)
    assert result.returncode == 0, result.stderr
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    return str(folder)
