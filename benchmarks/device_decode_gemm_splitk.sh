#!/usr/bin/env bash
# One call on the lent GPU for the split-K decode GEMM kernel (csrc/decode_gemm/decode_linear_splitk.cuh):
# install, the decode GEMM kernel tests (every kernel and K split), memcheck over the split tests, the ops alone
# against cuBLAS (old kernel vs split-K, benchmarks/probes/decode_gemm_op.py), then decode steps with the
# previous selection and kernel (old: FUSEKIT_DECODE_GEMM=old, q/k/v <= 32 rows) and the current one. Env: PHASES (default "tests san op steps"), ROWS, LINEARS, MODELS, BATCHES,
# POSITIONS, DEADLINE (s). Logs under $OUT.
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
PHASES=${PHASES:-tests san op steps}
left() { echo $(( ${DEADLINE:-570} - $(date +%s) + T0 )); }
if [[ " $PHASES " == *" tests "* ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py -k "decode_gemm or decode_linear or decode_qkv" \
    > "$OUT/pytest_kernels.log" 2>&1
  echo "decode GEMM kernel tests: $(tail -1 "$OUT/pytest_kernels.log")" | tee -a "$OUT/gpu.txt"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest_kernels.log" | head -20
fi
if [[ " $PHASES " == *" san "* ]] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "rows_splits and dtype1 and (splitk3 or splitk8)" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY: [1-9]" "$OUT/memcheck.log") error lines): $(tail -1 "$OUT/memcheck.log")" | tee -a "$OUT/gpu.txt"
fi
if [[ " $PHASES " == *" op "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_op.py --rows "${ROWS:-1,8,16,32,64}" --variants old,splitk \
    --linears "${LINEARS:-q+k+v,o,gate+up,down,lm_head}" 2>&1 | grep -v -i warn | tee "$OUT/op.md" | grep "^|" | tail -60
fi
if [[ " $PHASES " == *" steps "* ]]; then
  for sel in old new; do
    [ "$(left)" -lt 60 ] && break
    cp patterns/decode_gemm.py /tmp/decode_gemm.py.new
    if [ $sel = old ]; then
      sed -i 's/^MAX_ROWS = .*/MAX_ROWS = {"gate_up_silu": 8, "qkv": 32, "linear": 32}/' patterns/decode_gemm.py
      export FUSEKIT_DECODE_GEMM=old
    else
      unset FUSEKIT_DECODE_GEMM
    fi
    timeout "$(left)" fusekit bench --phase decode --models "${MODELS:-llama}" --batches "${BATCHES:-1,32}" \
      --positions "${POSITIONS:-1024}" --no-generate --out "$OUT/decode_$sel" 2>&1 | grep -v -i warn > "$OUT/decode_$sel.log"
    cp /tmp/decode_gemm.py.new patterns/decode_gemm.py
    echo "== steps, selection $sel"; grep "^|" "$OUT/decode_$sel/decode.md" | head -12
  done
fi
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "== summary =="; cat "$OUT/gpu.txt"
