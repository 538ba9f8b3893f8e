"""vLLM's log capture: the milestones against vLLM's own messages, the watcher's tail,
steps and root cause, and the logging config run by a real vLLM logger in a child."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.start import vllm_logging
from entrypoint.watch import log_capture, steps
from entrypoint.watch.log_capture import LogTail, milestone, root_exception
from entrypoint.watch.watcher import Tracker, WatchConfig
from fixtures.serving import PYTHONPATH, REPO

# One sample message per milestone, made from the format string in vLLM 0.32.0's own
# source (file, the literal's start, its arguments): a reworded vLLM fails here.
VLLM_MESSAGES = [
    ("v1/engine/core.py", "Initializing a V1 LLM engine (v%s)", ("0.32.0",),
     steps.STARTING_ENGINE, "vLLM 0.32.0"),
    ("v1/worker/gpu_model_runner.py", "Starting to load model %s...", ("m",), steps.LOADING, None),
    ("v1/worker/gpu/model_runner.py", "Loading model from scratch...", (), steps.LOADING, None),
    ("model_executor/model_loader/default_loader.py", "Loading weights took %.2f seconds",
     (12.5,), steps.LOADED, "in 12.5 s"),
    ("v1/worker/gpu_model_runner.py", "Model loading took %s GiB memory and %.6f seconds",
     ("47.12", 80.25), steps.LOADED, "47.12 GiB in 80.2 s"),
    ("compilation/backends.py", "%sDynamo bytecode transform time: %.2f s", ("", 3.5),
     steps.COMPILING, None),
    ("compilation/monitor.py", "%storch.compile took %.2f s in total", ("", 41.0), None,
     "torch.compile took 41.0 s"),
    ("v1/worker/gpu_worker.py", "Available KV cache memory: %s GiB", ("21.5",), steps.KV_CACHE,
     "21.50 GiB"),
    ("v1/core/kv_cache_utils.py", "%s KV cache size: %s tokens, ", ("GPU", "1,234,560"),
     steps.KV_CACHE, "1,234,560 tokens"),
    ("v1/worker/gpu_model_runner.py", "Graph capturing finished in %.0f secs, took %.2f GiB",
     (208.0, 1.5), None, "captured in 208 s, 1.50 GiB"),
    ("v1/engine/core.py", "init engine (profile, create kv cache, warmup model) took %.2f s",
     (250.0,), steps.API_SERVER, "engine ready in 250.0 s"),
    ("entrypoints/launchers/api_server/entry.py", "Starting vLLM server on %s",
     ("http://0.0.0.0:8000",), steps.API_SERVER, "listening on http://0.0.0.0:8000"),
]


def vllm_source(relative: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "the CPU tier's vLLM is not installed"
    return (Path(spec.origin).parent / relative).read_text()


@pytest.mark.parametrize(("path", "fmt", "args", "step", "detail"), VLLM_MESSAGES)
def test_milestones_match_vllm_messages(
    path: str, fmt: str, args: tuple, step: str | None, detail: str | None
) -> None:
    source = vllm_source(path)
    # The literal may be split over adjacent string literals; its first 30 characters
    # stand on one line.
    assert fmt[:30] in source, f"vLLM's {path} no longer says {fmt[:30]!r}"
    assert milestone(fmt % args) == (step, detail)


# The messages that say which model runner runs (vLLM 0.32.0's source, as above).
RUNNER_MESSAGES = [
    ("v1/worker/gpu_worker.py", "Using V2 Model Runner", "V2"),
    ("v1/worker/cpu_worker.py", "Using V2 Model Runner", "V2"),
    ("v1/worker/gpu/model_runner.py", "Loading model from scratch...", "V2"),
    ("v1/worker/gpu_model_runner.py", "Starting to load model %s...", "V1"),
    ("v1/worker/cpu_model_runner.py", "Starting to load model %s...", "V1"),
]


@pytest.mark.parametrize(("path", "message", "runner"), RUNNER_MESSAGES)
def test_model_runner_from_vllm_messages(path: str, message: str, runner: str) -> None:
    assert message[:25] in vllm_source(path), f"vLLM's {path} no longer says {message!r}"
    assert log_capture.model_runner(message.replace("%s", "/models/x")) == runner
    assert log_capture.model_runner("Resolved architecture: Qwen3ForCausalLM") is None


def test_other_messages_are_no_milestones() -> None:
    assert milestone("Resolved architecture: Qwen3ForCausalLM") is None
    assert milestone("") is None


def test_root_exception_is_the_innermost_of_a_chain() -> None:
    text = (
        "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
        "AssertionError: num_heads (3) is not divisible by num_kv_heads (2)\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  File \"b.py\", line 2, in g\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_exception(text) == (
        "AssertionError: num_heads (3) is not divisible by num_kv_heads (2)"
    )


def write_records(path: Path, *records: dict) -> None:
    with path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def record(msg: str, level: str = "INFO", exc: str | None = None, t: float = 1000.0) -> dict:
    return {"t": t, "level": level, "proc": "EngineCore", "pid": 7, "msg": msg, "exc": exc}


def test_tail_reads_whole_lines_and_survives_truncation(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    tail = LogTail(str(path), keep=3)
    assert tail.read() == []  # no file yet
    write_records(path, record("one"), record("two"))
    with path.open("a") as handle:
        handle.write('{"t": 1, "msg": "half')  # a writer mid-line
    assert [r["msg"] for r in tail.read()] == ["one", "two"]
    with path.open("a") as handle:
        handle.write(' written", "level": "INFO"}\n')
    assert [r["msg"] for r in tail.read()] == ["half written"]
    path.write_text("")  # a writer truncated it past its bound
    write_records(path, record("after"), record("x", "ERROR", "Traceback\nValueError: bad"))
    assert [r["msg"] for r in tail.read()] == ["after", "x"]
    assert len(tail.lines) == 3 and tail.lines[-1] == "ValueError: bad"
    assert tail.error == "ValueError: bad"


def test_the_first_root_cause_wins_and_plain_errors_count(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    tail = LogTail(str(path))
    write_records(path, record("WorkerProc failed to start.", "ERROR",
                               "Traceback\nValueError: Available memory on node 0 is low"))
    write_records(path, record("EngineCore failed to start.", "ERROR",
                               "Traceback\nException: WorkerProc initialization failed"))
    tail.read()
    assert tail.error == "ValueError: Available memory on node 0 is low"
    assert tail.exceptions[1] == "Exception: WorkerProc initialization failed"
    other = LogTail(str(tmp_path / "other.jsonl"))
    write_records(tmp_path / "other.jsonl", record("CUDA out of memory", "ERROR"))
    other.read()
    assert other.error == "CUDA out of memory"


def tracker_with_log(tmp_path: Path, cuda_graphs: bool) -> tuple[Tracker, Path]:
    log = tmp_path / "status.json.log.jsonl"
    config = WatchConfig(
        pid=os.getpid(), base_url="http://127.0.0.1:1", ready_file=str(tmp_path / "ready"),
        status_file=str(tmp_path / "status.json"), argv_digest="sha256:abc",
        steps=[{"step": steps.VALIDATING, "at": 990.0, "detail": None},
               {"step": steps.PREFLIGHT, "at": 995.0, "detail": None}],
        log_file=str(log), cuda_graphs=cuda_graphs,
        history_file=str(tmp_path / "startup-history.json"),
    )
    return Tracker(WatchConfig.from_json(config.to_json()), clock=lambda: 1000.0), log


def test_a_gpu_start_goes_through_every_step_in_order(tmp_path: Path) -> None:
    tracker, log = tracker_with_log(tmp_path, cuda_graphs=True)
    write_records(log, *(record(fmt % args, t=1001.0 + i)
                         for i, (_, fmt, args, _, _) in enumerate(VLLM_MESSAGES)))
    tracker.read_log()
    tracker.record(None)  # health answers: serving
    names = [s["step"] for s in tracker.status()["steps"]]
    assert names == [steps.VALIDATING, steps.PREFLIGHT, steps.STARTING_VLLM,
                     steps.STARTING_ENGINE, steps.LOADING, steps.LOADED, steps.COMPILING,
                     steps.KV_CACHE, steps.CAPTURING, steps.API_SERVER, steps.SERVING]
    by_name = {s["step"]: s for s in tracker.status()["steps"]}
    assert by_name[steps.LOADED]["detail"] == "47.12 GiB in 80.2 s"  # the later detail
    assert by_name[steps.KV_CACHE]["detail"] == "1,234,560 tokens"
    assert by_name[steps.CAPTURING]["detail"] == "captured in 208 s, 1.50 GiB"
    assert by_name[steps.VALIDATING]["seconds"] == 5.0
    history = json.loads((tmp_path / "startup-history.json").read_text())
    assert [s["step"] for s in history["steps"]] == names
    assert history["total_s"] == 10.0  # validating at 990, ready at 1000


@pytest.mark.parametrize("runner", ["V1", "V2"])
def test_status_names_the_model_runner(tmp_path: Path, runner: str) -> None:
    from entrypoint.watch.status_summary import summarize

    tracker, log = tracker_with_log(tmp_path, cuda_graphs=True)
    assert "model_runner" not in tracker.status()
    lines = {"V1": ["Starting to load model /models/x..."],
             "V2": ["Using V2 Model Runner", "Loading model from scratch..."]}[runner]
    write_records(log, *(record(m) for m in lines), record("Starting to load model y..."))
    tracker.read_log()
    assert tracker.status()["model_runner"] == runner  # the first that says, kept
    assert f"  model runner: {runner}" in summarize(tracker.status(), 1000.0).splitlines()


def test_cpu_and_eager_starts_warm_up_instead_of_capturing(tmp_path: Path) -> None:
    tracker, log = tracker_with_log(tmp_path, cuda_graphs=False)
    write_records(log, record("CPU KV cache size: 1,048,576 tokens, Maximum concurrency"))
    tracker.read_log()
    assert [s["step"] for s in tracker.status()["steps"]][-2:] == [
        steps.KV_CACHE, steps.WARMING_UP]


def test_exit_names_vllms_exception_and_keeps_the_last_lines(tmp_path: Path) -> None:
    tracker, log = tracker_with_log(tmp_path, cuda_graphs=False)
    write_records(log, *(record(f"line {i}") for i in range(40)))
    write_records(log, record("uncaught exception", "CRITICAL",
                              "Traceback (most recent call last):\n  File \"x\"\n"
                              "OSError: [Errno 2] No such file: '/models/x.gguf'"))
    tracker.exited(256)  # exit code 1
    status = json.loads(Path(tracker.config.status_file).read_text())
    assert status["phase"] == "exited" and status["exit_code"] == 1
    assert status["reason"] == ("vLLM exited with code 1 before it became ready: "
                                "OSError: [Errno 2] No such file: '/models/x.gguf'")
    assert len(status["log_tail"]) == log_capture.TAIL_LINES
    assert status["log_tail"][-1] == "OSError: [Errno 2] No such file: '/models/x.gguf'"


def test_clean_exit_keeps_a_shutdown_error_out_of_the_reason(tmp_path: Path) -> None:
    """vLLM can log EngineDeadError while it shuts down on SIGTERM and still exit 0."""
    tracker, log = tracker_with_log(tmp_path, cuda_graphs=False)
    tracker.record(None)
    write_records(log, record("AsyncLLM output_handler failed.", "ERROR",
                              "Traceback (most recent call last):\n  File \"x\"\n"
                              "vllm.v1.engine.exceptions.EngineDeadError: EngineCore died"))
    tracker.exited(0)
    status = json.loads(Path(tracker.config.status_file).read_text())
    assert status["exit_code"] == 0
    assert status["reason"] == "vLLM exited with code 0 after it was ready"
    assert "EngineDeadError" in status["error"]


def test_without_capture_the_status_says_so(tmp_path: Path) -> None:
    config = WatchConfig(pid=os.getpid(), base_url="http://127.0.0.1:1",
                         ready_file=str(tmp_path / "ready"),
                         status_file=str(tmp_path / "status.json"), argv_digest="sha256:abc",
                         log_capture_off="SERVE_LOG_CAPTURE=false")
    tracker = Tracker(config)
    tracker.exited(256)
    status = json.loads(Path(config.status_file).read_text())
    assert status["reason"] == "vLLM exited with code 1 before it became ready"
    assert status["log_capture"] == "off: SERVE_LOG_CAPTURE=false"
    assert "log_tail" not in status and "error" not in status


CHILD = r"""
import sys
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging, current_formatter_type, init_logger
configure_logging(LoggingConfig())
configure_logging(LoggingConfig(log_level="INFO"))  # vLLM configures more than once
log = init_logger("vllm.child")
print("formatter:", current_formatter_type(log), flush=True)
log.info("Starting to load model %s...", "tiny")
log.debug("not shown at INFO")
try:
    {}["missing"]
