"""Fixtures shared across test folders: the real Gemma 3 270M Q4_K_M file
(tests/gguf and tests/gguf_cpu), and the process environment put back after a test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.gguf_models import ModelAssemblyError, gemma_gguf


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Assembled once into ~/.cache/frontier-serve/models and sha256-checked each session.

    A missing part package is a failure, not a skip: these tests are the only place
    a real quantized GGUF runs through the loader, so CI must not pass without them.
    """
    try:
        return gemma_gguf()
    except ModelAssemblyError as error:
        pytest.fail(str(error))


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """os.environ as it was before the test, whatever the test (or vLLM's CPU platform
    checking a config, or an in-process `serve`) set or removed in it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
