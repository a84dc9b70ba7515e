#!/usr/bin/env bash
# One call on the lent GPU for the compile-time issue: the README's GPU install (which builds the kernels),
# a first compile on that fresh machine (no kernel build may happen in it), then bench_compile.py.
# Optional: OLD=<dir holding an older fusion_backend/> compares the match reports of the bench models.
# Carries: .whl (the nvidia-cutlass wheel: the device has no network). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/install.log" 2>&1
START=$(date +%s)
python3 -m pip install -v --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
echo "install (kernels built in it): $(( $(date +%s) - START )) s; $(grep -E '^ *fusekit:' "$OUT/install.log" | tail -2 | tr '\n' ' ')" | tee -a "$OUT/gpu.txt"
fusekit doctor 2>&1 | sed -n 1,8p | tee -a "$OUT/gpu.txt"
if [ -n "${FIRST:-}" ]; then  # the first compile after the install (COLD=1: with an emptied pattern cache)
  python3 benchmarks/bench_compile.py --models "$FIRST" --phases prefill --modes default ${COLD:+--cold-patterns} \
    --out "$OUT/first" 2>&1 | grep -v -i warn | tee "$OUT/first.log" | grep -E "^  |building"
  grep -q "building CUDA kernels" "$OUT/first.log" && echo "FIRST COMPILE BUILT KERNELS" || echo "first compile: no kernel build"
fi
[ -n "${WARM:-}" ] && /usr/bin/time -f "python -m fusion_backend.build (patterns): %e s" python3 -m fusion_backend.build 2>&1 | tail -2
[ -n "${MODELS:-}" ] && python3 benchmarks/bench_compile.py --models "$MODELS" --phases "${PHASES:-prefill,decode}" \
  --modes "${MODES:-default,reduce-overhead}" --out "$OUT" 2>&1 | grep -v -i warn > "$OUT/compile.log"
if [ -n "${OLD:-}" ]; then
  python3 benchmarks/probes/match_reports.py "$OUT/reports_new.json" "$REPORTS" 2>&1 | grep -v -i warn | tail -6
  PYTHONPATH=$OLD python3 benchmarks/probes/match_reports.py "$OUT/reports_old.json" "$REPORTS" 2>&1 | grep -v -i warn | tail -6
  cmp -s "$OUT/reports_old.json" "$OUT/reports_new.json" && echo "match reports: identical" || echo "MATCH REPORTS DIFFER"
fi
[ -n "${TESTS:-}" ] && python3 -m pytest $TESTS -m "not packaging" -q -p no:cacheprovider -x 2>&1 | tee "$OUT/pytest.log" | tail -4
echo "== summary =="; cat "$OUT/gpu.txt"; [ -f "$OUT/compile.md" ] && grep "^|" "$OUT/compile.md"
