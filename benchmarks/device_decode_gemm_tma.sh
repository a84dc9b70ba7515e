#!/usr/bin/env bash
# One call on the lent GPU for the TMA decode GEMM kernel (csrc/decode_gemm/decode_linear_tma.cuh): install, the
# decode GEMM kernel tests (every kernel and K split, the TMA kernel's own), the ops alone against cuBLAS
# (benchmarks/probes/decode_gemm_op.py: the previous kernels, the selection, tmaearly), the Llama-style step with every
# previous selection against the current one (benchmarks/probes/decode_gemm_step.py), memcheck over the TMA tests.
# Also "dtests" (tests/test_decode_gpu.py), "suite" (the GPU suite but test_decode_gpu.py), "compile" (bench_compile.py), "bench" (fusekit bench --phase
# decode, Llama-style @1024, BENCH_BATCHES). Env: PHASES (default "tests op step san"), ROWS, LINEARS, BATCHES, VARIANTS, STEP_VARIANTS, STEP_ARGS (more
# decode_gemm_step.py arguments, e.g. "--no-previous --inductor combo_kernels=0"), SAN_FILE, SAN_K, DEADLINE (s). Logs under $OUT.
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
PHASES=${PHASES:-tests op step san}
VARIANTS=${VARIANTS:-old,default,tmaearly}
left() { echo $(( ${DEADLINE:-570} - $(date +%s) + T0 )); }
if [[ " $PHASES " == *" tests "* ]]; then
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "${TESTS_K:-decode_gemm or decode_linear or decode_qkv or tma}" > "$OUT/pytest_kernels.log" 2>&1
  echo "decode GEMM kernel tests: $(tail -1 "$OUT/pytest_kernels.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest_kernels.log" | head -20
fi
if [[ " $PHASES " == *" dtests "* ]]; then  # the decode GPU tests (attention, rules in compiled steps, caches)
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py > "$OUT/pytest_decode.log" 2>&1
  echo "decode GPU tests: $(tail -1 "$OUT/pytest_decode.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_decode.log" | head -20
fi
if [[ " $PHASES " == *" suite "* ]]; then  # the rest of the GPU suite
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests -m "gpu and not packaging" --deselect tests/test_decode_gpu.py \
    > "$OUT/pytest_suite.log" 2>&1
  echo "rest of the GPU suite: $(tail -1 "$OUT/pytest_suite.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_suite.log" | head -20
fi
if [[ " $PHASES " == *" op "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_op.py --models llama --rounds 2 --rows "${ROWS:-8,32,64}" \
    --variants "$VARIANTS" --linears "${LINEARS:-q+k+v,o,gate+up,down,lm_head}" 2>&1 | grep -v -i warn | tee "$OUT/op.md" \
    | grep "^|" | tail -30
fi
if [[ " $PHASES " == *" step "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_step.py --batches "${BATCHES:-32,8,1}" --variants "${STEP_VARIANTS:-}" ${STEP_ARGS:-} \
    2>&1 | grep -v -i warn > "$OUT/step.log"
  grep "max |logits\|^|" "$OUT/step.log" | tail -20
  grep -i "error\|Traceback" "$OUT/step.log" | head -5
fi
if [[ " $PHASES " == *" bench "* ]]; then
  timeout "$(left)" fusekit bench --phase decode --models llama --batches "${BENCH_BATCHES:-1,32}" --positions 1024 \
    --no-generate --out "$OUT/decode" 2>&1 | grep -v -i warn > "$OUT/decode.log"
  grep "^|" "$OUT/decode/decode.md" | head -12
fi
if [[ " $PHASES " == *" compile "* ]]; then  # first-call compile times, medians of 3, Inductor and fusekit alternating
  timeout "$(left)" python3 benchmarks/bench_compile.py --models llama --phases decode --modes reduce-overhead \
    --batches 32,1 --rounds 3 --out "$OUT/compile" 2>&1 | grep -v -i warn > "$OUT/compile.log"
  grep "^|" "$OUT/compile.log" | tail -6
fi
if [[ " $PHASES " == *" san "* ]] && command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 60 ]; then
  timeout "$(left)" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    "${SAN_FILE:-tests/test_kernels_gpu.py}" -k "${SAN_K:-rows_splits and dtype1 and (tma3 or tma8 or tma002 or tmaearly)}" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY: [1-9]" "$OUT/memcheck.log") error lines): $(tail -1 "$OUT/memcheck.log")" | tee -a "$OUT/gpu.txt"
fi
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "== summary =="; cat "$OUT/gpu.txt"
