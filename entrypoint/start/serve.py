"""`serve`: render, validate, start the readiness watcher, then start vLLM in place.

vLLM keeps this process (same pid, PID 1 in a container), so it receives
SIGTERM/SIGINT directly and its exit code is the container's. The default program
runs in this interpreter, reusing the vLLM modules that validation imported
(entrypoint/start/vllm_in_process.py); a SERVE_EXEC program replaces it through exec.
The watcher is a fresh interpreter started just before; it is vLLM's child and
ends when vLLM ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from entrypoint.argv import nodes, settings
from entrypoint.argv.render import Rendered, render
from entrypoint.errors import ConfigError
from entrypoint.host import gpus
from entrypoint.start import vllm_in_process, vllm_logging
from entrypoint.start.gguf_config import with_gguf_config
from entrypoint.start.hub_files import fetch_all, repos_from_namespace
from entrypoint.start.preflight import (
    check_gguf_reads,
    check_gguf_request,
    check_port_free,
    check_writable,
    gguf_preflight,
    listen_host,
)
from entrypoint.watch import load_progress, node_heartbeat, startup_history
from entrypoint.watch.statusfile import remove_quietly, write_atomic, write_json_atomic
from entrypoint.watch.steps import IMPORTING_VLLM, PREFLIGHT, Steps
from entrypoint.watch.steps import VALIDATING as VALIDATING_STEP
from entrypoint.watch.watcher import EXITED, VALIDATING, Tracker, WatchConfig

# vLLM's own switches for its logging setup (vllm/envs.py); read, never set, except
# VLLM_LOGGING_CONFIG_PATH, which serve points at its capture config.
VLLM_LOGGING_CONFIG_PATH = "VLLM_LOGGING_CONFIG_PATH"
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")


def _write_start_status(env: Mapping[str, str], phase: str, **fields: object) -> None:
    """The status before the watcher exists. Best effort: prepare() reports unusable paths."""
    path = settings.status_path_for(settings.ready_file_from(env), env)
    now = time.time()
    with contextlib.suppress(OSError):
        if not os.path.isdir(path):
            write_json_atomic(
                path, {"phase": phase, "since": now, "heartbeat": now, "pid": os.getpid(), **fields}
            )


def mark_validating(env: Mapping[str, str]) -> Steps:
    """The first step of every start: a ready file left by an earlier run (Kubernetes
    keeps /run/serve across container restarts) goes before validation begins, and
    the status says what is happening. Returns the start's steps so far."""
    with contextlib.suppress(OSError):
        remove_quietly(settings.ready_file_from(env))
    steps = Steps()
    steps.enter(VALIDATING_STEP, time.time())
    _write_start_status(env, VALIDATING, step=VALIDATING_STEP, steps=steps.entries)
    return steps


def mark_refused(env: Mapping[str, str], problems: list[str], code: int) -> None:
    """A start stopped before the exec: the status names why, and nothing reads as ready."""
    _write_start_status(env, EXITED, exit_code=code, reason="; ".join(problems))


def drop_service_link_port(environ: dict[str, str]) -> str | None:
    """Kubernetes injects VLLM_PORT=tcp://IP:PORT for a Service named `vllm`; vLLM reads
    VLLM_PORT as its own internal port and dies on the URI. Such a value was never meant
    for vLLM, so it is removed with a warning (a plain port number is kept)."""
    value = environ.get("VLLM_PORT")
    if value is None or value.strip().isdigit():
        return None
    del environ["VLLM_PORT"]
    return (
        f"ignoring VLLM_PORT={value!r}: not a port number (Kubernetes sets it for a Service "
        "named vllm; set enableServiceLinks: false in the pod spec to stop that)"
    )


def health_url(namespace: argparse.Namespace) -> str:
    """Where the watcher reaches vLLM: loopback when it listens on every interface.

    A worker node serves no HTTP. The leader becomes healthy only once every node has
    joined and loaded (vLLM's engine starts only then), so a worker watches the
    leader's API, on the leader's address and the port both roles share."""
    node = nodes.node_of(namespace)
    if node.role == nodes.WORKER:
        host = node.master_addr
        return f"http://{f'[{host}]' if ':' in host else host}:{namespace.port}"
    host = listen_host(namespace.host)
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{namespace.port}"


def model_hints(model: str | None) -> list[str]:
    """Warnings that do not stop the start (vLLM decides what a model name means)."""
    if model and model.startswith(("/", "./", "../", "~")):
        path = os.path.expanduser(model)
        if not os.path.exists(path):
            return [f"model path {model} does not exist"]
    return []


