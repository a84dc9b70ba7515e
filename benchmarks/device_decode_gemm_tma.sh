#!/usr/bin/env bash
# One call on the lent GPU for the TMA decode GEMM kernel (csrc/decode_gemm/decode_linear_tma.cuh): install, the
# decode GEMM kernel tests (every kernel and K split, the TMA kernel's own), the ops alone against cuBLAS
# (benchmarks/probes/decode_gemm_op.py: the shipped selection, tma, tmalate), the Llama-style step with every
# decode linear on a fusekit kernel (benchmarks/probes/decode_gemm_step.py), memcheck over the TMA tests.
# Env: PHASES (default "tests op step san"), ROWS, LINEARS, BATCHES, VARIANTS, DEADLINE (s). Logs under $OUT.
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
PHASES=${PHASES:-tests op step san}
VARIANTS=${VARIANTS:-default,tma,tmalate}
left() { echo $(( ${DEADLINE:-570} - $(date +%s) + T0 )); }
if [[ " $PHASES " == *" tests "* ]]; then
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "${TESTS_K:-tma or decode_qkv_parts or decode_linear_row}" > "$OUT/pytest_kernels.log" 2>&1
  echo "decode GEMM kernel tests: $(tail -1 "$OUT/pytest_kernels.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest_kernels.log" | head -20
fi
if [[ " $PHASES " == *" op "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_op.py --models llama --rounds 2 --rows "${ROWS:-8,32,64}" \
    --variants "$VARIANTS" --linears "${LINEARS:-q+k+v,o,gate+up,down,lm_head}" 2>&1 | grep -v -i warn | tee "$OUT/op.md" \
    | grep "^|" | tail -30
fi
if [[ " $PHASES " == *" step "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_step.py --batches "${BATCHES:-32,8}" --variants "$VARIANTS" \
    2>&1 | grep -v -i warn > "$OUT/step.log"
  grep "max |logits\|^|" "$OUT/step.log" | tail -20
  grep -i "error\|Traceback" "$OUT/step.log" | head -5
fi
if [[ " $PHASES " == *" san "* ]] && command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 60 ]; then
  timeout "$(left)" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels_gpu.py -k "rows_splits and dtype1 and (tma3 or tma8 or tmalate)" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY: [1-9]" "$OUT/memcheck.log") error lines): $(tail -1 "$OUT/memcheck.log")" | tee -a "$OUT/gpu.txt"
fi
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "== summary =="; cat "$OUT/gpu.txt"
