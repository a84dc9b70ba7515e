#!/usr/bin/env bash
# One call on a fresh GPU machine for the install issue: the README's GPU install (CUTLASS headers from the
# carried wheel, as pip would fetch them, then `pip install --no-build-isolation -e .`, which builds every
# kernel), `fusekit doctor`, and the GPU tests (-m gpu). Leaves the machine installed for the calls after it;
# saves the kernel/pattern cache as $OUT/fkc.tgz. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} FUSEKIT_CACHE=${FUSEKIT_CACHE:-/tmp/fkc}
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
START=$(date +%s)
python3 -m pip install -v --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
echo "install (every kernel built, patterns traced): $(( $(date +%s) - START )) s" | tee -a "$OUT/gpu.txt"
grep -E "fusekit: (built|patterns)" "$OUT/install.log" | tee -a "$OUT/gpu.txt"
fusekit doctor > "$OUT/doctor.txt" 2>&1; cat "$OUT/doctor.txt"
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
if [ "${TEST_S:-240}" != 0 ]; then  # TEST_S=0: no tests here (the suite takes more than one call's rest)
  timeout "${TEST_S:-240}" python3 -m pytest tests -v --tb=short -m "gpu and not packaging" -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
  echo "GPU tests (-m gpu): $(tail -1 "$OUT/pytest_gpu.log")" | tee -a "$OUT/gpu.txt"
  grep -E " (FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -20  # -v: each test named as it ends, even if the call is cut
fi
echo "== summary =="; cat "$OUT/gpu.txt"
