"""Names the entrypoint reserves for itself, with their defaults.

Every name here is read by the entrypoint and never passed to vLLM. All carry the
`SERVE_` prefix; we never define `VLLM_*` names (vLLM owns that namespace and
Kubernetes injects `VLLM_PORT` for a Service called `vllm`). A unit test checks
that none of these collides with a real vLLM option.

This module is imported by `probe`, so it must stay stdlib-only and cheap.
"""

from __future__ import annotations

import os

from entrypoint.errors import ConfigError

# `typing` alone costs probe ~5 ms, so type-only imports hide behind a plain flag.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

PREFIX = "SERVE_"

# The option every workload sets (a vLLM option, `vllm serve MODEL`); named once here.
MODEL = "SERVE_MODEL"

# Names reserved by the entrypoint; `frontier-serve reserved` prints RESERVED.
EXTRA_ARGS = "SERVE_EXTRA_ARGS"
EXEC = "SERVE_EXEC"
READY_FILE = "SERVE_READY_FILE"
STATUS_FILE = "SERVE_STATUS_FILE"
PREFLIGHT_GGUF = "SERVE_PREFLIGHT_GGUF"
HEALTH_INTERVAL = "SERVE_HEALTH_INTERVAL"
HEALTH_TIMEOUT = "SERVE_HEALTH_TIMEOUT"
HEALTH_FAILURES = "SERVE_HEALTH_FAILURES"
STALE_AFTER = "SERVE_STALE_AFTER"
WATCHER = "SERVE_WATCHER"
CHECK_PORT = "SERVE_CHECK_PORT"
LOG_CAPTURE = "SERVE_LOG_CAPTURE"
WEDGE_SECONDS = "SERVE_WEDGE_SECONDS"
GENERATION_CHECK_INTERVAL = "SERVE_GENERATION_CHECK_INTERVAL"
GENERATION_CHECK_TIMEOUT = "SERVE_GENERATION_CHECK_TIMEOUT"
LEADER_TIMEOUT = "SERVE_LEADER_TIMEOUT"
HEARTBEAT_PORT = "SERVE_HEARTBEAT_PORT"
STALL_LOAD = "SERVE_STALL_LOAD"
STALL_COMPILE = "SERVE_STALL_COMPILE"
STALL_OTHER = "SERVE_STALL_OTHER"
START_LIMIT = "SERVE_START_LIMIT"

# What each reserved name means: the one description of it.
RESERVED: dict[str, str] = {
    EXTRA_ARGS: "JSON array of extra vLLM argv elements, appended after the mapped options",
    EXEC: "JSON array naming the program to exec, vLLM options following it (default: the "
    "vLLM API server's module, run in serve's own interpreter, which has imported vLLM "
    "to validate)",
    READY_FILE: "readiness file, present only while vLLM answers /health and /v1/models "
    "(default /run/serve/ready)",
    STATUS_FILE: "status JSON (default: status.json beside the readiness file)",
    PREFLIGHT_GGUF: "run the GGUF preflight check before exec (default: true for .gguf models; "
    "true with a model that is no .gguf file is an error)",
    HEALTH_INTERVAL: "seconds between health checks (default 2)",
    HEALTH_TIMEOUT: "seconds allowed per health request (default 2)",
    HEALTH_FAILURES: "failed checks in a row that make a ready server unhealthy (default 3)",
    STALE_AFTER: "heartbeat age in seconds after which `probe` fails (default 15)",
    WATCHER: "start the readiness watcher (default true)",
    CHECK_PORT: "refuse to start when the HTTP port is already taken (default true)",
    LOG_CAPTURE: "copy vLLM's log records to a file beside the status, for its steps and "
    "its last error (default true)",
    WEDGE_SECONDS: "requests running with no engine progress for this long make a ready "
    "server unhealthy (default 300; 0: off)",
    GENERATION_CHECK_INTERVAL: "ask an idle ready server for one token every this many "
    "seconds (default 0: off)",
    GENERATION_CHECK_TIMEOUT: "seconds that token may take, with no other engine progress "
    "meanwhile, before the server counts as unhealthy (default 60)",
    LEADER_TIMEOUT: "a worker node (SERVE_NODE_RANK > 0): seconds to wait for the leader's "
    "SERVE_MASTER_ADDR:SERVE_MASTER_PORT to accept a connection before giving up (default 600)",
    HEARTBEAT_PORT: "multi-node: the TCP port on which each worker node's watcher answers "
    "the leader's heartbeat, so that a frozen node or a cut network is seen within ~20 s "
    "(default SERVE_MASTER_PORT + 1000)",
    STALL_LOAD: "a start whose GGUF weight loading moves no byte for this many seconds is "
    "ended (default 600; 0: off)",
    STALL_COMPILE: "the same for the steps that report nothing until they end: compiling, "
    "CUDA graph capture, warm-up, and loading weights that report no bytes (safetensors, a "
    "download inside vLLM) (default 2700; 0: off)",
    STALL_OTHER: "the same for every other start step (default 900; 0: off)",
    START_LIMIT: "`probe --live` fails a start still not ready after this many seconds, "
    "however it moves: a backstop (default 21600)",
}

