"""Where frontier-serve keeps its caches outside the clone and outside images."""

from __future__ import annotations

import os
from pathlib import Path


def frontier_cache() -> Path:
    """`$FRONTIER_CACHE`, default `~/.cache/frontier-serve`."""
    return Path(os.environ.get("FRONTIER_CACHE") or Path.home() / ".cache" / "frontier-serve")
