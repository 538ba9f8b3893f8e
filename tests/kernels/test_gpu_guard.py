"""The GPU guard turns a skipped gpu test into a failure when a GPU is present."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CONFTEST = """
import sys
sys.path.insert(0, {here!r})
import gpu_guard
gpu_guard.gpu_present = lambda: {gpu}
from gpu_guard import pytest_collection_modifyitems, pytest_runtest_makereport

def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU")
"""

TESTS = """
import pytest

@pytest.mark.gpu
def test_gpu_skips_inside():
    pytest.skip("input missing")

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="skipif fired")
def test_gpu_skipif():
    pass

@pytest.mark.gpu
def test_gpu_passes():
    pass

def test_cpu_skip_is_a_skip():
    pytest.skip("not gpu-marked")
"""


def _run(tmp_path: Path, gpu: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST.format(here=str(HERE), gpu=gpu))
    (tmp_path / "test_guarded.py").write_text(TESTS)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("gpu", [True, False])
def test_gpu_guard(tmp_path: Path, gpu: bool) -> None:
    proc = _run(tmp_path, gpu)
    out = proc.stdout
    if gpu:
        assert proc.returncode == 1, out
        # a skip inside the test fails it; a skipif (setup phase) is an error
        assert "1 failed, 1 passed, 1 skipped, 1 error" in out, out
        assert "skipped on a machine with a GPU: input missing" in out, out
        assert "skipped on a machine with a GPU: skipif fired" in out, out
    else:
        assert proc.returncode == 0, out
        # all three gpu tests skip (CPU tier), the unmarked skip stays a skip
        assert "4 skipped" in out, out
        assert "needs a CUDA GPU (this is the CPU tier)" in out, out
