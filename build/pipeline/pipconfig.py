"""Read pip's own configuration (files and PIP_* variables) so downloads use
the same indexes, find-links folders and CA bundle as `pip install`."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field

DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass
class PipConfig:
    index_urls: list[str] = field(default_factory=lambda: [DEFAULT_INDEX])
    find_links: list[str] = field(default_factory=list)
    cert: str | None = None
    no_index: bool = False


def index_args(config: PipConfig) -> list[str]:
    """--index-url / --extra-index-url for the configured indexes (pip and uv read both)."""
    args = ["--index-url", config.index_urls[0]]
    for extra in config.index_urls[1:]:
        args += ["--extra-index-url", extra]
    return args


def _split(value: str) -> list[str]:
    return [part for part in value.split() if part]


def read(python: str = sys.executable) -> PipConfig:
    """Parse `pip config list`; environment values (`:env:`) win over files."""
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    from_files: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        scope, _, name = key.rpartition(".")
        if scope not in ("global", "download", "install", ":env:"):
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        (from_env if scope == ":env:" else from_files)[name] = str(value)
    merged = {**from_files, **from_env}
    config = PipConfig()
    if "index-url" in merged:
        config.index_urls = [merged["index-url"]]
    config.index_urls += _split(merged.get("extra-index-url", ""))
    config.find_links = _split(merged.get("find-links", ""))
    config.cert = merged.get("cert") or None
    config.no_index = merged.get("no-index", "").lower() in ("1", "true", "yes", "on")
    return config
