#!/usr/bin/env bash
# One call on the lent GPU for the decode issue: install (builds the kernels), the decode kernel's GPU tests
# under compute-sanitizer memcheck and plain, then `fusekit bench --phase decode`. Logs under $OUT.
# Env: MODELS (default llama), BATCHES, POSITIONS, GEN (1: also generate), TESTS (0: skip), SAN (1: memcheck),
# DEADLINE (s, the bench stops there), GEN_CACHE (generate's cache sizes), PROFILE (batch:position ...), KTESTS (extra pytest args for tests/test_kernels_gpu.py -k), CUTLASS (1: carry .whl for the matmul kernels).
set -uo pipefail
T0=$(date +%s)  # the bench gets what is left of DEADLINE (s) after install and tests
. benchmarks/device_setup.sh  # $OUT, environment, carried cache, versions, install
fusekit doctor 2>&1 | grep -E "kernels|decode" | tee -a "$OUT/gpu.txt"  # (builds the kernels where not cached)
[ -f .fkc/fkc.tgz ] || (cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1
  echo "decode GPU tests: $(tail -1 "$OUT/pytest_decode.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_decode.log" | head -20
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py -k "${KTESTS:-decode}" > "$OUT/pytest_kernels.log" 2>&1
  echo "kernel GPU tests (-k ${KTESTS:-decode}): $(tail -1 "$OUT/pytest_kernels.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_kernels.log" | head -20
fi
if [ "${MODELS:-llama}" != none ]; then
  timeout $(( ${DEADLINE:-570} - $(date +%s) + T0 )) fusekit bench --phase decode --models "${MODELS:-llama}" ${BATCHES:+--batches $BATCHES} \
    ${POSITIONS:+--positions $POSITIONS} $([ "${GEN:-0}" = 1 ] && echo --generate || echo --no-generate) ${GEN_CACHE:+--gen-cache $GEN_CACHE} \
    --out "$OUT/decode" 2>&1 | grep -v -i warn > "$OUT/decode.log"
  grep -E "^\[|^  " "$OUT/decode.log" | tail -40
fi
if [ "${SAN:-${TESTS:-1}}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py \
    -k "hidden_by_a_finite or (masks_against and fp16 and causal) or repeatable" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY: [1-9]" "$OUT/memcheck.log") error lines): $(tail -1 "$OUT/memcheck.log")" | tee -a "$OUT/gpu.txt"
fi
# PROFILE="32:1024 1:4000": the kernel table of one step per batch:position (benchmarks/profile_decode_step.py)
for bp in ${PROFILE:-}; do
  python3 benchmarks/profile_decode_step.py --batch "${bp%%:*}" --position "${bp##*:}" > "$OUT/profile_b${bp%%:*}_p${bp##*:}.txt" 2>&1
  grep -E "^== |us/step|alone" "$OUT/profile_b${bp%%:*}_p${bp##*:}.txt"
done
echo "== summary =="; cat "$OUT/gpu.txt"; [ -f "$OUT/decode/decode.md" ] && grep "^|" "$OUT/decode/decode.md"
