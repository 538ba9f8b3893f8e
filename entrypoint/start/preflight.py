"""Checks that fail in seconds what vLLM would only fail after minutes of loading."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from entrypoint.argv import settings
from entrypoint.errors import ConfigError
from entrypoint.start.gguf_hook import GGUF_NO_LAYOUT, resolve_hf_config, run_gguf_check


def check_writable(path: str, name: str) -> None:
    """`path` is no folder, and its folder exists (or can be made) and takes a new file."""
    if os.path.isdir(path):
        raise ConfigError(f"{name}={path}: is a directory; name a file (e.g. {path}/ready)")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{name}={path}: cannot write in {folder}: {exc.strerror or exc}"
        ) from None


def listen_host(host: str | None) -> str:
    """Where vLLM will bind: no host means every interface."""
    return host or "0.0.0.0"


def check_port_free(host: str | None, port: int) -> None:
    """Bind the port the way vLLM will (SO_REUSEADDR), then let it go again."""
    if port == 0:
        return
    bind_host = listen_host(host)
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"SERVE_PORT={port}: port {port} on {bind_host} is already in use; "
                    "stop the other server or choose another port"
                ) from None
            raise ConfigError(
                f"SERVE_HOST/SERVE_PORT: cannot bind {bind_host}:{port}: {exc}"
            ) from None


def check_gguf_request(env: Mapping[str, str], model: str) -> None:
    """SERVE_PREFLIGHT_GGUF=true asks for a check that only a .gguf file can have."""
    if settings.flag(env, settings.PREFLIGHT_GGUF, default=False) and not model.lower().endswith(
        ".gguf"
    ):
        raise ConfigError(
            f"{settings.PREFLIGHT_GGUF}=true, but {settings.MODEL}={model!r} is not a .gguf "
            f"file: there is no GGUF to check; point {settings.MODEL} at the .gguf file or "
            f"unset {settings.PREFLIGHT_GGUF}"
        )


# The plugin's GGUF read settings (patch 0008, gguf_reads.py, which imports torch and so
# is not loaded here; tests/entrypoint/test_entrypoint_bad_input.py checks both agree).
GGUF_READS, GGUF_READS_MODES = "FRONTIER_GGUF_READS", ("pread", "mmap")
GGUF_READERS, GGUF_READERS_MAX = "FRONTIER_GGUF_READERS", 64


def check_gguf_reads(env: Mapping[str, str]) -> None:
    """The loader's read settings, refused here rather than in every worker mid-start."""
    mode = env.get(GGUF_READS, "").strip().lower()
    if mode and mode not in GGUF_READS_MODES:
        raise ConfigError(f"{GGUF_READS}={env[GGUF_READS]!r}: expected one of "
                          f"{', '.join(GGUF_READS_MODES)} (pread reads each slice from the "
                          "file, mmap copies it through a memory map)")
    readers = env.get(GGUF_READERS, "").strip()
    if readers and not (readers.isdigit() and 1 <= int(readers) <= GGUF_READERS_MAX):
        raise ConfigError(f"{GGUF_READERS}={env[GGUF_READERS]!r}: expected a whole number "
                          f"from 1 to {GGUF_READERS_MAX} (reader threads per rank)")


def wants_gguf_check(env: Mapping[str, str], model: str) -> bool:
    is_gguf = model.lower().endswith(".gguf")
    return settings.flag(env, settings.PREFLIGHT_GGUF, default=is_gguf) and is_gguf


def gguf_check_config(
    namespace: argparse.Namespace, fetched: Mapping[str, Path] | None = None
) -> str:
    """The HF config the GGUF check reads: --hf-config-path (its fetched or cached copy
    for a hub id), else the GGUF's own folder."""
    model = namespace.model or ""
    hf_config = namespace.hf_config_path or os.path.dirname(os.path.abspath(model))
    local = (fetched or {}).get(hf_config)
    return str(local) if local else resolve_hf_config(hf_config)


def layout_required(env: Mapping[str, str]) -> bool:
    """Only an explicit SERVE_PREFLIGHT_GGUF makes "no tensor layout known" a failure:
    the default check covers GLM-5/DeepSeek, and other architectures load without it."""
    return bool(env.get(settings.PREFLIGHT_GGUF))


def gguf_preflight(
    env: Mapping[str, str],
    namespace: argparse.Namespace,
    fetched: Mapping[str, Path] | None = None,
) -> int:
    """0, or the GGUF check's exit code when the model is a .gguf file and checking is on.

    `fetched` maps hub repo ids to the local folders `hub_files` put them in.
    """
    model = namespace.model or ""
    if not wants_gguf_check(env, model):
        return 0
    code = run_gguf_check(model, gguf_check_config(namespace, fetched))
    if code == GGUF_NO_LAYOUT and not layout_required(env):
        # On by default for every .gguf, but only GLM-5/DeepSeek layouts are
        # known: other architectures (e.g. Gemma) load without the preflight.
        print(
            "frontier-serve: GGUF preflight skipped (no tensor layout for this model type); "
            f"set {settings.PREFLIGHT_GGUF}=true to require it",
            file=sys.stderr,
        )
        return 0
    return code
