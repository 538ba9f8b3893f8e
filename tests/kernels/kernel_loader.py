"""Load the sparse-MLA kernel module from the vLLM overlay by path (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
KERNEL_PATH = REPO / "patches/vllm/files/vllm/v1/attention/ops/triton_sparse_mla.py"
MODULE_NAME = "frontier_triton_sparse_mla"


def load_kernel_module() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.spec_from_file_location(MODULE_NAME, KERNEL_PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while the class is built.
    sys.modules[MODULE_NAME] = mod
    spec.loader.exec_module(mod)
    return mod
