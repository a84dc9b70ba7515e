#!/usr/bin/env bash
# One call on the lent GPU: the working tree's kernels against an earlier revision's, both built on this
# machine (at once), benchmarked in turn in the same run: old, new (each variant), old, new, ...
# Before the call, on the dev machine: rm -rf ab_old && mkdir ab_old && git archive REV csrc | tar -x -C ab_old
# (untracked, so it travels with the tree; delete it after). Logs under $OUT.
# Env: BENCH (command run in each tree; default the decode_attention graph bench), VARIANTS (space-separated
# env assignments for the new tree's runs, "-" for none), ROUNDS (default 2), TESTS (pytest args run in the
# new tree once per variant; empty: none), DEADLINE (s).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/fusekit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8} FUSEKIT_CACHE=${FUSEKIT_CACHE:-/tmp/fkc}
NEW=$PWD OLD=/tmp/ab_old_tree
# a carried kernel cache (.fkc/fkc.tgz, an earlier call's $OUT/fkc.tgz): a tree whose sources it built skips its build
[ -f .fkc/fkc.tgz ] && mkdir -p "$FUSEKIT_CACHE" && tar xzf .fkc/fkc.tgz -C "$FUSEKIT_CACHE"
[ -d ab_old/csrc ] || { echo "ab_old/csrc missing (see the header)"; exit 2; }
rm -rf "$OLD" && mkdir -p "$OLD" && cp -r fusion_backend patterns benchmarks tests "$OLD"/ && cp -r ab_old/csrc "$OLD/csrc"
# Neither tree is installed before the benches: fusion_backend.patterns (the top-level patterns/, mapped by
# pyproject at install) is a symlink, so benches that import it (bench_decode_gemm, decode_bench) run in both.
for t in "$OLD" "$NEW"; do ln -sfn ../patterns "$t/fusion_backend/patterns"; done
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/gpu.txt"
for t in "$OLD" "$NEW"; do  # both builds at once, MAX_JOBS each
  (cd "$t" && PYTHONPATH="$t" /usr/bin/time -f "$t build %e s" python3 -m fusion_backend.build --arch 9.0a > "$OUT/build_$(basename "$t").log" 2>&1) &
done
wait
grep -h "build .* s$\|rror" "$OUT"/build_*.log | tail -5 | tee -a "$OUT/gpu.txt"
BENCH=${BENCH:-python3 benchmarks/bench_decode_attention_graph.py}
run() {  # tree label env...
  local t=$1 label=$2; shift 2
  echo "== $label" | tee -a "$OUT/ab.md"
  (cd "$t" && env PYTHONPATH="$t" "$@" $BENCH 2>&1 | grep -v -i warn | tee -a "$OUT/ab.md" | grep "^|" | tail -12)
}
for i in $(seq "${ROUNDS:-2}"); do
  [ $(( $(date +%s) - T0 )) -gt "${DEADLINE:-400}" ] && break
  run "$OLD" "old (round $i)"
  for v in ${VARIANTS:--}; do run "$NEW" "new $v (round $i)" $([ "$v" = - ] || echo "$v"); done
done
cp "$OUT/gpu.txt" "$OUT/ab.txt"
if [ -n "${TESTS:-}" ]; then  # in the installed new tree (the kernels are built: the install finds them)
  . benchmarks/device_setup.sh
  for v in ${VARIANTS:--}; do
    [ $(( $(date +%s) - T0 )) -gt "${TEST_DEADLINE:-480}" ] && break
    env $([ "$v" = - ] || echo "$v") python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/pytest_${v//=/_}.log" 2>&1
    echo "tests ($v): $(tail -1 "$OUT/pytest_${v//=/_}.log")" | tee -a "$OUT/ab.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_${v//=/_}.log" | head -10
  done
fi
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "== summary =="; cat "$OUT/ab.txt"
