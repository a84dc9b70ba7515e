#!/usr/bin/env bash
# One call on the lent GPU for programmatic dependent launch (issue #23): install, the PDL race test, the decode
# step with fusekit's kernels with and without PDL under Inductor's PDL off and on (benchmarks/probes/pdl_step.py,
# one process per Inductor setting), then the decode GPU tests while time is left. Logs under $OUT.
# Env: BATCHES (default 32,1), POSITION (1024), ROUNDS (3), DEADLINE (s, default 560).
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
left() { echo $(( ${DEADLINE:-560} - $(date +%s) + T0 )); }
python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py -k pdl > "$OUT/pytest_pdl.log" 2>&1
echo "PDL race tests: $(tail -1 "$OUT/pytest_pdl.log")" | tee -a "$OUT/gpu.txt"
for ip in 0 1; do
  TORCHINDUCTOR_ENABLE_PDL=$ip timeout $(( $(left) - 20 )) python3 benchmarks/probes/pdl_step.py --batches "${BATCHES:-32,1}" \
    --position "${POSITION:-1024}" --rounds "${ROUNDS:-3}" 2>&1 | grep -v -i warn > "$OUT/pdl_inductor$ip.txt"
  grep -E "^\||^b[0-9]+:|Error|assert" "$OUT/pdl_inductor$ip.txt" | grep -v "^|---" | tail -12
done
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py tests/test_kernels_gpu.py -k "decode" \
    > "$OUT/pytest_decode.log" 2>&1
  echo "decode GPU tests: $(tail -1 "$OUT/pytest_decode.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_decode.log" | head -10
fi
echo "== summary ($(( $(date +%s) - T0 )) s) =="; cat "$OUT/gpu.txt"
for ip in 0 1; do grep -E "^\|" "$OUT/pdl_inductor$ip.txt" | { [ $ip = 0 ] && cat || grep -v "batch\|---"; }; done
