"""The watcher's side of vLLM's log capture (entrypoint/start/vllm_logging.py writes it).

Reads the capture file's new JSON lines each round, keeps the last lines as text,
turns vLLM's own milestone messages into start-up steps, and finds the exception
that ended a failed start. Stdlib-only, like the watcher.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from entrypoint.watch.steps import API_SERVER, COMPILING, KV_CACHE, LOADED, LOADING, STARTING_ENGINE

TAIL_LINES = 30


def _gib_seconds(m: re.Match[str]) -> str:
    return f"{float(m[1]):.2f} GiB in {float(m[2]):.1f} s"


def _gguf_loaded(m: re.Match[str]) -> str:
    gib, rate = float(m[3]), float(m[4])
    seconds = f" in {gib / rate:.1f} s" if rate > 0 else ""
    return f"{m[2]}{seconds} at {m[4]} GiB/s (rank {m[1]})"


# (pattern, step or None to keep the step, detail). vLLM 0.32.0's messages:
# gpu_model_runner/cpu_model_runner ("Starting to load model", the V1 runner),
# gpu/model_runner ("Loading model from scratch", the V2 runner), default_loader
# ("Loading weights took"), gpu_model_runner ("Model loading took", "Graph capturing
# finished"), compilation/backends.py and monitor.py, gpu_worker ("Available KV cache
# memory"), kv_cache_utils ("KV cache size"), engine/core.py ("init engine"),
# entrypoints/launchers ("Starting vLLM server on").
MILESTONES: list[tuple[re.Pattern[str], str | None, Callable[[re.Match[str]], str] | None]] = [
    (re.compile(r"Initializing a V1 LLM engine \(v([^)]*)\)"), STARTING_ENGINE,
     lambda m: f"vLLM {m[1]}"),
    (re.compile(r"Starting to load model"), LOADING, None),
    (re.compile(r"Loading model from scratch"), LOADING, None),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), LOADED,
     lambda m: f"in {float(m[1]):.1f} s"),
    (re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds"), LOADED,
     _gib_seconds),
    # The patched GGUF plugin's last progress line of a rank (gguf_tensors.py); vLLM's
    # own "Loading weights took" does not come on the GGUF path.
    (re.compile(r"GGUF weights rank (\d+): (([\d.]+) GiB) of \2 \(100%\), ([\d.]+) GiB/s, done"),
     LOADED, _gguf_loaded),
    (re.compile(r"GGUF weights rank (\d+): (\S+ GiB of \S+ GiB \(\d+%\)|loading .*)"),
     LOADING, lambda m: f"rank {m[1]}: {m[2]}"),
    (re.compile(r"Dynamo bytecode transform time|Compiling a graph for compile range"),
     COMPILING, None),
    (re.compile(r"torch\.compile took ([\d.]+) s in total"), None,
     lambda m: f"torch.compile took {float(m[1]):.1f} s"),
    (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), KV_CACHE,
     lambda m: f"{float(m[1]):.2f} GiB"),
    (re.compile(r"KV cache size: ([\d,]+) tokens"), KV_CACHE, lambda m: f"{m[1]} tokens"),
    (re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB"), None,
     lambda m: f"captured in {m[1]} s, {float(m[2]):.2f} GiB"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
     API_SERVER, lambda m: f"engine ready in {float(m[1]):.1f} s"),
    (re.compile(r"Starting vLLM server on (\S+)"), API_SERVER, lambda m: f"listening on {m[1]}"),
]


# Which model runner loads the model: the V2 runner's worker says so (gpu_worker,
# cpu_worker: "Using V2 Model Runner") and the V1 runners start loading with their
# own message. GPU users of a DFlash drafter with sliding-window layers must be on V2.
RUNNERS = [(re.compile(r"Using V2 Model Runner|Loading model from scratch"), "V2"),
           (re.compile(r"Starting to load model"), "V1")]


def model_runner(message: str) -> str | None:
    """"V1" or "V2" for the message that tells which model runner runs, else None."""
    for pattern, runner in RUNNERS:
        if pattern.search(message):
            return runner
    return None


# The engine's "KV cache size" line comes once, after every rank's "Available KV cache
# memory": what follows it is warm-up (compiling, CUDA graph capture).
WARM_UP_FOLLOWS = re.compile(r"KV cache size: ")


def milestone(message: str) -> tuple[str | None, str | None] | None:
    """(step or None, detail or None) for one of vLLM's milestone messages, else None."""
    for pattern, step, detail in MILESTONES:
        match = pattern.search(message)
        if match:
            return step, (detail(match) if detail else None)
    return None


def record_lines(record: dict[str, Any]) -> list[str]:
    """A record as the lines a person would read in the log."""
    when = time.strftime("%H:%M:%S", time.localtime(float(record.get("t") or 0)))
    head = f"{when} {record.get('level', '?')} ({record.get('proc')} pid={record.get('pid')})"
    lines = [f"{head} {line}" for line in str(record.get("msg", "")).splitlines() or [""]]
    exc = record.get("exc")
    if exc:
        lines.extend(str(exc).splitlines())
    return lines


def root_exception(exc_text: str) -> str | None:
    """`Type: message` of the innermost exception of a formatted traceback.

    Python prints a chain cause-first, so the first traceback block's last line is
    the root cause (vLLM wraps it in "Engine core initialization failed" and similar)."""
    first = re.split(r"\n\n(?:The above exception|During handling of the above)", exc_text)[0]
    lines = [line for line in first.splitlines() if line.strip()]
    return lines[-1].strip() if lines else None


class LogTail:
    """Follows the capture file from one start: new records, the last lines, the errors."""

    def __init__(self, path: str, keep: int = TAIL_LINES) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.lines: deque[str] = deque(maxlen=keep)
        self.exceptions: list[str] = []  # root causes, oldest first, no repeats
        self.last_error: str | None = None  # the newest ERROR/CRITICAL message

    def read(self) -> list[dict[str, Any]]:
        """Records appended since the last call (all of them after a truncation)."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # a writer truncated it: start over
                    self.offset, self.partial = 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        records = []
        for raw in complete:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
                self._note(record)
        return records

    def _note(self, record: dict[str, Any]) -> None:
        self.lines.extend(record_lines(record))
        if record.get("level") not in ("ERROR", "CRITICAL"):
            return
        exc = record.get("exc")
        cause = root_exception(str(exc)) if exc else None
        if cause and cause not in self.exceptions:
            self.exceptions.append(cause)
        self.last_error = cause or str(record.get("msg", "")).strip() or self.last_error

    @property
    def error(self) -> str | None:
        """The line that best says why vLLM failed: the first root cause logged, else the
        newest error message."""
        return self.exceptions[0] if self.exceptions else self.last_error
