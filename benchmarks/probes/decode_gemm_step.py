"""The decode GEMM kernels in a decode step (issue #23): the Llama-style step replayed as a CUDA graph, Inductor,
fusekit as it ships, and fusekit with every decode linear of the step on a fusekit kernel (the plain-linear rule
on, gate/up up to 64 rows: patterns.decode_gemm.MAX_ROWS, read at each match) under each FUSEKIT_DECODE_GEMM
value (read at each launch, so every variant's graph is captured in one process and the logits compared).

    python benchmarks/probes/decode_gemm_step.py --batches 32,8 --position 1024 --variants default,tma,tmalate
"""
import argparse
import os
import statistics

import torch
from triton.testing import do_bench

from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.patterns import decode_gemm
from fusion_backend.tools.cuda_graphs import capture_output
from fusion_backend.tools.decode_bench import Step



def all_linears(on: bool) -> None:
    """The plain decode-linear rules on by default (off as shipped), gate/up and plain linears up to 64 rows
    (options={"patterns": [...]} would also lift the other rules' size thresholds)."""
    from fusion_backend import table
    for pid in ("decode_gemm.linear", "decode_gemm.linear_2d"):
        object.__setattr__(table.by_id(pid), "cuda_default", on)
    decode_gemm.MAX_ROWS.update(gate_up_silu=64 if on else 8, linear=64 if on else 32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batches", default="32,8")
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="default,tma", help="FUSEKIT_DECODE_GEMM values for the all-linears graph")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    torch._inductor.config.fx_graph_cache = False  # its key does not see the rule settings changed here
    rows = []
    with torch.no_grad():
        for b in map(int, a.batches.split(",")):
            torch._dynamo.reset()
            st = Step(a.model, "cuda", b, 4096)
            st.at(a.position)
            fns = {"inductor": torch.compile(st.model), "fusekit": torch.compile(st.model, backend=fusekit_backend())}
            for name, fn in fns.items():
                st.restore()
                st(fn)
            all_linears(True)
            allfn = torch.compile(st.model, backend=fusekit_backend())
            st.restore()
            st(allfn)
            all_linears(False)
            variants = [("inductor", fns["inductor"], None), ("fusekit (shipped)", fns["fusekit"], None)]
            variants += [(f"fusekit all linears, {v}", allfn, v) for v in a.variants.split(",")]
            graphs = {}
            for name, fn, v in variants:
                os.environ.pop("FUSEKIT_DECODE_GEMM", None)
                if v not in (None, "default"):
                    os.environ["FUSEKIT_DECODE_GEMM"] = v
                st.restore()
                graphs[name] = capture_output(st.repeated(fn))
            os.environ.pop("FUSEKIT_DECODE_GEMM", None)
            outs = {}
            for name, (g, out) in graphs.items():
                st.restore()
                st.at(a.position)
                g.replay()
                outs[name] = out.float().clone()
            for name in outs:
                print(f"b{b} {name}: max |logits - inductor| {(outs[name] - outs['inductor']).abs().max().item():.3g}", flush=True)
            times = {k: [] for k in graphs}
            for _ in range(a.rounds):
                for name, (g, _) in graphs.items():
                    times[name].append(do_bench(g.replay, warmup=25, rep=200, return_mode="median"))
            for name, ts in times.items():
                rows.append((b, name, statistics.median(ts), min(ts), max(ts)))
                print(f"  b{b} {name}: {statistics.median(ts):.4f} ms", flush=True)
            del graphs, fns, allfn, st
            torch.cuda.empty_cache()
    print(f"\n| batch | step | ms (median of {a.rounds} rounds) | min | max |")
    print("|---|---|---|---|---|")
    for b, name, med, lo, hi in rows:
        print(f"| {b} | {name} | {med:.4f} | {lo:.4f} | {hi:.4f} |")


if __name__ == "__main__":
    main()
