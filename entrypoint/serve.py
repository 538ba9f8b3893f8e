"""`serve`: render, validate, start the readiness watcher, then exec vLLM in place.

vLLM replaces this process (same pid, PID 1 in a container), so it receives
SIGTERM/SIGINT directly and its exit code is the container's. The watcher is a
fresh interpreter started just before the exec; it becomes vLLM's child and ends
when vLLM ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from entrypoint import gpus, load_progress, nodes, settings
from entrypoint.errors import ConfigError
from entrypoint.gguf_config import with_gguf_config
from entrypoint.hub_files import fetch_all, repos_from_namespace
from entrypoint.preflight import (
    check_gguf_request,
    check_port_free,
    check_writable,
    gguf_preflight,
    listen_host,
)
from entrypoint.render import Rendered, render
from entrypoint.statusfile import remove_quietly, write_json_atomic
from entrypoint.watcher import EXITED, VALIDATING, Tracker, WatchConfig


def _write_start_status(env: Mapping[str, str], phase: str, **fields: object) -> None:
    """The status before the watcher exists. Best effort: prepare() reports unusable paths."""
    path = settings.status_path_for(settings.ready_file_from(env), env)
    now = time.time()
    with contextlib.suppress(OSError):
        if not os.path.isdir(path):
            write_json_atomic(
                path, {"phase": phase, "since": now, "heartbeat": now, "pid": os.getpid(), **fields}
            )


def mark_validating(env: Mapping[str, str]) -> None:
    """The first step of every start: a ready file left by an earlier run (Kubernetes
    keeps /run/serve across container restarts) goes before validation begins, and
    the status says what is happening."""
    with contextlib.suppress(OSError):
        remove_quietly(settings.ready_file_from(env))
    _write_start_status(env, VALIDATING)


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


def watch_config(env: Mapping[str, str], rendered: Rendered) -> WatchConfig:
    watch = settings.watch_settings(env)
    if getattr(rendered.namespace, "uds", None):
        raise ConfigError(
            f"SERVE_UDS: the watcher checks health over TCP; set {settings.WATCHER}=false "
            "to serve on a unix socket"
        )
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
        node=None if rendered.node.role == nodes.SINGLE else rendered.node.describe(),
    )


def prepare(env: Mapping[str, str]) -> tuple[Rendered, WatchConfig | None, int]:
    """Everything before the exec that can fail: (rendered, watcher config, gguf exit code)."""
    gpus.require_gpu()  # before the GGUF config extraction below, which can take minutes
    env = with_gguf_config(env)  # bare .gguf: config + tokenizer from the file (gguf_config.py)
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
    if problems:
        raise ConfigError(problems)
    # Hub-named config/tokenizer: after the cheap checks, since it may download.
    fetched = fetch_all(repos_from_namespace(rendered.namespace))
    code = gguf_preflight(env, rendered.namespace, fetched)
    if code == 0 and node.role == nodes.WORKER:
        # Last, so the worker joins as soon as the leader's store is up.
        _write_start_status(env, VALIDATING, node=node.describe(),
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
    Tracker(config, extra={"watcher_pid": None}).write()
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint.watcher", config.to_json()],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # keep terminal Ctrl-C for vLLM alone
        close_fds=True,
    )


def exec_vllm(rendered: Rendered, config: WatchConfig | None) -> int:
    """Exec vLLM; returns only if the exec itself failed."""
    watcher = start_watcher(config) if config is not None else None
    if config is not None:
        load_progress.export(config.load_progress_dir, os.environ)
    for hint in config.hints if config is not None else model_hints(rendered.namespace.model):
        print(f"frontier-serve: warning: {hint}", file=sys.stderr)
    print(
        f"frontier-serve: exec {shlex.join(rendered.argv)}  [{rendered.digest}]",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
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
