"""vLLM patch 0008: on CPU the DSA indexer's uniform decode expansion (MTP with 2+
draft tokens) is a torch twin of PrepareUniformDecodeKernel; it writes what the
Triton kernel writes (run in Triton's interpreter, in a child process), padding
requests with seq_len 0 included. Without the patch the twin does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
CHILD = Path(__file__).resolve().parents[2] / "checks" / "backend" / "uniform_decode_twin.py"


def test_torch_twin_equals_the_triton_kernel() -> None:
    done = subprocess.run([sys.executable, str(CHILD)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    lines = [x for x in done.stdout.splitlines() if x.startswith("UNIFORM-DECODE-TWIN ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    cases = json.loads(lines[-1].removeprefix("UNIFORM-DECODE-TWIN "))
    assert len(cases) == 4
    for case in cases:
        assert case["equal"], case
    # next_n 3 over seq_len 0 (padding): token contexts clamp at 0
    assert cases[0]["seq_lens"][-3:] == [0, 0, 0]
