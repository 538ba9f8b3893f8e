"""Where the pipeline reads and writes. Everything generated lives outside git."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINS_FILE = REPO / "build" / "pins.toml"
PATCHES = REPO / "patches"


def cache_root() -> Path:
    """FRONTIER_CACHE, else frontier-serve in the user's cache folder."""
    root = os.environ.get("FRONTIER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "frontier-serve"
    )
    return Path(root)


def cache_dir() -> Path:
    """Downloads live outside the clone so fresh clones and CI reuse them."""
    return cache_root() / "pins"


def os_error_line(exc: OSError) -> str:
    """One line for a file error: the path, what is wrong, and the setting behind it."""
    path = Path(str(exc.filename))
    line = f"{path}: {exc.strerror or exc}"
    for name, root in (("FRONTIER_CACHE", cache_root()), ("FRONTIER_WORK", work_dir())):
        if path == root or root in path.parents or path in root.parents:
            given = os.environ.get(name)
            setting = f"{name}={given}" if given else f"{name} (unset: {root})"
            return f"{line}; {setting} must be a folder this user can write"
    return line


def work_dir() -> Path:
    return Path(os.environ.get("FRONTIER_WORK") or REPO / ".work")
