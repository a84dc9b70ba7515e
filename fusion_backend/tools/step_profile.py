"""``fusekit profile --phase decode``: where a decode step's time goes. One decode step (bench's Step: a StaticCache,
position `position`) compiled by Inductor and by fusekit, replayed as a CUDA graph under torch.profiler: the kernels
of one step in launch order, their time per step grouped by kernel, the kernel count per step and per decoder layer,
the time the GPU ran no kernel (launch gaps; with programmatic dependent launch kernels may overlap, so busy time is
the union of their intervals), and the step's byte floor. Writes decode_profile.md/.json and a Chrome trace per
backend (the timeline itself), and a plot of each step's time by kernel category."""
from __future__ import annotations

import json
import pathlib
import re
import statistics
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from . import models
from .cuda_graphs import capture
from .decode_bench import Step, _compile, copy_bandwidth, first_call
from .profile import category

REPLAYS = 20


def _short(name: str) -> str:
    """A kernel's name without template arguments and parameter lists (`void f<T, 64>(Params)` -> `f`)."""
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return re.sub(r"^.*::", "", "".join(out).strip()) or name[:60]


def _union_us(spans: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy


def timeline(kernels: list[tuple[float, float, str]], replays: int, layers: int) -> dict[str, Any]:
    """Per-step summary of the kernels of `replays` replays of one graph: (start us, end us, name) each."""
    kernels = sorted(kernels)
    per = len(kernels) / replays
    per_name: dict[str, list[float]] = defaultdict(list)
    for s, e, n in kernels:
        per_name[n].append(e - s)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    busy = _union_us([(s, e) for s, e, _ in kernels])
    rows = sorted(({"kernel": n, "short": _short(n), "category": category(n), "per_step": len(ts) / replays,
                    "us_per_step": sum(ts) / replays, "us_median": statistics.median(ts)}
                   for n, ts in per_name.items()), key=lambda r: -r["us_per_step"])
    first = round(per)  # one step's kernels in launch order (the first replay)
    order = [{"short": _short(n), "us": e - s, "gap_before_us": (s - kernels[i - 1][1]) if i else 0.0}
             for i, (s, e, n) in enumerate(kernels[:first])]
    return {"kernels_per_step": per, "kernels_per_layer": per / layers if layers else None,
            "span_us_per_step": span / replays, "busy_us_per_step": busy / replays,
            "idle_us_per_step": (span - busy) / replays, "by_kernel": rows, "one_step": order}


def _profile_replays(g: torch.cuda.CUDAGraph, replays: int, trace: pathlib.Path) -> list[tuple[float, float, str]]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("## ", "Torch-Compiled"))
            and e.time_range.end > e.time_range.start]


def profile_step(name: str, batch: int, position: int, out: pathlib.Path, enable: tuple[str, ...] = (),
                 disable: tuple[str, ...] = (), replays: int = REPLAYS, bw: float | None = None) -> dict[str, Any]:
    from triton.testing import do_bench

    st = Step(name, "cuda", batch, 4096)
    layers = getattr(st.model.config, "num_hidden_layers", 0) or 0
    floor_bytes = st.weight_bytes() + st.kv_bytes(position)
    res: dict[str, Any] = {**st.desc, "position": position, "cache_len": st.cache_len, "layers": layers,
                           "floor_ms": floor_bytes / bw * 1e3 if bw else None, "backends": {}}
    with torch.no_grad():
        torch._dynamo.reset()
        for be in ("inductor", "fusekit"):
            fn = _compile(be, st.model, False, enable, disable)
            first_call(st, fn, position, False)
            st.at(position)
            step = st.repeated(fn)
            step()  # a sliding window's length turns symbolic on the second call (see decode_bench)
            g = capture(step)
            if g is None:
                res["backends"][be] = {"error": "no CUDA graph"}
                continue
            ms = do_bench(g.replay, warmup=25, rep=100, return_mode="median")
            kernels = _profile_replays(g, replays, out / f"trace_decode_{name}_b{batch}_{be}.json")
            res["backends"][be] = {"step_ms": ms, **timeline(kernels, replays, layers)}
            del g
        torch._dynamo.reset()
    return res


