#!/usr/bin/env bash
# ncu on a few cells of the split kernel (GPU machine): time, DRAM, shared-memory
# and tensor-pipe use, bank conflicts and stall reasons per issued instruction.
# Usage (repo root): bash bench/kernels/ncu_cells.sh "HEADS TOKENS CONFIG" ...
# CONFIG as profile_sparse_mla.py's --config (block_h,block_n,warps,stages,ahead,per_sm,gluon).
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
for cell in "$@"; do
  read -r heads tokens config <<<"$cell"
  echo "== heads $heads tokens $tokens config $config" | tee -a "$out/ncu.txt"
  ncu --clock-control none -k regex:_sparse_mla_split -c 1 -s 2 --metrics "$metrics" \
    python3 bench/kernels/profile_sparse_mla.py --heads "$heads" --tokens "$tokens" \
    --config "$config" >>"$out/ncu.txt" 2>&1
  # Non-zero stalls and the headline metrics of this cell.
  sed -n '/== heads '"$heads"' tokens '"$tokens"' config '"$config"'/,$p' "$out/ncu.txt" |
    grep -E "duration|throughput|wavefronts|conflicts|inst_executed|issue_active|pipe_tensor|stalled" |
    grep -vE "\s0(\.00)?$" | sed -E 's/ +/ /g'
done
