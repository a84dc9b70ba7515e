"""The decode_gemm ops alone (no compile) against eager cuBLAS, cold weights, at the benchmark models' q/k/v,
k/v, o and down linears: us per call, % of the weight bytes at the copy bandwidth. For A/Bs of the kernel
(benchmarks/device_ab.sh, whose trees are not installed: it links fusion_backend/patterns for bench_decode_gemm).

python benchmarks/probes/decode_gemm_op.py [--rows 1,8,16,24,32] [--linears q+k+v,k/v,o,down]"""
import argparse
import math
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_decode_gemm import MB, copy_bandwidth, graph_time, linears, reference_and_op  # noqa: E402
from fusion_backend import _ext  # noqa: E402
from fusion_backend.tools.models import MODELS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rows", default="1,8,16,24,32")
ap.add_argument("--linears", default="q+k+v,k/v,o,down")
ap.add_argument("--models", default="llama,qwen2")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
_ext.load_for_device()
bw = copy_bandwidth()
print(f"# decode_gemm ops alone, {torch.cuda.get_device_name()}, torch {torch.__version__}, copy {bw:.0f} GB/s")
print("| model | linear | rows | eager (cuBLAS) us | op us | op % of floor | op vs eager |\n|---|---|---|---|---|---|---|")
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
            got, want = op(x, *ws[0]), ref(x, *ws[0])
            got, want = (got, want) if isinstance(got, (tuple, list)) else ((got,), (want,))
            err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
            t = {"eager": [], "op": []}
            for _ in range(a.rounds):
                t["eager"].append(graph_time(lambda i: ref(x, *ws[i]), sets, 20))
                t["op"].append(graph_time(lambda i: op(x, *ws[i]), sets, 20))
            e, o = (statistics.median(v) * 1e3 for v in t.values())
            floor = wbytes / bw / 1e3
            print(f"| {spec.name} | {name} | {m} | {e:.1f} | {o:.1f} | {100 * floor / o:.0f}% | {e / o:.2f}x |"
                  + ("" if err < 0.05 else f" max diff {err:.3g}"), flush=True)
        del ws
