"""Patched trees: fresh pristine copies of the pinned upstreams with their series
applied. Used by the `patch-check`, `wheels` and `venv` steps and by `image`, which
needs the same digests for its labels."""

from __future__ import annotations

from pathlib import Path

from . import patcher, pins, series, source
from .worklock import locked


def patched_trees(
    loaded: pins.Pins, dest: Path, vllm_source: str, upstreams: list[str]
) -> dict[str, str]:
    """Fresh pristine copies, each patched; returns upstream -> tree digest."""
    digests: dict[str, str] = {}
    with locked(dest, "patched trees"):
        for upstream in upstreams:
            tree = source.prepare(upstream, loaded, dest / upstream, vllm_source)
            patcher.apply_series(series.load(upstream), tree)
            digests[upstream] = patcher.tree_digest(tree)
    return digests