def log_capture(env: Mapping[str, str], namespace: argparse.Namespace) -> tuple[str | None, str]:
    """(vLLM's log level, "") when serve may hand vLLM its capture config, else (None, why).

    A logging config of the user's own wins: vLLM reads one config only."""
    if not settings.flag(env, settings.LOG_CAPTURE, default=True):
        return None, f"{settings.LOG_CAPTURE}=false"
    if os.environ.get(VLLM_LOGGING_CONFIG_PATH) or env.get(VLLM_LOGGING_CONFIG_PATH):
        return None, f"{VLLM_LOGGING_CONFIG_PATH} is set: vLLM uses that logging config"
    if (os.environ.get("VLLM_CONFIGURE_LOGGING") or env.get("VLLM_CONFIGURE_LOGGING")) == "0":
        return None, "VLLM_CONFIGURE_LOGGING=0: vLLM configures no logging"
    if getattr(namespace, "log_config_file", None) or getattr(namespace, "logging_config", None):
        return None, "a logging config is given in vLLM's arguments"
    level = str(getattr(namespace, "log_level", None) or env.get("VLLM_LOGGING_LEVEL")
                or os.environ.get("VLLM_LOGGING_LEVEL") or "INFO").upper()
    if level not in LOG_LEVELS:
        return None, f"unknown vLLM log level {level!r}"
    return level, ""


def capture_files(status_file: str) -> tuple[str, str]:
    """(the capture file, vLLM's logging config) of one status file."""
    return status_file + ".log.jsonl", status_file + ".logging.json"


def watch_config(env: Mapping[str, str], rendered: Rendered) -> WatchConfig:
    watch = settings.watch_settings(env)
    if getattr(rendered.namespace, "uds", None):
        raise ConfigError(
            f"SERVE_UDS: the watcher checks health over TCP; set {settings.WATCHER}=false "
            "to serve on a unix socket"
        )
    level, capture_off = log_capture(env, rendered.namespace)
    return WatchConfig(
        pid=os.getpid(),  # vLLM keeps this pid after the exec
        base_url=health_url(rendered.namespace),
        ready_file=watch.ready_file,
        status_file=watch.status_file,
        argv_digest=rendered.digest,
        interval=watch.interval,
        timeout=watch.timeout,
        failures=watch.failures,
        stale_after=watch.stale_after,
        hints=model_hints(rendered.namespace.model),
        load_progress_dir=load_progress.folder_for(watch.status_file),
        log_file=capture_files(watch.status_file)[0] if level else None,
        log_level=level or "INFO",
        log_capture_off=capture_off or None,
        cuda_graphs=gpus.vllm_is_cuda_build() and not rendered.namespace.enforce_eager,
        wedge_seconds=watch.wedge_seconds,
        stall=watch.stall,
        start_limit=watch.start_limit,
        # A worker's watcher watches the leader's API: only the leader sends the check.
        generation_check_interval=(
            0.0 if rendered.node.role == nodes.WORKER else watch.generation_check_interval
        ),
        generation_check_timeout=watch.generation_check_timeout,
        history_file=startup_history.path_for(watch.status_file),
        node=None if rendered.node.role == nodes.SINGLE else {
            **rendered.node.describe(),
            "heartbeat_port": nodes.heartbeat_port(env, rendered.node),
        },
    )


def check_heartbeat_port(port: int) -> None:
    """A worker's watcher answers the leader's heartbeat on this port: it must be free."""
    try:
        node_heartbeat.listen(port).close()
    except OSError as exc:
        raise ConfigError(
            f"{settings.HEARTBEAT_PORT}={port}: this worker node cannot listen on it "
            f"({exc.strerror or exc}); stop what holds it or set {settings.HEARTBEAT_PORT} "
            "to a free port, the same on every node"
        ) from None


