"""Kernel tests run on a GPU, or on the CPU through Triton's interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

# Without a GPU the kernels can only run interpreted; triton.jit reads this
# when the kernel module is loaded, so it must be set before that.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# gpu_guard beside this file; kernel_loader, sm120_standin and sm120_fitness, which the
# benches and the image check share, in fixtures/kernels.
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"
sys.path[:0] = [str(Path(__file__).parent), str(FIXTURES)]

from gpu_guard import pytest_collection_modifyitems, pytest_runtest_makereport  # noqa: E402

__all__ = ["pytest_collection_modifyitems", "pytest_runtest_makereport"]