except KeyError:
    log.exception("EngineCore failed to start.")
sys.stdout.flush()
raise RuntimeError("Engine core initialization failed. See root cause above.")
"""


@pytest.mark.process
def test_real_vllm_logger_prints_the_same_and_captures(tmp_path: Path) -> None:
    """vLLM's logger in a child, configured as vLLM does, with and without the capture
    config: stdout is the same apart from times and pids, the banner check still sees
    vLLM's handler, and the file holds every record and the uncaught exception."""
    capture = tmp_path / "log.jsonl"
    config = tmp_path / "logging.json"
    config.write_text(json.dumps(vllm_logging.logging_config(str(capture), "INFO")))

    def run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
        env.update(PYTHONPATH=PYTHONPATH, **extra)
        return subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=False)

    plain, captured = run({}), run({"VLLM_LOGGING_CONFIG_PATH": str(config)})

    def normal(text: str) -> str:
        text = re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", "TIME", text)
        return re.sub(r"pid=\d+", "pid=N", text)

    assert plain.returncode == captured.returncode == 1
    assert "formatter: newline" in plain.stdout
    assert normal(captured.stdout) == normal(plain.stdout)
    assert "RuntimeError: Engine core initialization failed" in captured.stderr
    records = [json.loads(line) for line in capture.read_text().splitlines()]
    assert [(r["level"], r["msg"]) for r in records] == [
        ("INFO", "Starting to load model tiny..."),
        ("ERROR", "EngineCore failed to start."),
        ("CRITICAL", "uncaught exception"),
    ]
    assert records[1]["exc"].endswith("KeyError: 'missing'")
    tail = LogTail(str(capture))
    tail.read()
    assert tail.error == "KeyError: 'missing'"
    assert tail.exceptions[-1].startswith("RuntimeError: Engine core initialization failed")


def test_capture_file_stays_bounded(tmp_path: Path) -> None:
    import logging

    path = tmp_path / "log.jsonl"
    with open(os.devnull, "w") as sink:
        handler = vllm_logging.CapturingStreamHandler(sink, str(path), 2000)
        for i in range(200):
            handler.emit(logging.LogRecord("vllm", logging.INFO, "", 0, f"message {i:04d}",
                                           None, None))
    assert path.stat().st_size <= 2000 + 200
    assert path.read_text().splitlines()[-1].endswith('"msg": "message 0199", "exc": null}')
