#!/usr/bin/env bash
# benchmarks/device.sh: one call on a GPU machine, run from a copy of the repository (no network needed).
#
#   bash benchmarks/device.sh [PHASE ...]          # default: install tests bench
#   PHASES="install tests bench compile" bash benchmarks/device.sh
#   bash benchmarks/device.sh --help
#
# Phases (run in this order, whichever are named):
#   install    pip-install the carried wheels in .whl/ if there are any (the CUTLASS headers travel as
#              .whl/nvidia_cutlass-*.whl), then fusekit itself (editable, no deps, no build isolation);
#              restore a carried kernel/pattern cache (.fkc/fkc.tgz, or its parts .fkc/fkc.tgz.NN) into
#              $FUSEKIT_CACHE; then
#              `python3 -m fusion_backend.build` (kernels for this GPU + traced rules), timed.
#   tests      the GPU test suite: pytest tests -m "gpu and not packaging" (log: $OUT/pytest_gpu.log); TESTS_ARGS
#              replaces the arguments after pytest's -q, read as a shell line (quotes keep a -k expression whole),
#              e.g. TESTS_ARGS='tests/test_kernels_gpu.py -k "8bit or w8_rows"'
#   bench      fusekit bench --phase decode --models llama --batches 1,32 --positions 1024 --no-generate
#              (BENCH_ARGS replaces everything after --phase decode; output: $OUT/decode/). Every architecture:
#              BENCH_ARGS="--models llama,qwen2,qwen3,mistral,gemma,gemma3,phi3,olmo2,granite,stablelm,gpt_neox,falcon,mixtral
#              --batches 1,32 --positions 1024 --no-generate"
#   e2e        fusekit bench --phase prefill (whole models; $OUT/e2e/); E2E_ARGS adds arguments, read as a shell line,
#              e.g. E2E_ARGS="--models llama --modes eager,inductor,fusekit --quant fp8-rowwise"
#   patterns   benchmarks/bench_patterns.py      ($OUT/patterns/; PATTERNS_ARGS adds arguments)
#   attention  benchmarks/bench_attention.py     ($OUT/attention/)
#   matmul     benchmarks/bench_matmul.py        ($OUT/matmul/)
#   decode_gemm benchmarks/bench_decode_gemm.py  ($OUT/decode_gemm/)
#   quant      benchmarks/bench_quant_hbm.py     ($OUT/quant_hbm/)
#   prefill    benchmarks/bench_prefill_cache.py ($OUT/prefill_cache/)
#   compile    benchmarks/bench_compile.py --models llama --phases decode --modes reduce-overhead
#              --batches 32,1 --rounds 3 (COMPILE_ARGS replaces the arguments; $OUT/compile/)
#   sanitize   compute-sanitizer --tool memcheck over GPU tests that call the kernels directly (SANITIZE_ARGS
#              replaces pytest's arguments; default: the decode GEMMs' 8-bit tests; log: $OUT/sanitize.log)
#
# Every *_ARGS is read as a shell line: quotes keep an argument with spaces whole.
# Environment: PHASES (when no phase is given as an argument), OUT (default /tmp/fusekit_out; every log and
# result goes there; where that makes more than 8 files, the logs are packed into logs.tgz), FUSEKIT_CACHE
# (default /tmp/fkc), DEADLINE (seconds from the start, default 570: every
# step runs under `timeout` against it, so the summary always prints within a 600 s call), MAX_JOBS (kernel
# build jobs, default 8: 240-290 s on an H200 machine's 16 cores; one call that built with 16 stopped answering,
# 2026-12-03). Expects python3 with torch, triton and transformers installed. Without the install
# phase, fusekit must already be installed (an earlier call on the same machine).
# At the end, where this call built or traced something, the kernel/pattern cache is packed (no object files, ninja
# files or locks) into $OUT/fkc.tgz.00, .01, ... (15 MiB parts: a file over 16 MiB does not come back from the
# device tool): carry them back in .fkc/ and the next call's install skips the build (PACK=0: never pack).
# The kernels need no GPU to build: on the CPU machine, in a venv with the GPU machine's torch (the same version
# and CUDA build, e.g. torch==2.11.0, whose PyPI wheel is +cu130), ninja and the CUTLASS wheel, run
#   FUSEKIT_CACHE=/tmp/fkc python -m fusion_backend.build --arch 9.0a \
#     && mkdir -p .fkc && tar czf .fkc/fkc.tgz --exclude="*.o" --exclude="*.ninja*" --exclude=lock -C /tmp/fkc .
# and carry .fkc (the build's folder name covers torch's and CUDA's versions, the arch, the sources and the CUTLASS
# version, not where anything is installed). The summary (GPU, versions,
# build time, test result, the decode table) is printed last.
set -uo pipefail

