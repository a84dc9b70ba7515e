#!/usr/bin/env bash
# One call on the lent GPU: install, build the kernels (timed, outside any benchmark), run the whole test
# suite on the GPU, compute-sanitizer memcheck over the kernel tests, and the GPT-2 smoke run.
# Logs go to $OUT; the summary is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUSEKIT_CACHE=/tmp/fusekit_cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
/usr/bin/time -f "build wall %e s" python3 -m fusion_backend.build 2>&1 | tee "$OUT/build.log"
python3 -m pytest tests -q -m "not packaging" -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -15
timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest tests/test_kernels_gpu.py -q \
  -p no:cacheprovider -k "not compiled and not reduce_overhead" > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"
python3 benchmarks/gpt2_smoke.py --json "$OUT/gpt2_smoke.json" 2>&1 | grep -v Warning | tee "$OUT/gpt2_smoke.log" | tail -30
echo "== summary =="; cat "$OUT/gpu.txt"; grep -E "build wall" "$OUT/build.log"; tail -1 "$OUT/pytest.log"
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1; tail -3 "$OUT/gpt2_smoke.log"
