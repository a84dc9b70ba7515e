"""Programmatic dependent launch (PDL) in a decode step (issue #23): the Llama-style step replayed as a CUDA graph,
Inductor and fusekit, with fusekit's kernels launched with PDL or without (FUSEKIT_PDL, read at each launch, so
every variant's graph is captured in one process and their logits compared: fusekit's kernels are deterministic,
so a difference beyond what two replays of one graph differ by would be a race). Inductor's own PDL for its
Triton kernels is read at import (TORCHINDUCTOR_ENABLE_PDL): run the probe once per setting.

    TORCHINDUCTOR_ENABLE_PDL=1 python benchmarks/probes/pdl_step.py --batches 32,1 --position 1024 --variants 0,ag
"""
import argparse
import statistics

import torch

from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.tools.decode_bench import Step, step_variants


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="0,1", help="FUSEKIT_PDL values, one graph each (fusekit.h: 0 none, 1 all, "
                    "else the parts' letters: a attention, g GEMMs)")
    a = ap.parse_args()
    ind_pdl = getattr(torch._inductor.config.triton, "enable_pdl", None)  # (absent: this torch has no Inductor PDL)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; Inductor triton.enable_pdl={ind_pdl}", flush=True)
    rows = []
    with torch.no_grad():
        for b in map(int, a.batches.split(",")):
            torch._dynamo.reset()
            st = Step(a.model, "cuda", b, 4096)
            st.at(a.position)
            fns = {"inductor": torch.compile(st.model), "fusekit": torch.compile(st.model, backend=fusekit_backend())}
            for fn in fns.values():
                st.restore()
                st(fn)
            variants = [("inductor", fns["inductor"], {})]
            variants += [(f"fusekit, FUSEKIT_PDL={v}", fns["fusekit"], {"FUSEKIT_PDL": v}) for v in a.variants.split(",")]
            times, outs, noise = step_variants(st, variants, a.rounds)
            fk = [k for k in outs if k != "inductor"]
            pdl_diff = max((outs[k] - outs[fk[0]]).abs().max().item() for k in fk)
            diff = (outs[fk[-1]] - outs["inductor"]).abs().max().item()
            print(f"b{b}: max |replay 1 - replay 2| {noise}; max |fusekit variant - {fk[0]}| {pdl_diff:.3g}; "
                  f"max |fusekit - inductor| {diff:.3g}", flush=True)
            same = pdl_diff <= max(noise.values()) or pdl_diff == 0
            for name, ts in times.items():
                rows.append((b, name, statistics.median(ts), min(ts), max(ts), same))
            del fns, st
            torch.cuda.empty_cache()
    print(f"\n| batch | Inductor PDL | step | ms (median of {a.rounds} rounds) | min | max |")
    print("|---|---|---|---|---|---|")
    for b, name, med, lo, hi, _ in rows:
        print(f"| {b} | {'on' if ind_pdl else 'off'} | {name} | {med:.4f} | {lo:.4f} | {hi:.4f} |")
    if not all(r[5] for r in rows):
        print("fusekit's logits with PDL differ from those without by more than replays of one graph differ")


if __name__ == "__main__":
    main()
