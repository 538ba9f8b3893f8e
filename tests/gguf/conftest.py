"""Fixtures for the GGUF tests: one tiny GLM-5-layout model per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.tiny_glm5_gguf import CONFIG, GGUF_NAME, Tiny, make_tiny, write_gguf


@pytest.fixture(scope="session")
def tiny() -> Tiny:
    return make_tiny(CONFIG, seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json + the intact tiny GGUF."""
    out = tmp_path_factory.mktemp("tiny-glm5")
    (out / "config.json").write_text(json.dumps(CONFIG))
    write_gguf(out / GGUF_NAME, tiny)
    return out


@pytest.fixture(scope="session")
def tiny_gguf(tiny_dir: Path) -> Path:
    return tiny_dir / GGUF_NAME
