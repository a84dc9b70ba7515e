"""The decode GEMM selection in a decode step: the Llama-style step replayed as a CUDA graph, Inductor,
fusekit with the previous selection (the plain-linear rule off, gate/up up to 8 rows, decode_linear_kernel:
FUSEKIT_DECODE_GEMM=old, read at each launch) and fusekit as it is now (the TMA kernel on sm_90a: every decode
linear up to 64 rows), plus each variant given (a FUSEKIT_DECODE_GEMM value, or VAR=value for another of
fusekit's launch switches, e.g. FUSEKIT_DECODE_ATTN=grid, or several joined by '+'), all captured in one process,
logits compared.

    python benchmarks/probes/decode_gemm_step.py --batches 32,8 --position 1024 --variants tmaearly,FUSEKIT_DECODE_ATTN=grid
"""
import argparse
import contextlib
import statistics

import torch

from fusion_backend import table
from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.patterns import decode_gemm
from fusion_backend.tools.decode_bench import Step, step_variants


@contextlib.contextmanager
def previous_rules():
    """The rules as before the TMA kernel: the plain linear off by default, gate/up up to 8 rows."""
    saved = dict(decode_gemm.MAX_ROWS_TMA)
    decode_gemm.MAX_ROWS_TMA.update(decode_gemm.MAX_ROWS)
    rules = [table.by_id(pid) for pid in ("decode_gemm.linear", "decode_gemm.linear_2d")]
    defaults = [p.cuda_default for p in rules]
    for p in rules:
        object.__setattr__(p, "cuda_default", False)
    try:
        yield
    finally:
        decode_gemm.MAX_ROWS_TMA.update(saved)
        for p, d in zip(rules, defaults):
            object.__setattr__(p, "cuda_default", d)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batches", default="32,8")
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="", help="more FUSEKIT_DECODE_GEMM values for the current graph")
    ap.add_argument("--no-previous", action="store_true", help="skip the previous selection (one compile less)")
    ap.add_argument("--inductor", default="", help="comma-separated KEY=0|1 Inductor switches, each a fusekit graph "
                    "compiled with it as a backend option (e.g. combo_kernels=0)")
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
            if not a.no_previous:
                with previous_rules():
                    fns["previous"] = torch.compile(st.model, backend=fusekit_backend())
                    st.restore()
                    st(fns["previous"])
            fns["fusekit"] = torch.compile(st.model, backend=fusekit_backend())
            for name in ("inductor", "fusekit"):
                st.restore()
                st(fns[name])
            patched = []
            for kv in filter(None, a.inductor.split(",")):
                key, _, value = kv.partition("=")
                fns[kv] = torch.compile(st.model, backend=fusekit_backend(options={key: bool(int(value))}))
                st.restore()
                st(fns[kv])
                patched.append((f"fusekit, Inductor {kv}", fns[kv], {}))
            variants = [("inductor", fns["inductor"], {})]
            if not a.no_previous:
                variants.append(("fusekit, previous selection", fns["previous"], {"FUSEKIT_DECODE_GEMM": "old"}))
            variants.append(("fusekit", fns["fusekit"], {}))
            variants += patched
            for v in filter(None, a.variants.split(",")):  # VAR=value, or several joined by '+'
                env = {}
                for part in v.split("+"):
                    var, _, value = part.rpartition("=")
                    env[var or "FUSEKIT_DECODE_GEMM"] = value
                variants.append((f"fusekit, {v}", fns["fusekit"], env))
            times, outs, noise = step_variants(st, variants, a.rounds)
            for name in outs:
                print(f"b{b} {name}: max |logits - inductor| {(outs[name] - outs['inductor']).abs().max().item():.3g} "
                      f"(two replays differ by {noise[name]:.3g})", flush=True)
            for name, ts in times.items():
                rows.append((b, name, statistics.median(ts), min(ts), max(ts)))
                print(f"  b{b} {name}: {statistics.median(ts):.4f} ms", flush=True)
            del fns, st
            torch.cuda.empty_cache()
    print(f"\n| batch | step | ms (median of {a.rounds} rounds) | min | max |")
    print("|---|---|---|---|---|")
    for b, name, med, lo, hi in rows:
        print(f"| {b} | {name} | {med:.4f} | {lo:.4f} | {hi:.4f} |")


if __name__ == "__main__":
    main()
