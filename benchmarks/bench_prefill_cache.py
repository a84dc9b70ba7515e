"""Measures the `prefill.*` rules in the models: the forward of a prompt (`--prompt` tokens per sequence) written into
a transformers StaticCache of `--slots` slots, as chunked prefill or the first forward of a generation loop runs
it, under eager, Inductor and fusekit, each compiled forward replayed as a CUDA graph; ms per forward (the median
of --rounds interleaved rounds of triton.testing.do_bench medians), fusekit's sites, and the logits' distance to
Inductor's. Needs a CUDA GPU. Writes prefill_cache.md, .json and .png under --out.

    python benchmarks/bench_prefill_cache.py [--models llama,qwen2] [--batches 1,4] [--prompt 512] [--slots 4096]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from fusion_backend import stats
from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.report import Report
from fusion_backend.tools import cuda_graphs
from fusion_backend.tools.decode_bench import Prompt


def run(name: str, batch: int, length: int, slots: int, rounds: int) -> dict:
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    p = Prompt(name, "cuda", batch, length, slots)
    fns, sites, logits = {}, {}, {}
    with torch.no_grad():
        logits["eager"] = p(p.model).float()
        for be in ("inductor", "fusekit"):
            torch._dynamo.reset()
            with stats.collect() as records:
                fn = torch.compile(p.model) if be == "inductor" else torch.compile(p.model, backend=fusekit_backend())
                logits[be] = p(fn).float()
            sites[be] = dict(Report(list(records)).sites) if be == "fusekit" else {}
            g = cuda_graphs.capture(lambda fn=fn: p(fn))
            fns[be] = (lambda g=g: g.replay()) if g is not None else (lambda fn=fn: p(fn))
        ge = cuda_graphs.capture(lambda: p(p.model))
        fns["eager"] = (lambda: ge.replay()) if ge is not None else (lambda: p(p.model))
        times = {k: [] for k in fns}
        for _ in range(rounds):  # interleaved rounds
            for k, fn in fns.items():
                times[k].append(do_bench(fn, warmup=5, rep=40, return_mode="median"))
    ms = {k: statistics.median(v) for k, v in times.items()}
    row = dict(model=name, batch=batch, prompt=length, slots=slots, ms=ms,
               speedup=ms["inductor"] / ms["fusekit"], sites={k: v for k, v in sites["fusekit"].items() if v},
               err_fusekit=(logits["fusekit"] - logits["inductor"]).abs().max().item(),
               err_eager=(logits["eager"] - logits["inductor"]).abs().max().item())
    print(f"  {name} b{batch} {length}/{slots}: eager {ms['eager']:.3f} ms, Inductor {ms['inductor']:.3f}, fusekit "
          f"{ms['fusekit']:.3f} ({row['speedup']:.2f}x), sites {row['sites']}, |fusekit - Inductor| "
          f"{row['err_fusekit']:.2e} (|eager - Inductor| {row['err_eager']:.2e})", flush=True)
    del fns, p
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama,qwen2")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--slots", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="prefill_cache_out")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    rows = []
    for name in a.models.split(","):
        for b in (int(x) for x in a.batches.split(",")):
            rows.append(run(name, b, a.prompt, a.slots, a.rounds))
            (out / "prefill_cache.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    md = [f"# A prompt against a static cache: {env}", "",
          "ms per forward, CUDA graphs for every backend, median of interleaved rounds (triton do_bench medians).", "",
          "| model | batch | prompt / slots | eager | Inductor | fusekit | fusekit vs Inductor | sites | "
          "max abs logits fusekit - Inductor | eager - Inductor |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['batch']} | {r['prompt']}/{r['slots']} | {r['ms']['eager']:.3f} | "
                  f"{r['ms']['inductor']:.3f} | {r['ms']['fusekit']:.3f} | {r['speedup']:.2f}x | "
                  f"{', '.join(f'{k} x{v}' for k, v in r['sites'].items()) or '-'} | {r['err_fusekit']:.2e} | "
                  f"{r['err_eager']:.2e} |")
    (out / "prefill_cache.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f"{r['model']} b{r['batch']}" for r in rows]
        ax.bar(labels, [r["speedup"] for r in rows], color="tab:green")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("Inductor ms / fusekit ms")
        ax.set_title(f"{rows[0]['prompt']}-token prompt into a {rows[0]['slots']}-slot static cache")
        fig.tight_layout()
        fig.savefig(out / "prefill_cache.png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
