"""Every kernel build SM120 would launch fits its 99 KiB and does not spill.

Compiles for GPUTarget("cuda", 120, 32) with Triton's own ptxas, so it needs
no GPU, only Triton's NVIDIA backend and its bundled cuobjdump. It compiles in
a child process because TRITON_INTERPRET=1 (the CPU tier) cannot compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sm120_fitness import SM120_SMEM_LIMIT, cuobjdump_path

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "sm120_fitness.py"


def test_sm120_builds_fit() -> None:
    if not cuobjdump_path().exists():
        pytest.skip("Triton's bundled cuobjdump is missing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(r["name"].startswith("split") for r in rows)
    assert any(r["name"].startswith("merge") for r in rows)
    for r in rows:
        assert r["shared"] <= SM120_SMEM_LIMIT, r
        assert r["local"] == 0 and r["stack"] == 0, f"spills: {r}"
        assert 0 < r["registers"] <= 255, r