# A start that stops moving is ended by the watcher (entrypoint/watch/stall.py). Weight loading
# reports bytes (the plugin's per-rank progress files), so its limit can be short. JIT
# compilation and graph capture report nothing until they finish: a first GLM-5 start on
# SM120 compiles every Triton kernel, so their limit is long.
DEFAULT_STALL = {STALL_LOAD: 600.0, STALL_COMPILE: 2700.0, STALL_OTHER: 900.0}
DEFAULT_START_LIMIT = 21600.0

# The wedge watchdog's default. The longest stretch a healthy engine goes without moving
# any /metrics counter while requests run is its first use of a new shape (Triton and
# DeepGEMM JIT-compile and autotune then, tens of seconds on a cold cache) plus one
# prefill chunk; 300 s is several times that, and still restarts a stalled GLM-5
# (vLLM issue 51921) within minutes instead of never.
DEFAULT_WEDGE_SECONDS = 300.0

DEFAULT_READY_FILE = "/run/serve/ready"
DEFAULT_EXEC_MODULE = "vllm.entrypoints.openai.api_server"
HEADLESS_EXEC_MODULE = "entrypoint.start.vllm_serve"  # `vllm serve`, for headless worker nodes

TRUE_WORDS = frozenset({"true", "1"})
FALSE_WORDS = frozenset({"false", "0"})


class SettingError(ConfigError, ValueError):
    """A reserved variable has a value we cannot use (a ConfigError naming it)."""


def parse_bool(name: str, value: str) -> bool:
    """Strict boolean: only true/false/1/0 (any case), so typos never pass silently."""
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingError(f"{name}={value!r}: expected a boolean (true, false, 1 or 0)")


