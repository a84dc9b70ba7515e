#!/usr/bin/env bash
# For device_ab.sh's BENCH: greedy generate only (benchmarks/probes/gen_probe.py: Llama-style batch 32, 512 + 256
# tokens, the 768-slot cache; Inductor and fusekit, two repetitions).
python3 benchmarks/probes/gen_probe.py 2>&1 | grep -v -i warn
