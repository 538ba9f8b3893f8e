#!/usr/bin/env bash
# ncu on a few cells (GPU machine): time, DRAM, L2 hits, shared-memory and
# tensor-pipe use, bank conflicts and stall reasons per issued instruction, for
# every kernel of one launch (ours: split, and merge where split-K is used).
# With NCU_SOURCE=1 each cell is also recorded with per-instruction stall sampling
# ($out/<cell>.ncu-rep, its SASS page as CSV, and the top instructions by stall samples
# from ncu_source_top.py), to see where a tile's time goes inside the loop.
# Usage (repo root): bash bench/kernels/ncu_cells.sh "HEADS TOKENS [CONFIG]" ...
# CONFIG as profile_sparse_mla.py's --config (block_h,block_n,warps,stages,ahead,per_sm,gluon),
# or "flashmla" for FlashMLA's sparse kernel on the same cell, or "sm120" for the SM120
# stand-in's launch-time choice, or "sm120:VARIANT" for one of its sweep variants;
# none: this GPU's launch-time choice.
set -uo pipefail
out="${OUT:-.bench-out}"
mkdir -p "$out"
command -v ncu >/dev/null || { echo "ncu not found"; exit 0; }
metrics="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"
metrics+=",l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
metrics+=",sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
metrics+=",regex:sm__pipe_tensor_op_.*cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
metrics+=",lts__t_sector_hit_rate.pct,dram__bytes_read.sum"
for cell in "$@"; do
  read -r heads tokens config <<<"$cell"
  args=(--heads "$heads" --tokens "$tokens")
  case "${config:-}" in
    "") ;;
    flashmla) args+=(--peer flashmla) ;;
    sm120) args+=(--sm120) ;;
    sm120:*) args+=(--sm120 --variant "${config#sm120:}") ;;
    *) args+=(--config "$config") ;;
  esac
  echo "== heads $heads tokens $tokens config ${config:-launch-time}" | tee -a "$out/ncu.txt"
  # The profiled launch is the third, inside the NVTX range "profile".
  ncu --clock-control none --nvtx --nvtx-include "profile/" --metrics "$metrics" \
    python3 bench/kernels/profile_sparse_mla.py "${args[@]}" >"$out/ncu.cell.txt" 2>&1
  cat "$out/ncu.cell.txt" >>"$out/ncu.txt"
  # Kernel names, and the non-zero headline metrics and stalls of this cell.
  grep -E "Context [0-9]|==ERROR==|Error" "$out/ncu.cell.txt" | cut -c1-120
  grep -E "duration|throughput|bytes_read|hit_rate|wavefronts|conflicts|inst_executed|issue_active|pipe_tensor|stalled" \
    "$out/ncu.cell.txt" | grep -vE "\s0(\.00)?$" | sed -E 's/ +/ /g'
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    tag=${config:-auto}
    rep="$out/ncu_${heads}x${tokens}_${tag//[:,]/_}"
    ncu --clock-control none --nvtx --nvtx-include "profile/" --import-source no \
      --section SourceCounters --section WarpStateStats -f -o "$rep" \
      python3 bench/kernels/profile_sparse_mla.py "${args[@]}" >"$rep.log" 2>&1
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>&1
    python3 bench/kernels/ncu_source_top.py "$rep.sass.csv" | tee -a "$out/ncu.txt"
  fi
done
