#!/usr/bin/env bash
# One call on the lent GPU: build, Nsight Compute of decode_attention (device_ncu_decode.sh), then the graph
# bench under each of VARIANTS (";"-separated env assignments, "-" for none), ROUNDS rounds, in one process each.
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
/usr/bin/time -f "build %e s" python3 -m fusion_backend.build --arch 9.0a > "$OUT/build.log" 2>&1; tail -2 "$OUT/build.log" | tee -a "$OUT/gpu.txt"
[ "${NCU:-1}" = 1 ] && bash benchmarks/device_ncu_decode.sh > "$OUT/ncu.txt" 2>&1 && cat "$OUT/ncu.txt"
IFS=';' read -ra VS <<< "${VARIANTS:--}"
for i in $(seq "${ROUNDS:-2}"); do
  for v in "${VS[@]}"; do
    [ $(( $(date +%s) - T0 )) -gt "${DEADLINE:-520}" ] && break 2
    echo "== $v (round $i)" | tee -a "$OUT/variants.md"
    env $([ "$v" = - ] || echo "$v") python3 benchmarks/bench_decode_attention_graph.py --shapes "${SHAPES:-llama b32,llama b1 @1024,qwen2 b32}" 2>&1 \
      | grep -v -i warn | tee -a "$OUT/variants.md" | grep "^| [lqm]"
  done
done
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "total $(( $(date +%s) - T0 )) s"
