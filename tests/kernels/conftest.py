"""Kernel tests run on a GPU, or on the CPU through Triton's interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU the kernels can only run interpreted; triton.jit reads this
# when the kernel module is loaded, so it must be set before that.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this is the CPU tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
