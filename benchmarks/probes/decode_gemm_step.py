"""The decode GEMM selection in a decode step (issue #23): the Llama-style step replayed as a CUDA graph, Inductor,
fusekit with the previous selection (the plain-linear rule off, gate/up up to 8 rows, decode_linear_kernel:
FUSEKIT_DECODE_GEMM=old, read at each launch) and fusekit as it is now (the TMA kernel on sm_90a: every decode
linear up to 64 rows), plus each FUSEKIT_DECODE_GEMM value given, all captured in one process, logits compared.

    python benchmarks/probes/decode_gemm_step.py --batches 32,8 --position 1024 --variants tmaearly
"""
import argparse
import contextlib
import os
import statistics

import torch
from triton.testing import do_bench

from fusion_backend import table
from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.patterns import decode_gemm
from fusion_backend.tools.cuda_graphs import capture_output
from fusion_backend.tools.decode_bench import Step


@contextlib.contextmanager
def previous_rules():
    """The rules as before the TMA kernel: the plain linear off by default, gate/up up to 8 rows."""
    saved = dict(decode_gemm.MAX_ROWS_TMA)
    decode_gemm.MAX_ROWS_TMA.update(decode_gemm.MAX_ROWS)
    ids = ("decode_gemm.linear", "decode_gemm.linear_2d")
    for pid in ids:
        object.__setattr__(table.by_id(pid), "cuda_default", False)
    try:
        yield
    finally:
        decode_gemm.MAX_ROWS_TMA.update(saved)
        for pid in ids:
            object.__setattr__(table.by_id(pid), "cuda_default", True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batches", default="32,8")
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="", help="more FUSEKIT_DECODE_GEMM values for the current graph")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    torch._inductor.config.fx_graph_cache = False  # its key does not see the rule settings changed here
    rows = []
    with torch.no_grad():
        for b in map(int, a.batches.split(",")):
            torch._dynamo.reset()
            st = Step(a.model, "cuda", b, 4096)
            st.at(a.position)
            fns = {"inductor": torch.compile(st.model)}
            with previous_rules():
                fns["previous"] = torch.compile(st.model, backend=fusekit_backend())
                st.restore()
                st(fns["previous"])
            fns["fusekit"] = torch.compile(st.model, backend=fusekit_backend())
            for name in ("inductor", "fusekit"):
                st.restore()
                st(fns[name])
            variants = [("inductor", fns["inductor"], None), ("fusekit, previous selection", fns["previous"], "old"),
                        ("fusekit", fns["fusekit"], None)]
            variants += [(f"fusekit, {v}", fns["fusekit"], v) for v in a.variants.split(",") if v]
            graphs = {}
            for name, fn, v in variants:
                os.environ.pop("FUSEKIT_DECODE_GEMM", None)
                if v is not None:
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
                print(f"b{b} {name}: max |logits - inductor| {(outs[name] - outs['inductor']).abs().max().item():.3g}",
                      flush=True)
            times = {k: [] for k in graphs}
            for _ in range(a.rounds):
                for name, (g, _) in graphs.items():
                    times[name].append(do_bench(g.replay, warmup=25, rep=200, return_mode="median"))
            for name, ts in times.items():
                rows.append((b, name, statistics.median(ts), min(ts), max(ts)))
                print(f"  b{b} {name}: {statistics.median(ts):.4f} ms", flush=True)
            del graphs, fns, st
            torch.cuda.empty_cache()
    print(f"\n| batch | step | ms (median of {a.rounds} rounds) | min | max |")
    print("|---|---|---|---|---|")
    for b, name, med, lo, hi in rows:
        print(f"| {b} | {name} | {med:.4f} | {lo:.4f} | {hi:.4f} |")


if __name__ == "__main__":
    main()
