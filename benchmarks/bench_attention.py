"""Measures the attention rules (`attention.*`): each chain at BERT- and ViT-sized shapes, run by eager PyTorch (SDPA's
math backend, or the written-out softmax chain), by Inductor (which decomposes it into fp32 math) and by fusekit (the
chain rewritten into one fusekit::attention call), next to eager SDPA with PyTorch's default kernel choice; median ms
of triton.testing.do_bench (L2 flushed before each run), TFLOP/s and the error against the reference. Needs a CUDA
GPU. Writes attention.md, attention.json and attention.png (fusekit's speed-up over Inductor) under --out.

    python benchmarks/bench_attention.py --out out/ [--shapes 16x12x256x64,32x12x197x64] [--dtype float16]
"""
from __future__ import annotations

import argparse
import pathlib
import time

import torch
import torch.nn.functional as F

import fusion_backend
from bench_patterns import compiled, gpu_output, save  # the shared harness
from fusion_backend import table


def sdpa_default(p, args):
    a = dict(zip(p.arg_names, args))
    return lambda: F.scaled_dot_product_attention(a["q"], a["k"], a["v"], attn_mask=a.get("mask"),
                                                  scale=a["scale"])


def run(shapes, dtype, out: pathlib.Path) -> list[dict]:
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    pats = [p for p in table.all_patterns() if p.id.startswith("attention.")]
    todo = [(p, s) for s in shapes for p in pats]
    rows, t0 = [], time.time()
    for i, (p, (b, h, s, d)) in enumerate(todo, 1):
        case = (b, h, s, s, d, "key", "bshd")  # BERT's layout: heads transposed out of [B, S, H*D]
        args = p.make_args(case, dtype, "cuda")
        ind = compiled(p, "inductor")
        ind(*args)
        with fusion_backend.stats.collect() as recs:
            fk = compiled(p, "fusekit")
            fk(*args)
        fused = sum(r.sites[p.id] for r in recs) > 0
        res = {"pattern": p.id, "shape": f"[{b},{h},{s},{d}]", "dtype": str(dtype)[6:], "fused": fused}
        for name, fn in (("eager", lambda: p.eager(*args)), ("inductor", lambda: ind(*args)),
                         ("fusekit", lambda: fk(*args)), ("sdpa_default", sdpa_default(p, args))):
            res[name] = do_bench(fn, warmup=25, rep=300, return_mode="median")
        ref = p.eager(*args)
        got = fk(*args)
        keep = ~ref.isnan()
        res["max_abs_err_vs_reference"] = (got[keep].float() - ref[keep].float()).abs().max().item()
        res["vs_inductor"] = res["inductor"] / res["fusekit"]
        res["vs_eager"] = res["eager"] / res["fusekit"]
        flops = 4 * b * h * s * s * d
        res["tflops"] = flops / res["fusekit"] / 1e9
        rows.append(res)
        print(f"[{i}/{len(todo)} {time.time() - t0:4.0f}s] {p.id:32s} {res['shape']:16s} eager {res['eager']:.4f} "
              f"ind {res['inductor']:.4f} fk {res['fusekit']:.4f} sdpa {res['sdpa_default']:.4f} ms  "
              f"fk vs ind {res['vs_inductor']:.2f}x{'' if fused else '  (NOT FUSED)'}", flush=True)
        del args, ind, fk
    return rows


def markdown(rows, device) -> str:
    lines = [f"# Attention chains: eager vs Inductor vs fusekit ({device})", "",
             "Key-padding mask [B,1,1,S] with padded keys and a fully masked sequence; q, k, v head-transposed "
             "views of [B,S,H*D]. Median ms (do_bench, L2 flushed).", "",
             "| pattern | shape | eager | Inductor | fusekit | eager SDPA (default kernel) | fusekit vs Inductor "
             "| fusekit vs eager | TFLOP/s | max abs err vs reference |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['shape']} | {r['eager']:.4f} | {r['inductor']:.4f} | {r['fusekit']:.4f} "
                     f"| {r['sdpa_default']:.4f} | **{r['vs_inductor']:.2f}x** | {r['vs_eager']:.2f}x | "
                     f"{r['tflops']:.0f} | {r['max_abs_err_vs_reference']:.1e} |")
    return "\n".join(lines) + "\n"


def plot(rows, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['pattern'].split('.')[1]}\n{r['shape']}" for r in rows]
    ax.bar(range(len(rows)), [r["vs_inductor"] for r in rows], color="tab:green")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(5.0, color="tab:red", lw=0.8, ls="--", label="5x target")
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("fusekit speedup over Inductor")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--shapes", default="16x12x256x64,32x12x197x64")
    ap.add_argument("--dtype", default="float16")
    a = ap.parse_args()
    out, device = gpu_output("bench_attention", a.out)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    rows = run(shapes, getattr(torch, a.dtype), out)
    save(out, "attention", {"device": device, "rows": rows}, markdown(rows, device), lambda path: plot(rows, path))
    print(markdown(rows, device))


if __name__ == "__main__":
    main()
