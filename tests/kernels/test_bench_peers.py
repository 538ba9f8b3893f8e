"""`make bench-peers` runs with a plain python3: bench_peers.py needs no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kernels" / "bench_peers.py"

# Import the script with torch made unimportable, then patch a sample source.
PROBE = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import importlib.util
spec = importlib.util.spec_from_file_location("bench_peers", {str(SCRIPT)!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
src = "".join(mod.DECODE_SWAPS) + "x = 1\\n"
out = mod.standalone_decode_source(src)
assert "vllm" not in out and "import triton.language as tl" in out, out
print("ok")
"""


def test_bench_peers_needs_no_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
