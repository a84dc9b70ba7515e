#!/usr/bin/env bash
# One call on the lent GPU for the attention + end-to-end issues: build, attention GPU tests (+ memcheck),
# the attention micro-benchmark, and `fusekit bench` on the models named in $MODELS. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUSEKIT_CACHE=/tmp/fusekit_cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/gpu.txt"
python3 -m fusion_backend.build 2>&1 | tail -1
if [ -n "${TESTS:-}" ]; then
  python3 -m pytest $TESTS -m "not packaging" -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -4
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest tests/test_kernels_gpu.py -q \
    -p no:cacheprovider -k "attention and not compiled" > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"
fi
[ -n "${ATTN:-}" ] && python3 benchmarks/bench_attention.py --out "$OUT" 2>&1 | grep -v Warn > "$OUT/bench_attention.log"
[ -n "${MODELS:-}" ] && fusekit bench --models "$MODELS" --out "$OUT" 2>&1 | grep -v -i "warn" | tee "$OUT/e2e.log" | grep -E "^\[|^  " 
[ -n "${PROFILE:-}" ] && fusekit profile --model "$PROFILE" --out "$OUT" 2>&1 | grep -v -i "warn\|USDT" > "$OUT/profile.log"
echo "== summary =="; cat "$OUT/gpu.txt"; [ -n "${ATTN:-}" ] && grep "^|" "$OUT/attention.md"; [ -f "$OUT/bench.md" ] && grep "^|" "$OUT/bench.md"; true
