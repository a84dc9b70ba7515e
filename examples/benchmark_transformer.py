"""The end-to-end transformer benchmark, as a script: the same as `fusekit bench` (same flags).

    python examples/benchmark_transformer.py --models gpt2,bert --out bench_out
"""
import sys

from fusion_backend.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