def prepare(
    env: Mapping[str, str], steps: Steps | None = None
) -> tuple[Rendered, WatchConfig | None, int]:
    """Everything before the exec that can fail: (rendered, watcher config, gguf exit code)."""
    steps = Steps() if steps is None else steps
    gpus.require_gpu()  # before the GGUF config extraction below, which can take minutes
    env = with_gguf_config(env)  # bare .gguf: config + tokenizer from the file (gguf_config.py)
    # Rendering builds vLLM's parser: the imports the start goes on with (vllm_in_process).
    steps.enter(IMPORTING_VLLM, time.time())
    _write_start_status(env, VALIDATING, step=IMPORTING_VLLM, steps=steps.entries)
    rendered = render(env)
    problems: list[str] = []
    config: WatchConfig | None = None

    def collect(check: Callable[..., None], *args: object) -> None:
        try:
            check(*args)
        except ConfigError as exc:
            problems.extend(exc.problems)

    watcher_on = settings.flag(env, settings.WATCHER, default=True)
    port_check_on = settings.flag(env, settings.CHECK_PORT, default=True)
    if watcher_on:
        try:
            config = watch_config(env, rendered)
            collect(check_writable, config.ready_file, settings.READY_FILE)
            collect(check_writable, config.status_file, settings.STATUS_FILE)
            if config.node and config.node["role"] == nodes.WORKER:
                collect(check_heartbeat_port, config.node["heartbeat_port"])
        except ConfigError as exc:
            problems.extend(exc.problems)
    node = rendered.node
    leader_wait = 0.0
    if node.role == nodes.WORKER:
        try:
            leader_wait = nodes.leader_timeout(env)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if (
        port_check_on
        and not getattr(rendered.namespace, "uds", None)
        and node.role != nodes.WORKER  # a headless node listens on no HTTP port
    ):
        collect(check_port_free, rendered.namespace.host, rendered.namespace.port)
    collect(gpus.require_enough_gpus, rendered.namespace)
    problems.extend(nodes.gpus_per_node_problems(rendered.namespace, env))
    collect(check_gguf_request, env, rendered.namespace.model or "")
    collect(check_gguf_reads, env)
    if problems:
        raise ConfigError(problems)
    # Hub-named config/tokenizer: after the cheap checks, since it may download.
    steps.enter(PREFLIGHT, time.time())
    _write_start_status(env, VALIDATING, step=PREFLIGHT, steps=steps.entries)
    fetched = fetch_all(repos_from_namespace(rendered.namespace))
    code = gguf_preflight(env, rendered.namespace, fetched)
    if config is not None:
        config.steps = steps.entries
    if code == 0 and node.role == nodes.WORKER:
        # Last, so the worker joins as soon as the leader's store is up.
        _write_start_status(env, VALIDATING, step=PREFLIGHT, steps=steps.entries,
                            node=node.describe(),
                            waiting_for=f"leader {node.leader_endpoint}")  # fmt: skip
        nodes.wait_for_leader(node, leader_wait)
    return rendered, config, code


def start_watcher(config: WatchConfig) -> subprocess.Popen[bytes]:
    # A stale ready file from an earlier run must not make this one look ready.
    remove_quietly(config.ready_file)
    if config.load_progress_dir:  # so is an earlier run's load progress
        why = load_progress.clear(config.load_progress_dir)
        if why is not None:
            print(f"frontier-serve: warning: no load progress in the status: {why}",
                  file=sys.stderr)
            config.load_progress_dir = None
    if config.log_file:  # and its log
        why = start_log_capture(config)
        if why is not None:
            print(f"frontier-serve: warning: vLLM's log is not captured: {why}", file=sys.stderr)
            config.log_file, config.log_capture_off = None, why
    Tracker(config, extra={"watcher_pid": None}).write()
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint.watch.watcher", config.to_json()],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # keep terminal Ctrl-C for vLLM alone
        close_fds=True,
    )


def start_log_capture(config: WatchConfig) -> str | None:
    """An empty capture file and vLLM's logging config pointing at it, named to vLLM
    through VLLM_LOGGING_CONFIG_PATH. Returns why that failed, or None."""
    assert config.log_file is not None
    log_config = capture_files(config.status_file)[1]
    try:
        write_atomic(config.log_file, "")
        text = json.dumps(vllm_logging.logging_config(config.log_file, config.log_level))
        write_atomic(log_config, text)
    except OSError as exc:
        return f"{exc.filename or config.log_file}: {exc.strerror or exc}"
    os.environ[VLLM_LOGGING_CONFIG_PATH] = log_config
    return None


def exec_vllm(rendered: Rendered, config: WatchConfig | None, here: str | None = None) -> int:
    """Exec vLLM, or with `here` (a module: vllm_in_process.module_of) run it in this
    interpreter. Returns vLLM's exit code when it ran here, 127 when the exec failed."""
    watcher = start_watcher(config) if config is not None else None
    if config is not None:
        load_progress.export(config.load_progress_dir, os.environ)
    for hint in config.hints if config is not None else model_hints(rendered.namespace.model):
        print(f"frontier-serve: warning: {hint}", file=sys.stderr)
    how = "run in this process" if here else "exec"
    print(
        f"frontier-serve: {how} {shlex.join(rendered.argv)}  [{rendered.digest}]",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    if here:
        # Outside the try: an OSError of vLLM's own (a port taken) is no failed exec.
        return vllm_in_process.run_module(here, rendered.argv[len(rendered.program) :])
    try:
        os.execvp(rendered.argv[0], rendered.argv)
    except OSError as exc:
        if watcher is not None and config is not None:
            watcher.terminate()
            watcher.wait()
            why = f"exec of {rendered.argv[0]!r} failed: {exc.strerror or exc}"
            Tracker(config, extra={"watcher_pid": None}).finish(127, why)
        print(f"frontier-serve: error: cannot exec {rendered.argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    raise AssertionError("unreachable")  # pragma: no cover
