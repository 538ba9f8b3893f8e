"""Where the pipeline reads and writes. Everything generated lives outside git."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINS_FILE = REPO / "build" / "pins.toml"
PATCHES = REPO / "patches"


def cache_dir() -> Path:
    """Downloads live outside the clone so fresh clones and CI reuse them."""
    root = os.environ.get("FRONTIER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "frontier-serve"
    )
    return Path(root) / "pins"


def work_dir() -> Path:
    return Path(os.environ.get("FRONTIER_WORK") or REPO / ".work")
