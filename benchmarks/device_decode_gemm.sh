#!/usr/bin/env bash
# One call on the lent GPU for the decode GEMMs: install (builds the kernels; CUTLASS=1 carries .whl for the
# matmul kernels, else they are left out), the decode_linear GPU tests (plain and under compute-sanitizer
# memcheck), benchmarks/bench_decode_gemm.py, then optionally the decode-step bench. Logs under $OUT.
# Env: ROWS (bench rows, default 1,8,32), GEMM_MODELS, LINEARS (bench only these), DECODE_MODELS
# (none: no step bench), BATCHES, POSITIONS, DEADLINE (s), PROFILE (batch:position ...) of PROFILE_MODEL, SAN (0: no memcheck).
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh  # $OUT, environment, carried cache, versions, install
fusekit doctor 2>&1 | grep -E "kernels|decode" | tee -a "$OUT/gpu.txt"  # (builds the kernels where not cached)
[ -f .fkc/fkc.tgz ] || (cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py -k "decode_gemm or decode_linear or decode_qkv" > "$OUT/pytest_gemm.log" 2>&1
echo "decode_gemm GPU tests: $(tail -1 "$OUT/pytest_gemm.log")" | tee -a "$OUT/gpu.txt"
grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest_gemm.log" | head -20
if [ "${SAN:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "(decode_gemm and shaped) or decode_qkv" > "$OUT/memcheck_gemm.log" 2>&1
  echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY: [1-9]" "$OUT/memcheck_gemm.log") error lines): $(tail -1 "$OUT/memcheck_gemm.log")" | tee -a "$OUT/gpu.txt"
fi
timeout $(( ${DEADLINE:-570} - $(date +%s) + T0 )) python3 benchmarks/bench_decode_gemm.py --out "$OUT/gemm" \
  --rows "${ROWS:-1,8,32}" --models "${GEMM_MODELS:-llama,qwen2}" ${LINEARS:+--linears $LINEARS} > "$OUT/gemm.log" 2>&1
grep -E "rows=|copy" "$OUT/gemm.log" | tail -70
if [ "${DECODE_MODELS:-none}" != none ]; then
  timeout $(( ${DEADLINE:-570} - $(date +%s) + T0 )) fusekit bench --phase decode --models "$DECODE_MODELS" ${BATCHES:+--batches $BATCHES} \
    ${POSITIONS:+--positions $POSITIONS} --no-generate --out "$OUT/decode" 2>&1 | grep -v -i warn > "$OUT/decode.log"
  grep -E "^\[|^  " "$OUT/decode.log" | tail -30
fi
for bp in ${PROFILE:-}; do
  python3 benchmarks/profile_decode_step.py --model "${PROFILE_MODEL:-llama}" --batch "${bp%%:*}" --position "${bp##*:}" > "$OUT/profile_b${bp%%:*}_p${bp##*:}.txt" 2>&1
  grep -E "^== |us/step|alone" "$OUT/profile_b${bp%%:*}_p${bp##*:}.txt"
done
echo "== summary =="; cat "$OUT/gpu.txt"; [ -f "$OUT/decode/decode.md" ] && grep "^|" "$OUT/decode/decode.md"