def number(
    env: Mapping[str, str], name: str, default: float, minimum: float, maximum: float
) -> float:
    """A finite number in [minimum, maximum]: `inf` or `nan` would busy-loop the watcher
    or keep a heartbeat from ever going stale."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a number") from None
    if not minimum <= value <= maximum:  # False for nan too
        raise SettingError(f"{name}={raw!r}: must be a number from {minimum:g} to {maximum:g}")
    return value


def count(env: Mapping[str, str], name: str, default: int, minimum: int, maximum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a whole number") from None
    if not minimum <= value <= maximum:
        raise SettingError(f"{name}={raw!r}: must be from {minimum} to {maximum}")
    return value


def status_path_for(ready_file: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    explicit = env.get(STATUS_FILE, "").strip()
    return explicit or os.path.join(os.path.dirname(ready_file) or ".", "status.json")


class WatchSettings:
    """Watcher timing and file locations (a plain class: dataclasses cost probe ~15 ms)."""

    def __init__(
        self,
        ready_file: str,
        status_file: str,
        interval: float,
        timeout: float,
        failures: int,
        stale_after: float,
        wedge_seconds: float = DEFAULT_WEDGE_SECONDS,
        generation_check_interval: float = 0.0,
        generation_check_timeout: float = 60.0,
        stall: dict[str, float] | None = None,
        start_limit: float = DEFAULT_START_LIMIT,
    ) -> None:
        self.ready_file = ready_file
        self.status_file = status_file
        self.interval = interval
        self.timeout = timeout
        self.failures = failures
        self.stale_after = stale_after
        self.wedge_seconds = wedge_seconds
        self.generation_check_interval = generation_check_interval
        self.generation_check_timeout = generation_check_timeout
        self.stall = dict(DEFAULT_STALL if stall is None else stall)
        self.start_limit = start_limit


def ready_file_from(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(READY_FILE, "").strip() or DEFAULT_READY_FILE


def watch_settings(env: Mapping[str, str] | None = None) -> WatchSettings:
    """The watcher's settings, each in range and none contradicting another."""
    env = os.environ if env is None else env
    ready = ready_file_from(env)
    problems: list[str] = []

    def read(reader, *args):  # type: ignore[no-untyped-def]
        try:
            return reader(env, *args)
        except SettingError as exc:
            problems.extend(exc.problems)
            return args[1]  # the default, so the other checks still run

    settings = WatchSettings(
        ready_file=ready,
        status_file=status_path_for(ready, env),
        interval=read(number, HEALTH_INTERVAL, 2.0, 0.1, 3600.0),
        timeout=read(number, HEALTH_TIMEOUT, 2.0, 0.1, 600.0),
        failures=read(count, HEALTH_FAILURES, 3, 1, 1000),
        stale_after=read(number, STALE_AFTER, 15.0, 1.0, 86400.0),
        wedge_seconds=read(number, WEDGE_SECONDS, DEFAULT_WEDGE_SECONDS, 0.0, 86400.0),
        generation_check_interval=read(number, GENERATION_CHECK_INTERVAL, 0.0, 0.0, 86400.0),
        generation_check_timeout=read(number, GENERATION_CHECK_TIMEOUT, 60.0, 1.0, 3600.0),
        stall={name: read(number, name, default, 0.0, 604800.0)
               for name, default in DEFAULT_STALL.items()},
        start_limit=read(number, START_LIMIT, DEFAULT_START_LIMIT, 60.0, 2592000.0),
    )
    if os.path.abspath(settings.ready_file) == os.path.abspath(settings.status_file):
        problems.append(
            f"{READY_FILE} and {STATUS_FILE} both name {settings.ready_file}; "
            "they must be two files"
        )
    # One round: the wait, then /health and /v1/models, each up to the timeout.
    heartbeat_gap = settings.interval + 2 * settings.timeout
    if not problems and settings.stale_after <= heartbeat_gap:
        problems.append(
            f"{STALE_AFTER}={settings.stale_after:g}: must exceed {HEALTH_INTERVAL} + "
            f"2 x {HEALTH_TIMEOUT} ({heartbeat_gap:g} s), or a healthy server's heartbeat "
            "goes stale between two checks"
        )
    if not problems and 0 < settings.wedge_seconds < settings.interval:
        problems.append(
            f"{WEDGE_SECONDS}={settings.wedge_seconds:g}: must be 0 (off) or at least "
            f"{HEALTH_INTERVAL} ({settings.interval:g} s): /metrics is read once per check"
        )
    if not problems and 0 < settings.generation_check_interval < settings.interval:
        problems.append(
            f"{GENERATION_CHECK_INTERVAL}={settings.generation_check_interval:g}: must be 0 "
            f"(off) or at least {HEALTH_INTERVAL} ({settings.interval:g} s)"
        )
    for name, seconds in settings.stall.items():
        if not problems and 0 < seconds < 10 * settings.interval:
            problems.append(
                f"{name}={seconds:g}: must be 0 (off) or at least 10 x {HEALTH_INTERVAL} "
                f"({10 * settings.interval:g} s): progress is looked at once per check"
            )
    if problems:
        raise SettingError(problems)
    return settings


def flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip()
    return default if not raw else parse_bool(name, raw)
