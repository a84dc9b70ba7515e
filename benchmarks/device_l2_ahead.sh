#!/usr/bin/env bash
# One call on the lent GPU, with benchmarks/attempts/decode_l2_prefetch_ahead_and_ctas.patch applied (git apply):
# L2 prefetch ahead of the rings (decode_attention's FUSEKIT_DECODE_ATTN_PREFETCH items, the TMA decode GEMM's
# FUSEKIT_DECODE_GEMM_L2AHEAD stages), A/B in the Llama-style step (decode_gemm_step.py) and decode_attention alone
# (bench_decode_attention_graph.py). Env: STEP_VARIANTS, ATTN_VARIANTS, ATTN_SHAPES, BATCHES, PHASES ("step attn"),
# DEADLINE (s). Logs under $OUT. The decode GPU tests: device_decode_gemm_tma.sh with PHASES=dtests.
set -uo pipefail
T0=$(date +%s)
. benchmarks/device_setup.sh
left() { echo $(( ${DEADLINE:-570} - $(date +%s) + T0 )); }
PHASES=${PHASES:-step attn}
A=FUSEKIT_DECODE_ATTN_PREFETCH G=FUSEKIT_DECODE_GEMM_L2AHEAD
if [[ " $PHASES " == *" step "* ]]; then
  timeout "$(left)" python3 benchmarks/probes/decode_gemm_step.py --batches "${BATCHES:-32,1}" --no-previous \
    --variants "${STEP_VARIANTS:-$A=4,$G=4,$G=8,$A=4+$G=8}" 2>&1 | grep -v -i warn > "$OUT/step.log"
  grep "max |logits\|^|" "$OUT/step.log" | tail -24
  grep -i "error\|Traceback" "$OUT/step.log" | head -5
fi
if [[ " $PHASES " == *" attn "* ]]; then
  timeout "$(left)" python3 benchmarks/bench_decode_attention_graph.py \
    --shapes "${ATTN_SHAPES:-llama b32 @1024,llama b32 @128,llama b32 @4000,llama b1 @1024,llama b64,qwen2 b32,\
mistral b32}" \
    --variants "${ATTN_VARIANTS:-$A=2,$A=4,$A=8}" 2>&1 | grep -v -i warn > "$OUT/attn.md"
  grep "^|" "$OUT/attn.md"
fi
(cd "$FUSEKIT_CACHE" && tar czf "$OUT/fkc.tgz" --exclude="*.o" --exclude="*.ninja*" --exclude=lock .)
echo "== summary =="; cat "$OUT/gpu.txt"
