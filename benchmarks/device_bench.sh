#!/usr/bin/env bash
# One call on the lent GPU: install, build, GPU kernel tests, compute-sanitizer, then the pattern benchmark.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUSEKIT_CACHE=/tmp/fusekit_cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
/usr/bin/time -f "build wall %e s" python3 -m fusion_backend.build 2>&1 | tail -2
python3 -m pytest tests/test_kernels_gpu.py tests/test_ops.py -q -p no:cacheprovider -x 2>&1 | tee "$OUT/pytest_gpu.log" | tail -4
timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest tests/test_kernels_gpu.py -q \
  -p no:cacheprovider -k "not compiled and not reduce_overhead" > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"
python3 benchmarks/bench_patterns.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -v -i warn | tee "$OUT/bench.log" | tail -20
