"""Read profile env files (`KEY=VALUE` lines) the way Kubernetes and compose both do.

No quoting, no interpolation: a value is everything after the first `=`, so JSON
needs no escaping. Lines that are blank or start with `#` are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from entrypoint.errors import ConfigError


def read_env_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"env file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"env file {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None
    values: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, eq, value = text.partition("=")
        if not eq or not key.strip().isidentifier():
            raise ConfigError(f"env file {path}:{number}: expected KEY=VALUE, got {text[:60]!r}")
        values[key.strip()] = value.strip()
    return values


def layered_environment(
    env_files: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Env files in order, then the process environment on top (it always wins)."""
    merged: dict[str, str] = {}
    for path in env_files:
        merged.update(read_env_file(path))
    merged.update(os.environ if environ is None else environ)
    return merged
