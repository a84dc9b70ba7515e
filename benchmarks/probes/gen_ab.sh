#!/usr/bin/env bash
# For device_ab.sh's BENCH, in a tree that is not installed: Llama-style batch-32 decode step and generate
# (512 + 256 tokens, the 768-slot cache), eager / Inductor / fusekit. fusion_backend.patterns is the
# top-level patterns/ (pyproject maps it at install): a symlink stands in.
ln -sfn ../patterns fusion_backend/patterns
python3 benchmarks/probes/gen_probe.py 2>&1 | grep -v -i warn
