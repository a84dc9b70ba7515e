set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
left() { echo $(( ${DEADLINE:-580} - $(date +%s) + T0 )); }
timeout 200 python3 benchmarks/probes/decode_gemm_step.py --no-previous --batches 32,1 --inductor combo_kernels=0 2>&1 | grep -v -i warn > "$OUT/step.log"; grep "max |\|^|" "$OUT/step.log"; grep -i "Traceback" -A5 "$OUT/step.log" | head
echo "t=$(( $(date +%s) - T0 ))"
timeout 170 python3 benchmarks/bench_compile.py --models llama --phases decode --modes reduce-overhead --batches 32,1 --rounds 3 --out "$OUT/compile" 2>&1 | grep -v -i warn > "$OUT/compile.log"; grep "^|" "$OUT/compile.log" | tail -3
echo "t=$(( $(date +%s) - T0 ))"
timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1; echo "decode GPU tests: $(tail -1 "$OUT/pytest_decode.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_decode.log" | head
echo "t=$(( $(date +%s) - T0 ))"
