"""Greedy generate only (Llama-style, batch 32, 512 + 256 tokens, the 768-slot cache transformers sizes),
Inductor and fusekit, through decode_bench.generate_bench: tokens/s of the second run. For A/Bs."""
import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from fusion_backend.tools import decode_bench  # noqa: E402

decode_bench.BACKENDS = ("inductor", "fusekit")
for rep in range(2):
    r = decode_bench.generate_bench("llama", "cuda", 32, 512, 256, None, log=lambda s: None)
    for be, v in r["backends"].items():
        print(f"| gen rep {rep} | {be} | {v.get('tokens_per_s', 0):,.0f} tok/s | {v.get('error', '')}", flush=True)
