#!/usr/bin/env bash
# One call on the lent GPU: Nsight Compute metrics of decode_attention's kernels (benchmarks/probes/
# decode_attention_ncu.py). The kernel table of a whole step: PROFILE=... MODELS=none TESTS=0 device_decode.sh.
set -uo pipefail
. benchmarks/device_setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,\
launch__occupancy_limit_shared_mem,launch__grid_size,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__t_bytes.sum,lts__t_bytes.sum
if [ -n "$NCU" ]; then
  "$NCU" --csv --page raw --metrics "$M" -k regex:"decode_attention_kernel|combine_splits" \
    python3 benchmarks/probes/decode_attention_ncu.py > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
keys = [k for k in rows[0] if "__" in k] if rows else []
for r in rows[1:]:  # row 0: units
    kn = "main" if "decode_attention_kernel" in r["Kernel Name"] else "combine"
    print(r["ID"], kn, " ".join(f"{k.split('.')[0].replace('smsp__average_warps_issue_stalled_','st_')}={r[k]}" for k in keys))
PY
else echo "no ncu"; fi
