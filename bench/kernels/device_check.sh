#!/usr/bin/env bash
# One call on the GPU machine: `make test-kernels` (every test, then the correctness
# tests again as the SM120 stand-in; a gpu test that skips fails), then the benchmark
# table (BENCH_TARGET=bench-kernels-sm120: the stand-in's table). The benchmark compiles its builds in
# parallel while the tests run and starts timing only once they have finished.
# Usage (repo root): bash bench/kernels/device_check.sh [bench args...]
# Logs go to $OUT when set (the device tool), else to ./.bench-out.
set -uo pipefail
out="${OUT:-.bench-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
xdist=""
python3 -c 'import xdist' 2>/dev/null && xdist="-n ${TEST_JOBS:-6}"
done_flag="$(mktemp -u)"
(
  if command -v make >/dev/null; then
    timeout "${TEST_TIMEOUT:-300}" make test-kernels PYTHON=python3 PYTEST_ARGS="$xdist -rfEs"
  else  # the same command as the Makefile's
    # shellcheck disable=SC2086  # $xdist is empty or two words
    timeout "${TEST_TIMEOUT:-300}" bash -c "python3 -m pytest -q -p no:cacheprovider $xdist -rfEs \
      tests/kernels tests/backend/test_backend_kernel_call.py && SPARSE_MLA_STANDIN=sm120 \
      python3 -m pytest -q -p no:cacheprovider -m 'not sm90' $xdist -rfEs \
      tests/kernels/test_sparse_mla.py tests/backend/test_backend_kernel_call.py"
  fi >"$out/pytest.log" 2>&1
  echo "pytest rc=$?" >>"$out/pytest.log"
  touch "$done_flag"
) &
tests=$!
bench_args="--wait-for $done_flag $*"
if command -v make >/dev/null; then
  timeout "${BENCH_TIMEOUT:-420}" make "${BENCH_TARGET:-bench-kernels}" PYTHON=python3 \
    BENCH_ARGS="$bench_args"
else  # the same commands as the Makefile's
  [ "${BENCH_TARGET:-}" = bench-kernels-sm120 ] &&
    bench_args="--sm120 --fp8 --backend --heads 8 16 32 $bench_args"
  # shellcheck disable=SC2086  # $bench_args is a list of words
  timeout "${BENCH_TIMEOUT:-420}" python3 bench/kernels/bench_sparse_mla.py run $bench_args
fi >"$out/bench.log" 2>&1
bench_rc=$?
wait "$tests"
tail -n 25 "$out/pytest.log"
grep -E "^(device|ceilings|peers|prewarmed)|FAIL|Error|error:" "$out/bench.log" | head -40
sed -n '/^sparse MLA, topk/,$p' "$out/bench.log"
rc=0
grep -q "pytest rc=0" "$out/pytest.log" || rc=1
[ "$bench_rc" -eq 0 ] || { echo "bench rc=$bench_rc"; rc=1; }
exit $rc
