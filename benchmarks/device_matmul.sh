#!/usr/bin/env bash
# One call on the lent GPU for the batched-matmul issue: CUTLASS headers from a carried nvidia-cutlass wheel
# (.whl/), build, a direct-op smoke test, bench_matmul, then the matmul GPU tests (+ memcheck). Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUSEKIT_CACHE=/tmp/fusekit_cache MAX_JOBS=16
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cutlass-*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }
python3 -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__)" | tee /tmp/gpu.txt
t0=$(date +%s); python3 -m fusion_backend.build > /tmp/build.log 2>&1; echo "build rc $? in $(( $(date +%s) - t0 )) s"; tail -3 /tmp/build.log
python3 - <<'PY' 2>&1
import torch, fusion_backend
from fusion_backend import _ext
print(_ext.load_for_device())
a = torch.randn(4, 136, 64, device="cuda", dtype=torch.half); b = torch.randn(4, 64, 136, device="cuda", dtype=torch.half) / 8
bias = torch.randn(136, device="cuda", dtype=torch.half)
out = torch.ops.fusekit.matmul_epilogue(a, b, bias, None, 0.5, "gelu", False)
ref = torch.nn.functional.gelu((a.double() @ b.double()) * 0.5 + bias.double())
print("smoke max err", (out.double() - ref).abs().max().item())
PY
[ "${BENCH:-1}" = 1 ] && timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_matmul.py --out "$OUT" 2>&1 | grep -v Warn > "$OUT/bench_matmul.log"; tail -4 "$OUT/bench_matmul.log" | head -2
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/test_kernels_gpu.py tests/test_ops.py -k "${TEST_K:-matmul}" -v -p no:cacheprovider -x > "$OUT/pytest.log" 2>&1
  grep -oE " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/pytest.log" | sort | uniq -c; grep -E "^FAILED|Fatal Python|^tests/.*(FAILED|ERROR)|File .*tests/test_" "$OUT/pytest.log" | head -8; tail -3 "$OUT/pytest.log"
  [ -n "${MEMCHECK:-}" ] && { timeout 120 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest tests/test_kernels_gpu.py -q \
    -p no:cacheprovider -k "matmul and (shaped or layouts)" > "$OUT/memcheck.log" 2>&1; echo "memcheck: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"; }
fi
if [ -n "${E2E:-}" ]; then
  timeout 240 fusekit bench --models "$E2E" --out /tmp/e2e 2>&1 | grep -v -i warn > "$OUT/e2e.log"; grep "^|" /tmp/e2e/bench.md
fi
echo "== summary =="; cat /tmp/gpu.txt; grep "^|" "$OUT/matmul.md" 2>/dev/null; true