def markdown(results: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [f"# fusekit profile --phase decode: {env['device']}", "",
             f"torch {env['torch']}, transformers {env['transformers']}. One decode step against a StaticCache, "
             f"compiled by each backend and replayed as a CUDA graph; kernels from torch.profiler over {REPLAYS} "
             "replays. span = first kernel start to last kernel end per step; busy = the union of kernel intervals; "
             "idle = span - busy (launch gaps between dependent kernels; replays run back to back, so the gap "
             "between two steps counts too). Floor = weights + visible KV rows at the copy bandwidth "
             f"({(env.get('copy_gbps') or 0):,.0f} GB/s).", "",
             "| model | batch | position | backend | step ms | floor share | kernels / step | / layer | busy us | "
             "idle us |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for be, b in r["backends"].items():
            if "error" in b:
                lines.append(f"| {r['model']} | {r['batch']} | {r['position']} | {be} | {b['error']} |||||||")
                continue
            share = f"{r['floor_ms'] / b['step_ms']:.0%}" if r.get("floor_ms") else "-"
            lines.append(f"| {r['model']} | {r['batch']} | {r['position']} | {be} | {b['step_ms']:.3f} | {share} | "
                         f"{b['kernels_per_step']:.0f} | {b['kernels_per_layer'] or 0:.1f} | "
                         f"{b['busy_us_per_step']:.0f} | {b['idle_us_per_step']:.0f} |")
    for r in results:
        for be, b in r["backends"].items():
            if "error" in b:
                continue
            lines += ["", f"## {r['model']} batch {r['batch']} at {r['position']}: {be}, by kernel", "",
                      "| kernel | category | per step | us per step | median us | share of busy |",
                      "|---|---|---|---|---|---|"]
            for k in b["by_kernel"]:
                share = k["us_per_step"] / max(b["busy_us_per_step"], 1e-9)
                lines.append(f"| `{k['short'][:60]}` | {k['category']} | {k['per_step']:.0f} | "
                             f"{k['us_per_step']:.1f} | {k['us_median']:.1f} | {share:.0%} |")
            n = 2 * round(b["kernels_per_layer"] or 0) + 6  # the embedding's kernels and the first two layers
            lines += ["", f"The step's first {n} kernels in launch order (us; gap: since the previous kernel ended, "
                      "negative where programmatic dependent launch overlapped them): "
                      + ", ".join(f"{k['short'][:40]} {k['us']:.1f} ({k['gap_before_us']:+.1f})"
                                  for k in b["one_step"][:n])]
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: pathlib.Path) -> None:
    """A bar per (model, batch, backend): its kernels' time per step stacked by category, the step's time and floor
    marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{r['model']} b{r['batch']} {be}", b, r.get("floor_ms")) for r in results
            for be, b in r["backends"].items() if "error" not in b]
    cats = sorted({k["category"] for _, b, _ in bars for k in b["by_kernel"]})
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.5))
    left = [0.0] * len(bars)
    for c in cats:
        widths = [sum(k["us_per_step"] for k in b["by_kernel"] if k["category"] == c) / 1e3 for _, b, _ in bars]
        ax.barh(range(len(bars)), widths, left=left, label=c)
        left = [x + w for x, w in zip(left, widths)]
    for i, (_, b, floor) in enumerate(bars):
        ax.plot([b["step_ms"]], [i], "k|", ms=14)
        if floor:
            ax.plot([floor], [i], "rx")
    ax.set_yticks(range(len(bars)), [n for n, _, _ in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per decode step (bars: kernels by category; |: the step; x: byte floor)")
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(names: list[str], batches: tuple[int, ...], position: int, out: pathlib.Path, enable: tuple[str, ...] = (),
          disable: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    from .e2e import environment

    bad = [n for n in names if n not in models.MODELS or models.MODELS[n].encoder]
    if bad:
        raise SystemExit(f"fusekit profile --phase decode: not a decoder of fusekit's models: {', '.join(bad)}")
    if not torch.cuda.is_available():
        raise SystemExit("fusekit profile --phase decode times CUDA graphs: it needs a GPU")
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    bw = copy_bandwidth("cuda")
    env["copy_gbps"] = bw / 1e9
    results: list[dict[str, Any]] = []
    for i, name in enumerate(names, 1):
        for b in batches:
            print(f"[{i}/{len(names)}] {name} batch {b} at {position}", flush=True)
            results.append(profile_step(name, b, position, out, enable, disable, bw=bw))
            for be, r in results[-1]["backends"].items():
                if "error" not in r:
                    print(f"  {be:8s} {r['step_ms']:.3f} ms, {r['kernels_per_step']:.0f} kernels "
                          f"({r['kernels_per_layer'] or 0:.1f} a layer), idle {r['idle_us_per_step']:.0f} us",
                          flush=True)
            (out / "decode_profile.json").write_text(json.dumps({"env": env, "steps": results}, indent=1, default=str))
            (out / "decode_profile.md").write_text(markdown(results, env))
    plot(results, out / "decode_profile.png")
    print()
    print(markdown(results, env))
    print(f"wrote {out / 'decode_profile.md'}, .json, .png and Chrome traces "
          f"{out}/trace_decode_<model>_b<batch>_<backend>.json")
    return results
