"""GPU-marked backend tests skip on CPU with a reason and fail if they skip on a GPU."""

from __future__ import annotations

from tests.kernels.gpu_guard import pytest_collection_modifyitems, pytest_runtest_makereport

__all__ = ["pytest_collection_modifyitems", "pytest_runtest_makereport"]
