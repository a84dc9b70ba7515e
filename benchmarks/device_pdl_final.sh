#!/usr/bin/env bash
# One call on the lent GPU after a kernel change: install, build, the whole GPU suite, compute-sanitizer memcheck
# over the PDL race tests, then `fusekit bench --phase decode` (MODELS, BATCHES, POSITIONS) while time is left.
# Logs under $OUT; the summary last. Env: DEADLINE (s, default 585).
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
left() { echo $(( ${DEADLINE:-585} - $(date +%s) + T0 )); }
/usr/bin/time -f "build wall %e s" python3 -m fusion_backend.build --arch 9.0a > "$OUT/build.log" 2>&1; tail -1 "$OUT/build.log" | tee -a "$OUT/gpu.txt"
timeout $(( $(left) - 200 )) python3 -m pytest tests -q -m "gpu and not packaging" -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "GPU suite: $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/gpu.txt"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -10
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_decode_gpu.py \
  -k "pdl or repeatable" > "$OUT/memcheck.log" 2>&1
echo "memcheck (PDL race + replay tests) exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1) $(tail -1 "$OUT/memcheck.log")" | tee -a "$OUT/gpu.txt"
timeout $(( $(left) - 5 )) fusekit bench --phase decode --models "${MODELS:-llama}" --batches "${BATCHES:-1,32}" \
  --positions "${POSITIONS:-1024}" --no-generate --out "$OUT/decode" 2>&1 | grep -v -i warn > "$OUT/decode.log"
echo "== summary ($(( $(date +%s) - T0 )) s) =="; cat "$OUT/gpu.txt"; [ -f "$OUT/decode/decode.md" ] && grep "^|" "$OUT/decode/decode.md"
