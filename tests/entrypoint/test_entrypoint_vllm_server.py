"""`serve` against a real vLLM on CPU, with the tiny model built by `fixtures.tiny_model`.

Four vLLM starts in all: one shared server (ready file, steps, status, completion,
probe, then a clean SIGTERM), one that is killed with SIGKILL, one whose model does
not exist and one whose config vLLM cannot build.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.watch import steps
from entrypoint.watch.statusfile import read_ready
from fixtures.serving import (
    START_TIMEOUT,
    Served,
    gone,
    run_entrypoint,
    session_pids,
    start_serve,
    start_wait,
    status_json,
    stop,
    wait_for,
)

pytestmark = pytest.mark.vllm_server


@pytest.fixture(scope="module")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(tmp_path_factory.mktemp("shared"), SERVE_MODEL=tiny_model)
    waiting = start_wait(served, START_TIMEOUT)
    try:
        took = served.wait_ready(START_TIMEOUT)
        print(f"\nshared server ready after {took:.0f}s")
        out, _ = waiting.communicate(timeout=10)
        served.wait_output = (waiting.returncode, out)  # type: ignore[attr-defined]
        yield served
    finally:
        waiting.kill()
        stop(served)


def test_ready_file_and_status(server: Served) -> None:
    fields = read_ready(str(server.ready))
    assert fields is not None and fields["pid"] == str(server.proc.pid)  # exec kept the pid
    status = status_json(server)
    assert status["phase"] == "ready" and status["pid"] == server.proc.pid
    assert status["argv_digest"] == fields["argv_digest"]
    assert status["url"] == f"http://127.0.0.1:{server.port}"
    probe = run_entrypoint("probe", "--ready-file", str(server.ready))
    assert probe.returncode == 0 and probe.stdout.startswith(f"ready: pid {server.proc.pid}")


def test_wait_printed_the_phases_and_returned_0_at_ready(server: Served) -> None:
    code, out = server.wait_output  # type: ignore[attr-defined]
    lines = out.splitlines()
    print("\n" + out)
    assert code == 0, out
    assert lines[-1].startswith("ready after ") and f"pid {server.proc.pid}" in lines[-1]
    assert any("starting" in line or "validating" in line or "status file" in line
               for line in lines[:-1]), out


def test_steps_in_order_with_vllms_details(server: Served) -> None:
    """The status names each step of the start, from serve's checks and vLLM's log."""
    status = status_json(server)
    names = [s["step"] for s in status["steps"]]
    print("\n" + "\n".join(f"{s['step']:22} {s['seconds']:7.2f} s  {s['detail'] or ''}"
                            for s in status["steps"]))
    assert names == [steps.VALIDATING, steps.IMPORTING_VLLM, steps.PREFLIGHT, steps.STARTING_VLLM,
                     steps.STARTING_ENGINE, steps.LOADING, steps.LOADED, steps.KV_CACHE,
                     steps.WARMING_UP, steps.API_SERVER, steps.SERVING]
    at = [s["at"] for s in status["steps"]]
    assert at == sorted(at)
    details = {s["step"]: s["detail"] or "" for s in status["steps"]}
    assert details[steps.STARTING_ENGINE] == "vLLM 0.32.0"
    assert details[steps.KV_CACHE].endswith(" tokens")
    assert details[steps.API_SERVER] == f"listening on http://127.0.0.1:{server.port}"
    assert status["error"] is None and "log_tail" not in status  # healthy: no tail
    # The history the next start's ETA comes from: the same steps, up to readiness.
    history = json.loads((server.folder / "startup-history.json").read_text())
    assert [s["step"] for s in history["steps"]] == names
    assert history["argv_digest"] == status["argv_digest"]
    assert 0 < history["total_s"] <= START_TIMEOUT
    # wait printed a line per step it saw (in order; a step shorter than its 0.5 s poll
    # may pass unseen), and the step's details.
    _, out = server.wait_output  # type: ignore[attr-defined]
    printed = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[")]
    seen = [name for line in printed for name in names if line.startswith(f"starting: {name}")]
    assert seen == sorted(seen, key=names.index), out  # a step's detail may add a line
    assert {steps.STARTING_VLLM, steps.API_SERVER} <= set(seen), out
    assert f"starting: {steps.STARTING_ENGINE} (vLLM 0.32.0)" in printed, out


def test_status_summary_and_json(server: Served) -> None:
    summary = run_entrypoint("status", "--ready-file", str(server.ready))
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0] == "ready: serving" or lines[0].startswith("ready: serving, "), lines
    assert f"vLLM pid {server.proc.pid} at http://127.0.0.1:{server.port}" in lines[1]
    assert any(line.startswith("  steps: validating ") for line in lines), lines
    as_json = run_entrypoint("status", "--json", "--ready-file", str(server.ready))
    assert json.loads(as_json.stdout)["phase"] == "ready"


def test_completion_over_loopback(server: Served, tiny_model: str) -> None:
    body = {"model": tiny_model, "prompt": "the quick", "max_tokens": 4}
    answer = server.post("/v1/completions", body, timeout=60)
    assert answer["usage"]["completion_tokens"] == 4
    assert isinstance(answer["choices"][0]["text"], str)


def test_sigterm_shuts_down_cleanly(server: Served) -> None:
    """Runs last on the shared server: vLLM gets SIGTERM itself (it is the exec'd pid)."""
    watcher = status_json(server)["watcher_pid"]
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: status_json(server).get("phase") == "exited", 60, "status exited")
    status = status_json(server)
    assert server.proc.wait(timeout=30) == 0, server.log_tail()
    assert status["exit_code"] == 0
    assert status["reason"] == "vLLM exited with code 0 after it was ready"
    assert not server.ready.exists()
    wait_for(lambda: not session_pids(server.proc.pid), 15, "no vLLM process left")
    wait_for(lambda: gone(watcher), 10, "watcher ends with vLLM")


