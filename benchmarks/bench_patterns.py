"""Measures every elementwise and quantize rule that has a CUDA kernel, in each of its dtypes, at five sizes (100K to
50M elements): eager PyTorch, Inductor (torch.compile) and fusekit, with a device-to-device copy of the same bytes
as the bandwidth ceiling; ms (median and spread over --rounds rounds in which copy, Inductor and fusekit take
turns), GB/s, % of the copy bandwidth and speed-ups. Sizes that fit in half the L2 are timed hot, as replays of a
CUDA graph of back-to-back calls (GPU time, not launch overhead); larger ones over replays of a one-call CUDA graph
after an L2 flush before every run (--flush clean: a flush that leaves the L2 clean, the default; --flush zero:
triton.testing.do_bench's own, whose dirty lines are written back inside the next timed call). Generated from
the rule tables; the CUDA defaults of these rules (`cuda_default`, `cuda_min_numel` in patterns/) come from its
figures. Needs a CUDA GPU. Writes bench.md, bench.json and bench.png under --out.

    python benchmarks/bench_patterns.py --out out/ [--dtypes float16,bfloat16] [--patterns quantize] [--sizes N,...]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

import fusion_backend
from fusion_backend import _ext, table
from fusion_backend.report import no_compile_caches
from fusion_backend.tools.cuda_graphs import capture

SIZES = [100_000, 1_000_000, 5_000_000, 20_000_000, 50_000_000]
COLS = 4096  # rows of 4096: bias, per-channel and per-token patterns see a realistic hidden size


def nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(map(nbytes, x))
    return 0


def copy_bytes(moved: int) -> int:
    """The size of the device-to-device copy that stands for `moved` bytes (read + write): half of it, rounded
    down to 4 KiB (% of copy compares GB/s, so the few bytes less do not count). cudaMemcpy is slower for
    some other sizes: with the per-row scales of dyn_quant_* and quant_i8_per_row, a 30,014,528-byte copy took
    0.0222 ms against 0.0192 ms for 30,011,392 bytes (H200; results/h200_copy_sizes.txt), which
    inflated those rows' % of copy."""
    return max(4096, moved // 2 // 4096 * 4096)


def hot_timer(fn, inner: int = 20):
    """Per-call GPU time with the inputs in L2 (as after their producer): `inner` back-to-back calls in one
    CUDA graph; the returned function times `reps` replays. Timed call by call instead, a compiled
    function's host overhead (tens of microseconds) would be all that these sizes measure."""
    g = capture(fn, inner)
    if g is None:  # call by call: host-bound at these sizes
        return lambda reps: _time_calls(fn, reps * inner // 5)
    return lambda reps: [t / inner for t in _time_calls(g.replay, reps)]


def _time_calls(fn, reps: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


_FLUSH_BUF: list = []


def clean_flushed(fn, warmup: float = 25, rep: float = 200) -> list[float]:
    """triton.testing.do_bench's loop (time budgets in ms, the L2 flushed before every timed call, events
    around the call alone; per-call times) with another flush. do_bench zeroes a 256 MB buffer, which leaves
    the L2 full of dirty lines; their write-back then runs inside the timed call. On an H200 that added 2.9 us
    to per-row INT8 at 20M fp16 (19.87 -> 16.93 us), 5.1 us to exp((x+y)*2) and 2.2 us to the D2D copy of the
    same bytes, so % of copy read 1-4 points low, unevenly.
    Reading the buffer evicts as well and leaves clean lines (zeroing first, then reading: the same times)."""
    if not _FLUSH_BUF:
        _FLUSH_BUF.extend([torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda"),
                           torch.empty((), dtype=torch.int32, device="cuda")])
    buf, sink = _FLUSH_BUF

    def flush():
        torch.amax(buf, dim=0, out=sink)

    def timed(n: int) -> list[float]:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in ev:
            flush()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in ev]

    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):  # as do_bench: the budgets count the flushes too
        flush()
        fn()
    b.record()
    torch.cuda.synchronize()
    est = max(1e-3, a.elapsed_time(b) / 5)
    timed(max(1, int(warmup / est)))
    return timed(max(1, int(rep / est)))


def timer(fn, hot: bool, graph: bool = True, flush: str = "zero"):
    """A function of a share (0, 1] of one measurement's budget that returns per-call times (ms): graph
    replays for L2-resident sizes, else runs after an L2 flush (over graph replays unless graph=False):
    triton.testing.do_bench (flush="zero") or clean_flushed (flush="clean")."""
    if hot:
        replays = hot_timer(fn)
        return lambda share=1.0: replays(max(10, round(50 * share)))
    from triton.testing import do_bench  # here, so the scripts can redraw plots where triton is absent

    # One call per graph replay: a compiled call's host work (guards, launches: tens of microseconds, more on
    # a busy host) can outlast do_bench's L2 flush and then lands in the timed interval, one launch cannot.
    g = capture(fn, 1) if graph else None
    run = g.replay if g is not None else fn
    if flush == "clean":
        return lambda share=1.0: clean_flushed(run, warmup=25, rep=max(40, round(200 * share)))
    return lambda share=1.0: do_bench(run, warmup=25, rep=max(40, round(200 * share)), return_mode="all")


def measure(fn, hot: bool, graph: bool = True, flush: str = "zero") -> tuple[float, float]:
    ts = timer(fn, hot, graph, flush)()
    return statistics.median(ts), statistics.pstdev(ts)


def measure_rounds(fns: dict, hot: bool, rounds: int, flush: str = "zero",
                   ungraphed: tuple = ()) -> dict[str, list[float]]:
    """Per-round medians of each function, the functions taking turns in every round, so that a drift of
    clocks or a busy host between rounds reaches all of them (the fusekit / Inductor ratio, % of copy).
    Functions named in `ungraphed` are timed as called."""
    timers = {name: timer(fn, hot, name not in ungraphed, flush) for name, fn in fns.items()}
    meds = {name: [] for name in fns}
    for _ in range(rounds):
        for name, t in timers.items():
            meds[name].append(statistics.median(t(1.0 / rounds)))
    return meds


def case_for(p, n: int) -> tuple:
    if p.id.startswith("batched_matmul"):
        return None
    return (max(1, n // COLS), COLS)


def gpu_output(script: str, out: str) -> tuple[pathlib.Path, str]:
    """Exit unless there is a GPU; the output folder (created) and the device line for the reports."""
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU")
    path = pathlib.Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path, f"{torch.cuda.get_device_name()}, torch {torch.__version__}"


def save(out: pathlib.Path, stem: str, data: dict, md: str, plot_fn) -> None:
    """<stem>.json, <stem>.md and <stem>.png (drawn by plot_fn(path)) under `out`."""
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(md)
    plot_fn(out / f"{stem}.png")


def compiled(p, backend: str, fn=None):
    """p's search function (or `fn`, one of its variants) under torch.compile."""
    torch._dynamo.reset()
    if backend == "fusekit":  # name the pattern, so rules that are off by default are measured too
        backend = fusion_backend.backend(options={"patterns": [p.id]})
    return torch.compile(fn or p.search_fn(), backend=backend, dynamic=False)


def run(patterns, dtypes, sizes, out: pathlib.Path, rounds: int = 3, flush: str = "clean") -> list[dict]:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows, todo = [], [(p, dt, n) for p in patterns for dt in p.dtypes if dt in dtypes or p.dtypes == (torch.int8,)
                      for n in sizes]
    t0 = time.time()
    for i, (p, dt, n) in enumerate(todo, 1):
        args = p.make_args(case_for(p, n), dt, "cuda")
        ref = p.eager(*args)
        moved = nbytes([a for a in args if isinstance(a, torch.Tensor)]) + nbytes(ref)
        hot = moved < l2 // 2
        src = torch.empty(copy_bytes(moved), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ind, fk = compiled(p, "inductor"), None
        ind(*args)
        with fusion_backend.stats.collect() as recs, no_compile_caches():  # a cache hit skips the pass: no count
            fk = compiled(p, "fusekit")
            fk(*args)
        fused = sum(r.sites[p.id] for r in recs) > 0
        numel = math.prod(case_for(p, n))
        res = {"pattern": p.id, "dtype": str(dt)[6:], "numel": numel, "bytes": moved,
               "where": "L2" if hot else "HBM", "fused": fused, "default": p.on_by_default(dt),
               "fires_by_default": p.on_by_default(dt) and numel >= p.min_numel(dt)}
        # The copy at HBM sizes is timed as called: in a CUDA graph, a device-to-device copy becomes a memcpy
        # node that ran at 60-75% of the called copy's speed at some sizes, which would inflate
        # every kernel's % of copy. Its launch (a few us) never outlasts the L2 flush. It takes its turn in
        # the rounds: measured once per row, it varied by 5% between runs (0.0189 vs 0.0198 ms at 20M).
        res["eager"], res["eager_std"] = measure(lambda: p.eager(*args), hot, flush=flush)
        for name, meds in measure_rounds({"copy": lambda: dst.copy_(src), "inductor": lambda: ind(*args),
                                          "fusekit": lambda: fk(*args)}, hot, rounds, flush,
                                         ungraphed=("copy",)).items():  # the median of the rounds; std across them
            res[name], res[name + "_std"] = statistics.median(meds), statistics.pstdev(meds)
            res[name + "_rounds"] = meds
        res["gbps"] = moved / res["fusekit"] / 1e6
        res["copy_gbps"] = 2 * src.numel() / res["copy"] / 1e6
        res["pct_copy"] = 100 * res["gbps"] / res["copy_gbps"]
        res["vs_eager"] = res["eager"] / res["fusekit"]
        res["vs_inductor"] = res["inductor"] / res["fusekit"]
        res["inductor_vs_eager"] = res["eager"] / res["inductor"]
        rows.append(res)
        print(f"[{i}/{len(todo)} {time.time() - t0:5.0f}s] {p.id:34s} {res['dtype']:8s} {res['numel']:>10,} "
              f"{res['where']:3s} eager {res['eager']:.4f} ind {res['inductor']:.4f} fk {res['fusekit']:.4f} ms "
              f"{res['pct_copy']:5.1f}% copy  fk/ind {1 / res['vs_inductor']:.2f}{'' if fused else '  (NOT FUSED)'}",
              flush=True)
        del args, ref, src, dst, ind, fk
    return rows


def headline_dyn_quant(flush: str = "clean") -> dict:
    """Dynamic per-token INT8 on [16384, 4096] fp16, the headline shape."""
    p = table.by_id("quantize.dyn_quant_i8")
    args = p.make_args((16384, 4096), torch.float16, "cuda")
    ind, fk = compiled(p, "inductor"), compiled(p, "fusekit")
    ind(*args), fk(*args)
    t = {"eager": measure(lambda: p.eager(*args), hot=False, flush=flush)[0]}
    t.update({k: statistics.median(m) for k, m in measure_rounds(
        {"inductor": lambda: ind(*args), "fusekit": lambda: fk(*args)}, hot=False, rounds=5, flush=flush).items()})
    moved = 16384 * 4096 * 3 + 16384 * 4
    return {**t, "speedup_vs_inductor": t["inductor"] / t["fusekit"], "fusekit_gbps": moved / t["fusekit"] / 1e6}


def markdown(rows: list[dict], head: dict, device: str) -> str:
    out = [f"# fusekit pattern benchmark\n\n{device}\n"]
    for pid in dict.fromkeys(r["pattern"] for r in rows):
        for dt in dict.fromkeys(r["dtype"] for r in rows if r["pattern"] == pid):
            on = table.by_id(pid).on_by_default(getattr(torch, dt))
            out.append(f"\n## {pid} ({dt}){'' if on else ' -- off by default on CUDA'}\n\nRAW EXECUTION TIME\n")
            out.append("| Memory | Data (MB) | # Elements | PyTorch (ms) | torch.compile (ms) | fusekit (ms) | "
                       "fusekit GB/s | % of copy |\n|---|---|---|---|---|---|---|---|")
            sel = [r for r in rows if r["pattern"] == pid and r["dtype"] == dt]
            for r in sel:
                out.append(f"| {'L2 Cache' if r['where'] == 'L2' else 'HBM'} | {r['bytes'] / 1e6:.1f} | "
                           f"{r['numel']:,} | {r['eager']:.4f} ± {r['eager_std']:.4f} | "
                           f"{r['inductor']:.4f} ± {r['inductor_std']:.4f} | {r['fusekit']:.4f} ± "
                           f"{r['fusekit_std']:.4f}{'' if r['fused'] else ' (not fused)'} | {r['gbps']:.0f} | "
                           f"{r['pct_copy']:.1f}% |")
            out.append("\nRELATIVE SPEEDUP\n\n| # Elements | compile/PyTorch | fusekit/PyTorch | fusekit/compile |"
                       "\n|---|---|---|---|")
            out += [f"| {r['numel']:,} | {r['inductor_vs_eager']:.2f}x | {r['vs_eager']:.2f}x | "
                    f"{r['vs_inductor']:.2f}x |" for r in sel]
    if head:
        out.append(f"\n## dynamic per-token INT8, [16384, 4096] fp16\n\neager {head['eager']:.4f} ms, Inductor "
                   f"{head['inductor']:.4f} ms, fusekit {head['fusekit']:.4f} ms: **{head['speedup_vs_inductor']:.2f}x** "
                   f"over Inductor ({head['fusekit_gbps']:.0f} GB/s)\n")
    return "\n".join(out)


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(15, 6))
    for key in dict.fromkeys((r["pattern"], r["dtype"]) for r in rows):
        sel = [r for r in rows if (r["pattern"], r["dtype"]) == key]
        x = [r["numel"] for r in sel]
        a.plot(x, [r["vs_inductor"] for r in sel], marker="o", label=f"{key[0]} {key[1]}")
        b.plot(x, [r["pct_copy"] for r in sel], marker="o", label=f"{key[0]} {key[1]}")
    a.axhline(1.0, color="k", lw=1)
    a.set(xscale="log", xlabel="elements", ylabel="Inductor time / fusekit time", title="speedup over Inductor")
    b.axhline(90, color="r", lw=1, ls="--")
    b.set(xscale="log", xlabel="elements", ylabel="% of device-to-device copy bandwidth",
          title="fusekit bandwidth vs copy")
    a.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--patterns", default=None, help="comma-separated ids or families")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved copy/Inductor/fusekit rounds per row")
    ap.add_argument("--flush", choices=("clean", "zero"), default="clean",
                    help="L2 flush at HBM sizes: clean (read 256 MB; default) or zero (do_bench's)")
    a = ap.parse_args()
    out, device = gpu_output("bench_patterns", a.out)
    ids = table.select(a.patterns.split(",") if a.patterns else None)
    pats = [table.by_id(i) for i in ids if not _ext.missing_cuda_kernel(table.by_id(i).op, torch.device("cuda"))
            and table.by_id(i).fixtures.gpu_cases is None]  # shaped ops (attention) have their own benchmark
    dtypes = {getattr(torch, d) for d in a.dtypes.split(",")}
    print(f"{device}: {len(pats)} patterns", flush=True)
    rows = run(pats, dtypes, [int(s) for s in a.sizes.split(",")], out, a.rounds, a.flush)
    head = headline_dyn_quant(a.flush) if any(p.id == "quantize.dyn_quant_i8" for p in pats) else {}
    device += f", L2 flush: {a.flush}"
    save(out, "bench", {"device": device, "flush": a.flush, "rows": rows, "dyn_quant_headline": head},
         markdown(rows, head, device),
         lambda path: plot(rows, path))
    worst = sorted(rows, key=lambda r: r["vs_inductor"])[:8]
    print("\nslowest vs Inductor:", *[f"  {r['pattern']} {r['dtype']} {r['numel']:,}: {r['vs_inductor']:.2f}x"
                                     for r in worst], sep="\n")
    slower = [r for r in rows if r["fires_by_default"] and r["vs_inductor"] < 1.0]
    print(f"rows where a rule fires by default: {sum(r['fires_by_default'] for r in rows)}; slower than Inductor:",
          *[f"  {r['pattern']} {r['dtype']} {r['numel']:,}: fk/ind {1 / r['vs_inductor']:.3f} rounds ind "
            f"{r['inductor_rounds']} fk {r['fusekit_rounds']}" for r in slower] or ["  none"], sep="\n")
    big = [r for r in rows if r["numel"] >= 16_000_000]
    if big:
        print(f"min % of copy at >=16M elements: {min(r['pct_copy'] for r in big):.1f}%")
    if head:
        print(f"dyn_quant_i8 [16384,4096] fp16: {head['speedup_vs_inductor']:.2f}x vs Inductor "
              f"({head['inductor']:.4f} -> {head['fusekit']:.4f} ms)")


if __name__ == "__main__":
    main()
