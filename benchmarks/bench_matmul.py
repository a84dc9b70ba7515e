"""Measures the matmul-epilogue rules (`batched_matmul.*`): each rule at a set of [L, M, K, N] shapes and linear
layers, run by eager PyTorch, by Inductor (cuBLAS, then a pointwise kernel for the epilogue) and by fusekit (one
CUTLASS GEMM with the epilogue in registers); beside them the plain GEMM (torch.bmm / cuBLAS against
fusekit::matmul_epilogue with no epilogue) and a large-matmul TFLOP/s ceiling measured in the same run. Shapes are
[L, M, K, N] (b is [L, K, N]); linear rows are [tokens, K -> N] with a weight [N, K]; float32 rows run with TF32
allowed on all three sides (the fp32 rules fire only there); "cast" rows return the result as .float(). Each figure
is the median over replays of a one-call CUDA graph after an L2 flush (--flush clean, default, or zero, as
bench_patterns.py), Inductor and fusekit taking turns over 3 rounds. Generated from the batched_matmul table. Needs
a CUDA GPU; fusekit's kernels exist on sm_90a (H100/H200) builds with the CUTLASS headers. Writes matmul.md,
matmul.json and matmul.png under --out (--replot redraws the plot from a matmul.json, no GPU needed).

    python benchmarks/bench_matmul.py --out out/ [--dtypes float16,bfloat16] [--rules gelu,cast]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch

import fusion_backend
from bench_patterns import compiled, gpu_output, measure, measure_rounds, save  # the shared harness
from fusion_backend import table
from fusion_backend.report import no_compile_caches

# (rule, case, label): the headline bmm·scale + bias -> GELU shapes, the MLP linears as the linear rules see
# them, then every other rule at one attention-style or MLP shape (the measured selection covers each rule)
HEADLINE = "batched_matmul.bmm_scale_bias_gelu"
CASES = [(HEADLINE, c, "x".join(map(str, c))) for c in
         [(96, 512, 64, 512), (96, 512, 512, 64), (32, 1024, 1024, 1024), (8, 4096, 4096, 4096),
          (1, 4096, 768, 3072), (1, 2048, 2048, 5632)]] + \
        [("batched_matmul.linear_bias_gelu_2d", (4096, 768, 3072), "GPT-2 MLP 4096x768->3072"),
         ("batched_matmul.linear_bias_silu_2d", (2048, 2048, 5632), "Llama MLP 2048x2048->5632"),
         ("batched_matmul.linear_bias_gelu", (16, 256, 768, 3072), "BERT MLP 16x256x768->3072")]
# the other matmul forms, each at one shape; a 4th field picks a variant spelling (index into p.variants)
FORMS = [("batched_matmul.mm_bias_gelu_tanh", (8, 512, 768, 3072), "GPT-2 Conv1D addmm+gelu_new 8x512x768->3072", 1),
         ("batched_matmul.bmm_scale_bias_gelu_4d", (8, 12, 512, 64, 512, "bT"), "4-D q@k^T 8x12x512x64x512"),
         ("batched_matmul.bmm_scale_bias_gelu", (96, 512, 64, 512), "baddbmm 96x512x64x512", 0)]
# the output cast: the same rules with the result returned as .float() (16-bit dtypes only)
CASTS = [(HEADLINE, (96, 512, 64, 512), "cast 96x512x64x512", "float"),
         ("batched_matmul.bmm_scale_bias", (96, 512, 64, 512), "cast 96x512x64x512", "float"),
         (HEADLINE, (32, 1024, 1024, 1024), "cast 32x1024^3", "float"),
         ("batched_matmul.linear_bias_relu_2d", (4096, 768, 3072), "cast 4096x768->3072", "float")]


def other_cases():
    seen = {c[0] for c in CASES + FORMS}
    for p in table.all_patterns():  # 3-D batched and linear rules (4-D and mm rules: FORMS' kernels)
        if p.id.startswith("batched_matmul.") and p.id not in seen and not p.id.endswith("_4d") \
                and ".mm_" not in p.id:
            if p.static.get("linear"):
                case = (16, 256, 768, 3072) if p.id[-3:] != "_2d" else (4096, 768, 3072)
                yield p.id, case, ("16x256x768->3072" if len(case) == 4 else "4096x768->3072")
            else:
                yield p.id, (96, 512, 64, 512), "96x512x64x512"


def bench(fn, flush: str) -> float:
    return measure(fn, hot=False, flush=flush)[0]  # median of runs of one-call CUDA-graph replays, L2 flushed


def flops_of(p, args) -> int:
    a, b = args[0], args[1]
    k = a.shape[-1]
    n = b.shape[0] if p.static.get("linear") else b.shape[-1]
    return 2 * a.numel() // k * k * n


def run(dtypes, out: pathlib.Path, rules: list[str] | None = None, flush: str = "clean") -> tuple[list[dict], dict]:
    rows, t0 = [], time.time()
    todo = [(c, dt) for c in [*CASES, *FORMS, *other_cases(), *CASTS] for dt in dtypes
            if not (c[-1] == "float" and dt == torch.float32)
            and (not rules or any(r in f"{c[0]} {c[2]}" for r in rules))]
    prec = torch.backends.cuda.matmul.fp32_precision
    for i, ((pid, case, label, *variant), dt) in enumerate(todo, 1):
        p = table.by_id(pid)
        fn = (lambda *t, p=p: p.eager(*t).float()) if variant == ["float"] else \
            p.variants[variant[0]] if variant else None
        torch.backends.cuda.matmul.fp32_precision = "tf32" if dt == torch.float32 else prec
        if dt == torch.float32 and not p.static.get("linear") and ".mm_" not in pid and "bT" not in case:
            case, label = (*case, "bT"), label + " bT"  # TF32 rules take a K-major b (batched_matmul.tf32_allowed)
        args = p.make_args(case, dt, "cuda")
        ind = compiled(p, "inductor", fn)
        ind(*args)
        with fusion_backend.stats.collect() as recs, no_compile_caches():  # a cache hit skips the pass: no count
            fk = compiled(p, "fusekit", fn)
            fk(*args)
        fused = sum(r.sites[p.id] for r in recs) > 0
        res = {"pattern": pid, "shape": label, "dtype": str(dt)[6:] + (" (TF32)" if dt == torch.float32 else ""),
               "fused": fused, "output_casts": sum(r.output_casts["matmul_epilogue"] for r in recs)}
        eager = fn or p.eager
        res["eager"] = bench(lambda: eager(*args), flush)
        for name, meds in measure_rounds({"inductor": lambda: ind(*args), "fusekit": lambda: fk(*args)}, False,
                                         rounds=3, flush=flush).items():  # taking turns: host or clock drift hits both
            res[name] = statistics.median(meds)
        a, b = args[0], args[1]
        if p.static.get("linear"):
            plain_ref, plain_fk = (lambda: torch.matmul(a, b.t())), \
                (lambda: torch.ops.fusekit.matmul_epilogue(a, b, None, None, None, "none", True))
        else:
            plain_ref, plain_fk = (lambda: torch.matmul(a, b)), \
                (lambda: torch.ops.fusekit.matmul_epilogue(a, b, None, None, None, "none", False))
        res["cublas_plain"], res["fusekit_plain"] = bench(plain_ref, flush), bench(plain_fk, flush)
        ref = eager(*args)
        res["max_abs_err_vs_eager"] = (fk(*args).float() - ref.float()).abs().max().item()
        res["plain_max_abs_err"] = (plain_fk().float() - plain_ref().float()).abs().max().item()
        fl = flops_of(p, args)
        res["tflops_fusekit"] = fl / res["fusekit"] / 1e9
        res["tflops_cublas_plain"] = fl / res["cublas_plain"] / 1e9
        res["tflops_fusekit_plain"] = fl / res["fusekit_plain"] / 1e9
        res["vs_inductor"] = res["inductor"] / res["fusekit"]
        res["vs_eager"] = res["eager"] / res["fusekit"]
        res["plain_vs_cublas"] = res["cublas_plain"] / res["fusekit_plain"]
        rows.append(res)
        print(f"[{i}/{len(todo)} {time.time() - t0:4.0f}s] {pid.split('.')[1]:22s} {label:28s} {res['dtype']:8s} "
              f"eager {res['eager']:.4f} ind {res['inductor']:.4f} fk {res['fusekit']:.4f} ms  "
              f"vs ind {res['vs_inductor']:.2f}x  plain: cublas {res['cublas_plain']:.4f} fk {res['fusekit_plain']:.4f} "
              f"({res['plain_vs_cublas']:.2f}x){'' if fused else '  (NOT FUSED)'}"
              f"{'  (cast stored)' if res['output_casts'] else ''}", flush=True)
        del args, ind, fk
        torch._dynamo.reset()
    torch.backends.cuda.matmul.fp32_precision = prec
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    ceiling = {"what": "torch.mm 8192^3 fp16 (cuBLAS)", "tflops": 2 * 8192 ** 3 / bench(lambda: torch.mm(x, x), flush) / 1e9}
    return rows, ceiling


def markdown(rows, ceiling, device, flush: str) -> str:
    lines = [f"# Matmul + epilogue: eager vs Inductor vs fusekit ({device})", "",
             f"Median ms (one-call CUDA-graph replays, L2 flushed before each, flush: {flush}; Inductor and fusekit: "
             f"the median of 3 interleaved rounds). Large-matmul ceiling in the same run: {ceiling['what']} = "
             f"{ceiling['tflops']:.0f} TFLOP/s.", "",
             "| rule | shape | dtype | eager | Inductor | fusekit | fusekit vs Inductor | fusekit vs eager | fusekit "
             "TFLOP/s | plain: cuBLAS | plain: fusekit | plain fusekit/cuBLAS speed | max abs err vs eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern'].split('.')[1]} | {r['shape']} | {r['dtype']} | {r['eager']:.4f} | "
                     f"{r['inductor']:.4f} | {r['fusekit']:.4f} | **{r['vs_inductor']:.2f}x**"
                     f"{'' if r['fused'] else ' (not fused)'}{' (cast stored)' if r.get('output_casts') else ''} | {r['vs_eager']:.2f}x | {r['tflops_fusekit']:.0f} | "
                     f"{r['cublas_plain']:.4f} ({r['tflops_cublas_plain']:.0f}) | {r['fusekit_plain']:.4f} "
                     f"({r['tflops_fusekit_plain']:.0f}) | {r['plain_vs_cublas']:.2f}x | {r['max_abs_err_vs_eager']:.1e} |")
    return "\n".join(lines) + "\n"


def plot(rows, ceiling, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 0.22 * len(rows) + 1.5), sharey=True)
    labels = [f"{r['pattern'].split('.')[1]}  {r['shape']}  {r['dtype']}" for r in rows]
    y = list(range(len(rows)))[::-1]
    colors = ["tab:green" if r["vs_inductor"] >= 1.0 else "tab:red" for r in rows]
    ax.barh(y, [r["vs_inductor"] if r["fused"] else 0 for r in rows], color=colors)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(1.3, color="tab:red", lw=0.8, ls="--", label="1.3x target (attention-style, 1024^3)")
    ax.set_yticks(y, labels, fontsize=6)
    ax.set_xlabel("fusekit speedup over Inductor (0 = not fused)")
    ax.legend(fontsize=7, loc="lower right")
    h = 0.4
    bx.barh([v + h / 2 for v in y], [r["tflops_cublas_plain"] for r in rows], h, label="cuBLAS (plain)")
    bx.barh([v - h / 2 for v in y], [r["tflops_fusekit_plain"] for r in rows], h, label="fusekit (plain)")
    bx.axvline(ceiling["tflops"], color="tab:red", lw=0.8, ls="--", label="8192^3 cuBLAS ceiling")
    bx.set_xlabel("TFLOP/s, no epilogue")
    bx.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="float32: with TF32 allowed")
    ap.add_argument("--rules", help="comma-separated substrings of 'rule label' to run (default: all)")
    ap.add_argument("--flush", choices=("clean", "zero"), default="clean",
                    help="clean: read a 256 MB buffer before each run; zero: do_bench's zero_() of it (see bench_patterns)")
    ap.add_argument("--replot", help="redraw the PNG from a matmul.json (no GPU needed)")
    a = ap.parse_args()
    if a.replot:
        data = json.loads(pathlib.Path(a.replot).read_text())
        plot(data["rows"], data["ceiling"], pathlib.Path(a.replot).with_suffix(".png"))
        return
    out, device = gpu_output("bench_matmul", a.out)
    rows, ceiling = run([getattr(torch, d) for d in a.dtypes.split(",")], out,
                        a.rules.split(",") if a.rules else None, a.flush)
    md = markdown(rows, ceiling, device, a.flush)
    save(out, "matmul", {"device": device, "flush": a.flush, "ceiling": ceiling, "rows": rows}, md,
         lambda path: plot(rows, ceiling, path))
    print(md)


if __name__ == "__main__":
    main()
