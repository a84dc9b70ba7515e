# Sourced by the device_*.sh scripts of the decode work: $OUT, the environment, the carried kernel/pattern
# cache (an earlier call's $OUT/fkc.tgz, carried back as .fkc/: skips the build), the versions into
# $OUT/gpu.txt, the CUTLASS wheel (CUTLASS=1) and the editable install (builds the kernels).
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} FUSEKIT_CACHE=${FUSEKIT_CACHE:-/tmp/fkc}
[ -f .fkc/fkc.tgz ] && mkdir -p "$FUSEKIT_CACHE" && tar xzf .fkc/fkc.tgz -C "$FUSEKIT_CACHE"
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/gpu.txt"
[ "${CUTLASS:-0}" = 1 ] && python3 -m pip install -q --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/install.log" 2>&1
if ! command -v fusekit >/dev/null; then
  START=$(date +%s)
  python3 -m pip install -v --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
  echo "install: $(( $(date +%s) - START )) s" | tee -a "$OUT/gpu.txt"
fi
