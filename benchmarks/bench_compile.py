"""Measures what fusekit costs at compile time: the first call of each `fusekit bench` model compiled from scratch
(FX-graph and AOTAutograd caches off, Dynamo reset) by Inductor and by fusekit, prefill and decode-step graphs,
with and without CUDA graphs (--modes), and fusekit's own pass: its seconds, its share of the compile, and its
match attempts per graph node. An untimed Inductor compile of the model comes first, so both sides find the same
Triton kernels already built; with --rounds N the figure is the median of N first calls, Inductor and fusekit
alternating. fusekit's traced rules come from its disk cache (filled by `python -m fusion_backend.build` or an
earlier run); --cold-patterns empties it first, to time a first compile that traces them. Without a GPU (or
--cpu): the tiny configurations on CPU with cpu_reference. Writes compile.md, compile.json and compile.png under
--out.

    python benchmarks/bench_compile.py [--models gpt2,llama] [--phases prefill,decode] [--modes default,reduce-overhead]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import statistics
import time

import torch

from fusion_backend import forms, stats
from fusion_backend.tools import models
from fusion_backend.backend import backend as fusekit_backend
from fusion_backend.report import Report, no_compile_caches

DECODERS = [n for n, s in models.MODELS.items() if not s.encoder]


def build(name: str, phase: str, device: str, batch: int | None = None):
    """(callable, kwargs, description) for one model and phase (decode: at `batch` sequences, default 1)."""
    if phase == "decode":
        step, desc = models.decode_step(name, device, batch=batch)
        return step, {}, desc
    model, inputs, desc = models.make(name, device)
    return model, inputs, desc


def first_call(fn, kwargs, backend, mode: str, cpu: bool) -> tuple[float, Report]:
    """Seconds to compile and run the first call(s) from scratch, and fusekit's records for it."""
    cudagraphs = mode == "reduce-overhead"
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, mode=None if mode == "default" else mode)
    with stats.collect() as records, no_compile_caches(), torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(3 if cudagraphs else 1):  # CUDA graphs record on a later call
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            compiled(**kwargs)
        if not cpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    torch._dynamo.reset()
    return seconds, Report(list(records))


def run(names, phases, modes, cpu: bool, log=print, batches=(None,), rounds: int = 1) -> list[dict]:
    device = "cpu" if cpu else "cuda"
    opts = {"cpu_reference": True} if cpu else {}
    rows = []
    for name in names:
        for phase in phases:
            if phase == "decode" and name not in DECODERS:
                continue
            for batch in (batches if phase == "decode" else (None,)):
                rows += _one(name, phase, modes, cpu, opts, device, batch, rounds, log)
    return rows


def _one(name, phase, modes, cpu, opts, device, batch, rounds, log) -> list[dict]:
    """Inductor and fusekit alternating, `rounds` times each (the median of each kept, and every round: the first
    fusekit compile of a process also makes its rules' pattern-matcher entries, which later compiles reuse)."""
    rows = []
    fn, kwargs, desc = build(name, phase, device, batch)
    first_call(fn, kwargs, "inductor", "default", cpu)  # warm: Triton kernels, imports
    for mode in modes:
        if cpu and mode == "reduce-overhead":
            continue
        ind, fk, passes = [], [], []
        for _ in range(rounds):
            ind.append(first_call(fn, kwargs, "inductor", mode, cpu)[0])
            s, rep = first_call(fn, kwargs, "fusekit" if not opts else fusekit_backend(options=opts), mode, cpu)
            fk.append(s)
            passes.append(rep.pass_s)
        ind_s, fk_s = statistics.median(ind), statistics.median(fk)
        nodes = sum(g.nodes_before for g in rep.graphs)
        row = {"model": name, "phase": phase, "mode": mode, "what": desc["what"], "dtype": desc["dtype"],
               "batch": desc["batch"], "inductor_s": ind_s, "fusekit_s": fk_s, "ratio": fk_s / ind_s,
               "pass_s": rep.pass_s, "pass_share": rep.pass_s / fk_s, "graphs": len(rep.graphs),
               "nodes": nodes, "match_attempts": rep.match_attempts,
               "attempts_per_node": rep.match_attempts / max(nodes, 1),
               "sites": {k: v for k, v in sorted(rep.sites.items()) if v},
               "inductor_rounds": ind, "fusekit_rounds": fk, "pass_rounds": passes}
        rows.append(row)
        log(f"  {name:8s} {phase:7s} {mode:15s} Inductor {ind_s:6.1f} s  fusekit {fk_s:6.1f} s "
            f"({row['ratio']:.2f}x)  pass {rep.pass_s:5.2f} s ({row['pass_share']:.1%})  "
            f"{rep.match_attempts:,} attempts / {nodes:,} nodes  sites {row['sites']}  rounds: "
            + ", ".join(f"{i:.1f} -> {f:.1f} s (pass {p:.2f})" for i, f, p in zip(ind, fk, passes)))
    del fn, kwargs
    return rows


