"""The decode_gemm ops alone (no compile) against eager cuBLAS, cold weights, at the benchmark models' q/k/v,
k/v, o and down linears: us per call, % of the weight bytes at the copy bandwidth, one op column per kernel
variant (FUSEKIT_DECODE_GEMM, read at each launch): a kernel developer's A/B, where bench_decode_gemm.py times the
rules as they are. Needs a CUDA GPU.

python benchmarks/probes/decode_gemm_op.py [--rows 1,8,16,24,32] [--linears q+k+v,k/v,o,down]
    [--variants old,splitk,splitk:4]  (FUSEKIT_DECODE_GEMM for each op column: the kernel and its K splits)"""
import argparse
import math
import os
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_decode_gemm import MB, copy_bandwidth, graph_time, linears, reference_and_op  # noqa: E402
from fusion_backend import _ext  # noqa: E402
from fusion_backend.tools.models import MODELS  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--rows", default="1,8,16,24,32")
ap.add_argument("--linears", default="q+k+v,k/v,o,down")
ap.add_argument("--models", default="llama,qwen2")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--variants", default="", help="comma-separated FUSEKIT_DECODE_GEMM values, one op column each")
a = ap.parse_args()
_ext.load_for_device()
bw = copy_bandwidth()
print(f"# decode_gemm ops alone, {torch.cuda.get_device_name()}, torch {torch.__version__}, copy {bw:.0f} GB/s")
variants = a.variants.split(",") if a.variants else [os.environ.get("FUSEKIT_DECODE_GEMM", "default")]
cols = " | ".join(f"{v} us | {v} % floor" for v in variants)
print(f"| model | linear | rows | eager (cuBLAS) us | {cols} | best vs eager |\n|---|---|---|---|" + "---|---|" * len(variants) + "---|")
seen = set()
for spec in (MODELS[n] for n in a.models.split(",")):
    for name, k, ns, kind in linears(spec):
        if name not in a.linears.split(",") or (k, ns, kind) in seen:
            continue
        seen.add((k, ns, kind))
        wbytes = sum(ns) * k * 2
        sets = max(2, min(64, math.ceil(256 * MB / wbytes)))
        ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for n in ns] for _ in range(sets)]
        ref, op = reference_and_op(kind)
        for m in map(int, a.rows.split(",")):
            x = torch.randn(m, 1, k, device="cuda", dtype=torch.bfloat16)
            errs, t = [], {"eager": []}
            for v in variants:
                os.environ["FUSEKIT_DECODE_GEMM"] = v
                got, want = op(x, *ws[0]), ref(x, *ws[0])
                got, want = (got, want) if isinstance(got, (tuple, list)) else ((got,), (want,))
                errs.append(max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want)))
                t[v] = []
            for _ in range(a.rounds):
                t["eager"].append(graph_time(lambda i: ref(x, *ws[i]), sets, 20))
                for v in variants:
                    os.environ["FUSEKIT_DECODE_GEMM"] = v  # read at each launch, so at capture
                    t[v].append(graph_time(lambda i: op(x, *ws[i]), sets, 20))
            med = {key: statistics.median(val) * 1e3 for key, val in t.items()}
            floor = wbytes / bw / 1e3
            e = med["eager"]
            cells = " | ".join(f"{med[v]:.1f} | {100 * floor / med[v]:.0f}%" for v in variants)
            print(f"| {spec.name} | {name} | {m} | {e:.1f} | {cells} | {e / min(med[v] for v in variants):.2f}x |"
                  + ("" if max(errs) < 0.05 else f" max diff {max(errs):.3g}"), flush=True)
        del ws
