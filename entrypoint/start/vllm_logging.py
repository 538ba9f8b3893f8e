"""vLLM's own logging config, plus one handler that copies every record to a capture file.

`serve` writes `logging_config()` to a JSON file and points VLLM_LOGGING_CONFIG_PATH
at it, so every vLLM process (API server, engine core, workers) configures itself
from it. Why this way and not a pipe on stdout/stderr: vLLM keeps its pid, its
stdout/stderr and its signals exactly as without us; nothing sits between vLLM and
the container log that could block or die.

- handler `vllm` is vLLM's default handler, built from vLLM's own definitions, so
  what vLLM prints does not change;
- it also appends each record as one JSON line to the capture file, which the
  watcher reads (entrypoint/watch/log_capture.py), and records uncaught exceptions
  (sys.excepthook, chained: the traceback still reaches stderr), since vLLM's API
  server dies on those without logging them.

The capture file is bounded: a writer that finds it over `max_bytes` truncates it
first (appends are O_APPEND, so concurrent writers stay line-whole), and the
watcher keeps the lines it needs in memory.

The factories run inside vLLM's processes; this module imports vLLM only there.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

MAX_BYTES = 4 << 20  # a few thousand records: far more than the watcher's 30-line tail


def logging_config(capture_path: str, level: str, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """The dictConfig `serve` hands vLLM: its default setup, the handler also capturing.

    One handler named `vllm`, as in vLLM's default: vLLM looks for exactly that
    (logger.current_formatter_type) before it prints its start-up banner."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {
            "vllm": {
                "()": f"{__name__}.capturing_vllm_handler",
                "log_level": level,
                "path": capture_path,
                "max_bytes": max_bytes,
                "level": level,
            },
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }


class CapturingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """vLLM's stream handler, plus one JSON line per record in the capture file."""

    def __init__(self, stream: Any, path: str, max_bytes: int) -> None:
        super().__init__(stream)
        self.path, self.max_bytes = path, max_bytes

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.capture(record)

    def capture(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps(record_fields(record), ensure_ascii=False) + "\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size > self.max_bytes:
                    os.ftruncate(fd, 0)
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except Exception:  # logging must never take vLLM down
            self.handleError(record)


def capturing_vllm_handler(
    log_level: str, path: str, max_bytes: int = MAX_BYTES
) -> logging.Handler:
    """vLLM's default handler (vllm/logger.py DEFAULT_LOGGING_CONFIG: stream, formatter,
    colour choice), made from vLLM's own definitions, that also captures."""
    from logging.config import DictConfigurator

    import vllm.envs as envs
    from vllm import logger as vllm_logger

    config = json.loads(json.dumps(vllm_logger.DEFAULT_LOGGING_CONFIG))
    formatter_name = "vllm_color" if vllm_logger._use_color() else "vllm"
    formatter_config = dict(config["formatters"][formatter_name])
    formatter_config["log_level"] = log_level
    configurator = DictConfigurator({"version": 1})
    handler = CapturingStreamHandler(
        configurator.convert(envs.VLLM_LOGGING_STREAM), path, max_bytes
    )
    handler.setFormatter(configurator.configure_formatter(formatter_config))
    _hook_uncaught(handler)
    return handler


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    exc = None
    if record.exc_info and record.exc_info[0] is not None:
        exc = logging.Formatter().formatException(record.exc_info)
    return {
        "t": record.created,
        "level": record.levelname,
        "proc": getattr(record, "vllm_process_name", None) or record.processName,
        "pid": record.process,
        "msg": record.getMessage(),
        "exc": exc,
    }


def _hook_uncaught(handler: CapturingStreamHandler) -> None:
    """Record an uncaught exception too, then let the previous hook print it as before.

    vLLM reconfigures logging more than once per process; the hook is installed once
    and always writes through the newest handler."""
    current = sys.excepthook
    if getattr(current, "frontier_capture", None) is not None:
        current.frontier_capture = handler  # type: ignore[attr-defined]
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        record = logging.LogRecord(
            "uncaught", logging.CRITICAL, "", 0, "uncaught exception", None, (kind, value, tb)
        )
        hook.frontier_capture.capture(record)  # type: ignore[attr-defined]
        current(kind, value, tb)

    hook.frontier_capture = handler  # type: ignore[attr-defined]
    sys.excepthook = hook