def test_sigkill_withdraws_readiness_within_2s(tiny_model: str, tmp_path: Path) -> None:
    served = start_serve(tmp_path / "killed", SERVE_MODEL=tiny_model)
    try:
        served.wait_ready(START_TIMEOUT)
        watcher = status_json(served)["watcher_pid"]
        os.kill(served.proc.pid, signal.SIGKILL)
        took = wait_for(lambda: not served.ready.exists(), 5, "ready file removed")
        print(f"\nready file removed {took:.2f}s after SIGKILL")
        assert took <= 2.0
        # Reaped only now, so the watcher could read the code from the zombie.
        wait_for(lambda: status_json(served).get("phase") == "exited", 5, "status exited")
        status = status_json(served)
        assert status["exit_code"] == 137
        assert status["reason"] == "vLLM killed by SIGKILL after it was ready"
        assert served.proc.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: gone(watcher), 10, "watcher ends with vLLM")
    finally:
        stop(served)


def test_missing_model_never_ready(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    served = start_serve(tmp_path / "missing", SERVE_MODEL=missing)
    waiting = start_wait(served, START_TIMEOUT)
    try:
        wait_for(
            lambda: gone(served.proc.pid),  # not poll(): reaping would hide the code
            START_TIMEOUT,
            "vLLM gives up",
        )
        exited = time.monotonic()
        out, _ = waiting.communicate(timeout=30)
        after = time.monotonic() - exited
        print(f"\n{out}wait ended {after:.1f} s after vLLM")
        assert waiting.returncode == 1 and after < 2.0, out
        assert "not ready: vLLM exited with code" in out and "does not exist" in out
        assert status_json(served)["error"] is not None  # vLLM's own words, from its log
        wait_for(lambda: status_json(served).get("phase") == "exited", 10, "status exited")
        status = status_json(served)
        assert not served.ready.exists() and status["ever_ready"] is False
        assert status["exit_code"] == served.proc.wait(timeout=10) != 0
        assert status["reason"] == (
            f"vLLM exited with code {status['exit_code']} before it became ready: "
            f"{status['error']} (model path {missing} does not exist)"
        )
        assert "does not exist" in served.log.read_text()  # the warning serve printed
    finally:
        waiting.kill()
        stop(served)


def test_broken_config_wait_prints_vllms_exception(
    server: Served, tiny_model: str, tmp_path: Path
) -> None:
    """A model vLLM cannot build: wait ends within 2 s of vLLM with vLLM's root cause
    (raised in a worker process, logged there), and the status keeps vLLM's last lines.
    Its status folder holds the shared server's startup history, as a volume would
    after a good start: wait gives that start's time as the ETA meanwhile."""
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_attention_heads"] = config["num_key_value_heads"] + 1  # not a multiple
    (broken / "config.json").write_text(json.dumps(config))
    (tmp_path / "broken").mkdir()
    shutil.copy(server.folder / "startup-history.json", tmp_path / "broken")
    last = json.loads((server.folder / "startup-history.json").read_text())["total_s"]
    served = start_serve(tmp_path / "broken", SERVE_MODEL=str(broken))
    waiting = start_wait(served, START_TIMEOUT)
    try:
        wait_for(lambda: gone(served.proc.pid), START_TIMEOUT, "vLLM gives up")
        exited = time.monotonic()
        out, _ = waiting.communicate(timeout=30)
        after = time.monotonic() - exited
        print(f"\n{out}wait ended {after:.1f} s after vLLM")
        cause = (f"AssertionError: num_heads ({config['num_attention_heads']}) is not "
                 f"divisible by num_kv_heads ({config['num_key_value_heads']})")
        assert waiting.returncode == 1 and after < 2.0, out
        took = f"{last / 60:.1f} min" if last >= 90 else f"{last:.0f} s"
        assert f"(the last start took {took}, with another configuration)" in out, out
        assert out.splitlines()[-1].startswith("not ready: vLLM exited with code 1 before it "
                                              f"became ready: {cause}"), out
        wait_for(lambda: status_json(served).get("phase") == "exited", 10, "status exited")
        status = status_json(served)
        assert status["error"] == cause
        assert len(status["log_tail"]) == 30
        assert status["log_tail"][-1].startswith("RuntimeError: Engine core initialization")
        summary = run_entrypoint("status", "--ready-file", str(served.ready)).stdout
        assert f"vLLM's error: {cause}" in summary and "vLLM's last 30 log lines:" in summary
    finally:
        waiting.kill()
        stop(served)
