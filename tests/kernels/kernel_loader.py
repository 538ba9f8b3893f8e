"""Load the sparse-MLA kernel modules from the vLLM overlay by path (no vLLM needed).

The kernel is a public module (triton_sparse_mla.py: the API, the config tables, the
choice) and one module a kernel family beside it (triton_sparse_mla_triton.py, portable;
triton_sparse_mla_sm90.py and triton_sparse_mla_sm120.py, Gluon), joined by relative
imports. They are imported as a package of their own name here, so each name is an
instance with its own build caches.

With SPARSE_MLA_STANDIN=sm120 (`make test-kernels`' second pass on a GPU machine) the
module handed out is the SM120 stand-in (sm120_standin.py): the same tests then run the
kernel as an SM120 part would.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "patches/vllm/files/vllm/v1/attention/ops"
PUBLIC = "triton_sparse_mla"
# The public module first, then the families (kernel_variants.py bundles them in this order).
KERNEL_FILES = (f"{PUBLIC}.py", f"{PUBLIC}_triton.py", f"{PUBLIC}_sm90.py", f"{PUBLIC}_sm120.py")
KERNEL_PATH = KERNEL_DIR / KERNEL_FILES[0]
PACKAGE = "frontier_triton_sparse_mla"
STANDIN_ENV = "SPARSE_MLA_STANDIN"


def load_package(package: str, directory: Path = KERNEL_DIR) -> ModuleType:
    """The public kernel module of `directory`, imported as `package`.triton_sparse_mla."""
    name = f"{package}.{PUBLIC}"
    if name in sys.modules:
        return sys.modules[name]
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(directory)]
    sys.modules[package] = pkg
    try:
        return importlib.import_module(name)
    except BaseException:
        forget_package(package)
        raise


def forget_package(package: str) -> None:
    """Drop a package load_package made, and its modules, so the next load starts anew."""
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


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
    return load_package(PACKAGE)