if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi

T0=$(date +%s)
OUT=${OUT:-/tmp/fusekit_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8} FUSEKIT_CACHE=${FUSEKIT_CACHE:-/tmp/fkc}
PHASES=${*:-${PHASES:-install tests bench}}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - T0) )); }
has() { [[ " $PHASES " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$SUMMARY"; }
# args VAR DEFAULT...: ARGS = $VAR read as a shell line (quotes keep a -k "a or b" one argument), else DEFAULT...
args() { local v=$1; shift; if [ -n "${!v:-}" ]; then eval "ARGS=(${!v})"; else ARGS=("$@"); fi; }
# run_step NAME LOG CMD...: CMD under timeout against the deadline (skipped with under 20 s left)
run_step() {
  local name=$1 log=$2 t rc; shift 2
  t=$(left)
  if [ "$t" -lt 20 ]; then note "$name: skipped ($t s left before DEADLINE)"; return 124; fi
  local s=$(date +%s)
  timeout "$t" "$@" > "$log" 2>&1; rc=$?
  note "$name: exit $rc after $(( $(date +%s) - s )) s$([ $rc = 124 ] && echo ' (cut by DEADLINE)') (log: $log)"
  return $rc
}

python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device', '| torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)" \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has install; then
  if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    run_step "carried wheels ($(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' '))" "$OUT/install_wheels.log" \
      python3 -m pip install -q --no-deps .whl/*.whl
  fi
  if ls .fkc/fkc.tgz* > /dev/null 2>&1; then
    mkdir -p "$FUSEKIT_CACHE" && cat .fkc/fkc.tgz* | tar xz -C "$FUSEKIT_CACHE" \
      && note "cache restored from $(ls .fkc/fkc.tgz* | tr '\n' ' ')into $FUSEKIT_CACHE"
  fi
  # FUSEKIT_BUILD_EXT=0: the install stays pure Python, so that the build below is timed on its own
  FUSEKIT_BUILD_EXT=0 run_step "pip install -e ." "$OUT/install.log" \
    python3 -m pip install -q --no-deps --no-build-isolation -e . || { tail -30 "$OUT/install.log"; }
  run_step "python3 -m fusion_backend.build (kernels + traced rules)" "$OUT/build.log" python3 -m fusion_backend.build
  [ -f "$OUT/build.log" ] && grep -E "^fusekit: " "$OUT/build.log" | tee -a "$SUMMARY"
fi

if has tests; then
  args TESTS_ARGS tests -m "gpu and not packaging"
  run_step "GPU tests" "$OUT/pytest_gpu.log" python3 -m pytest -q -p no:cacheprovider "${ARGS[@]}"
  if [ -f "$OUT/pytest_gpu.log" ]; then
    if tail -1 "$OUT/pytest_gpu.log" | grep -qE "passed|failed|error|no tests ran"; then
      note "GPU tests: $(tail -1 "$OUT/pytest_gpu.log")"
    else  # cut before pytest's summary: count its progress characters
      P=$(grep -E '^[.FEsxX]+( +\[ *[0-9]+%\])?$' "$OUT/pytest_gpu.log" | sed 's/ *\[.*//' | tr -d '\n')
      note "GPU tests, cut: ${#P} run, $(tr -cd . <<< "$P" | wc -c) passed, $(tr -cd F <<< "$P" | wc -c) failed," \
        "$(tr -cd E <<< "$P" | wc -c) errors, $(tr -cd s <<< "$P" | wc -c) skipped"
    fi
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -20 | tee -a "$SUMMARY"
  fi
fi

# the fusekit command, or the same entry point where pip put the script off PATH
FUSEKIT=(fusekit); command -v fusekit > /dev/null || FUSEKIT=(python3 -m fusion_backend.tools.cli)
if has bench; then
  args BENCH_ARGS --models llama --batches 1,32 --positions 1024 --no-generate
  run_step "fusekit bench --phase decode" "$OUT/decode.log" \
    "${FUSEKIT[@]}" bench --phase decode "${ARGS[@]}" --out "$OUT/decode"
fi
if has e2e; then
  args E2E_ARGS
  run_step "fusekit bench --phase prefill" "$OUT/e2e.log" "${FUSEKIT[@]}" bench --phase prefill --out "$OUT/e2e" \
    "${ARGS[@]}"
fi
if has patterns; then
  args PATTERNS_ARGS
  run_step "bench_patterns.py" "$OUT/patterns.log" python3 benchmarks/bench_patterns.py --out "$OUT/patterns" "${ARGS[@]}"
fi
if has attention; then
  run_step "bench_attention.py" "$OUT/attention.log" python3 benchmarks/bench_attention.py --out "$OUT/attention"
fi
if has matmul; then
  run_step "bench_matmul.py" "$OUT/matmul.log" python3 benchmarks/bench_matmul.py --out "$OUT/matmul"
fi
if has decode_gemm; then
  run_step "bench_decode_gemm.py" "$OUT/decode_gemm.log" python3 benchmarks/bench_decode_gemm.py --out "$OUT/decode_gemm"
fi
if has quant; then
  run_step "bench_quant_hbm.py" "$OUT/quant_hbm.log" python3 benchmarks/bench_quant_hbm.py --out "$OUT/quant_hbm"
fi
if has prefill; then
  run_step "bench_prefill_cache.py" "$OUT/prefill_cache.log" python3 benchmarks/bench_prefill_cache.py --out "$OUT/prefill_cache"
fi
if has compile; then
  args COMPILE_ARGS --models llama --phases decode --modes reduce-overhead --batches 32,1 --rounds 3
  run_step "bench_compile.py" "$OUT/compile.log" python3 benchmarks/bench_compile.py "${ARGS[@]}" --out "$OUT/compile"
fi

if has sanitize; then
  args SANITIZE_ARGS tests/test_kernels_gpu.py -k "8bit or w8_rows"
  run_step "compute-sanitizer memcheck" "$OUT/sanitize.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider "${ARGS[@]}"
  [ -f "$OUT/sanitize.log" ] && grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize.log" | tail -3 | tee -a "$SUMMARY"
fi

# pack the cache only where this call added to it (a file newer than the call's start)
if [ "${PACK:-1}" != 0 ] && [ -d "$FUSEKIT_CACHE" ] \
   && [ -n "$(find "$FUSEKIT_CACHE" -type f -newermt "@$T0" -print -quit)" ]; then
  (cd "$FUSEKIT_CACHE" && tar czf - --exclude="*.o" --exclude="*.ninja*" --exclude=lock . \
     | split -b 15M -d - "$OUT/fkc.tgz.") \
    && note "kernel/pattern cache packed: $(cd "$OUT" && ls fkc.tgz.* | tr '\n' ' ')($(cat "$OUT"/fkc.tgz.* | wc -c)" \
      "bytes; carry them in .fkc/)"
fi

# the device tool returns at most 8 files: past that, the logs travel as one archive
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ] && ls "$OUT"/*.log > /dev/null 2>&1; then
  (cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log) && note "logs packed into $OUT/logs.tgz"
fi

echo
echo "== summary ($(( $(date +%s) - T0 )) s; phases: $PHASES) =="
cat "$OUT/gpu.txt"
cat "$SUMMARY"
for f in "$OUT/decode/decode.md" "$OUT/e2e/bench.md" "$OUT/compile/compile.md"; do
  [ -f "$f" ] && { echo "-- $f"; grep "^|" "$f" | head -14; }
done
exit 0
