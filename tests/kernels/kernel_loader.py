"""Load the sparse-MLA kernel module from the vLLM overlay by path (no vLLM needed).

With SPARSE_MLA_STANDIN=sm120 (`make test-kernels`' second pass on a GPU machine) the
module handed out is the SM120 stand-in (sm120_standin.py): the same tests then run the
kernel as an SM120 part would.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
KERNEL_PATH = REPO / "patches/vllm/files/vllm/v1/attention/ops/triton_sparse_mla.py"
MODULE_NAME = "frontier_triton_sparse_mla"


STANDIN_ENV = "SPARSE_MLA_STANDIN"


def load_kernel_module() -> ModuleType:
    standin = os.environ.get(STANDIN_ENV, "")
    if standin:
        if standin != "sm120":
            raise ValueError(f"{STANDIN_ENV}={standin!r}: the one stand-in is 'sm120'")
        try:
            from sm120_standin import load_standin
        except ImportError:
            from tests.kernels.sm120_standin import load_standin
        return load_standin()
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.spec_from_file_location(MODULE_NAME, KERNEL_PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while the class is built.
    sys.modules[MODULE_NAME] = mod
    spec.loader.exec_module(mod)
    return mod
