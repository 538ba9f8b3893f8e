#!/usr/bin/env bash
# One call on the GPU machine: GPU test tier (SM120 fitness included), then the benchmark.
# Usage (repo root): bash tests/kernels/device_check.sh [bench args...]
# Logs go to $OUT when set (the device tool), else to ./.bench-out.
set -uo pipefail
out="${OUT:-.bench-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
rc=0
timeout 240 python3 -m pytest tests/kernels -q -p no:cacheprovider --durations=5 2>&1 \
  | tee "$out/pytest.log" | tail -25 || rc=1
timeout 240 python3 tests/kernels/bench_sparse_mla.py run "$@" 2>&1 | tee "$out/bench.log" || rc=1
exit $rc
