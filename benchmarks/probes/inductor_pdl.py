"""Inductor alone, its Triton kernels with programmatic dependent launch or without (TORCHINDUCTOR_ENABLE_PDL, read
at import: run once per setting): a decode step replayed as a CUDA graph. Whether Inductor's PDL would help a
graph where no fusekit decode attention rule fires (the backend leaves it off there; passes.DECODE_INDUCTOR).

    TORCHINDUCTOR_ENABLE_PDL=1 python benchmarks/probes/inductor_pdl.py --models gpt2 --batches 1,32
"""
import argparse
import statistics

import torch
from triton.testing import do_bench

from fusion_backend.tools.decode_bench import Step
from fusion_backend.tools.cuda_graphs import capture


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--position", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pdl = torch._inductor.config.triton.enable_pdl
    with torch.no_grad():
        for name in a.models.split(","):
            for b in map(int, a.batches.split(",")):
                torch._dynamo.reset()
                st = Step(name, "cuda", b, 4096)
                st.at(min(a.position, st.cache_len - 1))
                fn = torch.compile(st.model)
                st(fn)
                g = capture(st.repeated(fn))
                ts = [do_bench(g.replay, warmup=25, rep=200, return_mode="median") for _ in range(a.rounds)]
                print(f"| {name} | {b} | {st.position} | Inductor PDL {'on' if pdl else 'off'} | "
                      f"{statistics.median(ts):.4f} | {min(ts):.4f}-{max(ts):.4f} |", flush=True)
                del g, fn, st


if __name__ == "__main__":
    main()