def markdown(rows: list[dict], env: str) -> str:
    lines = [f"# fusekit compile time: {env}", "",
             "First call from scratch (FX-graph and AOTAutograd caches off, Triton kernels built by an earlier "
             "untimed Inductor compile). pass = fusekit's post-grad pass, all graphs of the model. Medians of the "
             "rounds (Inductor and fusekit alternating); the last column is each round, Inductor -> fusekit (pass): "
             "the first fusekit compile of the process also makes its rules' entries.", "",
             "| model | phase | mode | Inductor s | fusekit s | fusekit / Inductor | pass s | pass share | "
             "match attempts / nodes | sites | rounds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sites = ", ".join(f"{k.split('.')[-1]} x{v}" for k, v in r["sites"].items()) or "-"
        lines.append(f"| {r['model']} ({r['dtype']}, batch {r['batch']}) | {r['phase']} | {r['mode']} | "
                     f"{r['inductor_s']:.1f} | {r['fusekit_s']:.1f} | {r['ratio']:.2f}x | {r['pass_s']:.2f} | "
                     f"{r['pass_share']:.1%} | {r['match_attempts']:,} / {r['nodes']:,} | {sites} | "
                     + "; ".join(f"{i:.1f} -> {f:.1f} ({p:.2f})" for i, f, p in
                                 zip(r["inductor_rounds"], r["fusekit_rounds"], r["pass_rounds"])) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['phase']}\n{'ro' if r['mode'] != 'default' else 'default'}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ratio"] for r in rows], 0.4, label="fusekit / Inductor compile time")
    ax.bar([x + 0.2 for x in xs], [r["pass_share"] for r in rows], 0.4, label="fusekit pass share of its compile")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.1, color="r", lw=0.8, ls="--", label="1.1x target")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(models.MODELS))
    ap.add_argument("--phases", default="prefill,decode")
    ap.add_argument("--modes", default="default,reduce-overhead")
    ap.add_argument("--cpu", action="store_true", help="tiny configurations on CPU even with a GPU")
    ap.add_argument("--cold-patterns", action="store_true", help="empty fusekit's traced-pattern cache first")
    ap.add_argument("--out", default="out/compile")
    ap.add_argument("--batches", default="", help="decode graphs: sequences per step, comma-separated (default: 1; "
                    "the tiny configuration's on CPU)")
    ap.add_argument("--rounds", type=int, default=1, help="Inductor / fusekit first calls alternating, median kept")
    a = ap.parse_args()
    cpu = a.cpu or not torch.cuda.is_available()
    if a.cold_patterns:
        shutil.rmtree(forms.cache_dir(), ignore_errors=True)
    env = "CPU, tiny configurations" if cpu else torch.cuda.get_device_name()
    env += f", torch {torch.__version__}"
    print(f"bench_compile on {env}", flush=True)
    t0 = time.time()
    rows = []
    names = a.models.split(",")
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)} {time.time() - t0:5.0f}s] {name}", flush=True)
        rows += run([name], a.phases.split(","), a.modes.split(","), cpu, log=lambda s: print(s, flush=True),
                    batches=[int(b) for b in a.batches.split(",")] if a.batches else [None], rounds=a.rounds)
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)  # written after every model: a long run keeps what it has
        (out / "compile.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        (out / "compile.md").write_text(markdown(rows, env))
    plot(rows, pathlib.Path(a.out) / "compile.png")
    print()
    print(markdown(rows, env))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
