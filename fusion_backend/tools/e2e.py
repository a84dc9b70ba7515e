"""``fusekit bench``: end-to-end transformer benchmark (eager / Inductor / fusekit / fusekit with CUDA
graphs), with latency, tokens/s, compile time, peak memory, error against eager and fusekit's match
report. Writes a terminal table, bench.md, bench.json and bench.png. Without a GPU, ``fusekit bench`` runs
flow.py instead: a flow check of the tiny configurations with fusekit's reference implementations, nothing timed."""
from __future__ import annotations

import json
import pathlib
import statistics
import time
from typing import Any, Callable

import torch

from .. import stats
from . import models
from ..backend import backend as fusekit_backend
from ..report import Report, no_compile_caches

MODES = ("eager", "inductor", "inductor-ro", "fusekit", "fusekit-ro")


def graphed(mode: str) -> bool:
    """A mode compiled with mode="reduce-overhead": replayed as CUDA graphs (a GPU only)."""
    return mode.endswith("-ro")


def fusekit_options(cpu: bool, enable: tuple[str, ...] = (), disable: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The benches' fusekit options: the CPU references where there is no GPU, and the opt-in (or off) rules named."""
    opts = {**({"cpu_reference": True} if cpu else {}), **({"enable": list(enable)} if enable else {}),
            **({"disable": list(disable)} if disable else {})}
    return opts or None


def _compiled(mode: str, model: Any, cpu: bool, enable: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Each mode compiles its own entry for the model's forward (Dynamo guards on the backend), so the
    modes can be timed side by side. `enable`: opt-in rules fusekit also fires."""
    opts = fusekit_options(cpu, enable)
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    if mode == "inductor-ro":
        return torch.compile(model, mode="reduce-overhead")
    if mode == "fusekit":
        return torch.compile(model, backend=fusekit_backend(options=opts))
    if mode == "fusekit-ro":
        return torch.compile(model, backend=fusekit_backend(mode="reduce-overhead", options=opts))
    raise ValueError(mode)


ROUNDS = 5  # timing rounds, the modes interleaved in each: a slow spell of the host hits every mode alike


def _time(fn: Callable[[], Any], cpu: bool, cudagraphs: bool, rep_ms: int = 300) -> float:
    """Median ms: triton's do_bench on the GPU (CUDA graphs: marked steps), a timed loop on CPU."""
    if cpu:
        for _ in range(2):
            fn()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    from triton.testing import do_bench

    if cudagraphs:
        def step() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return fn()
        return do_bench(step, warmup=25, rep=rep_ms, return_mode="median")
    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def _host_ms(fn: Callable[[], Any], cudagraphs: bool) -> float:
    """Host time per call: the time for the call to return, the GPU idle at the start. Near the GPU time a
    row is host-bound (launch overhead); far below it, GPU-bound."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        fn()
    host = (time.perf_counter() - t0) / 3 * 1e3
    torch.cuda.synchronize()
    return host


GRAD_MODES = ("inference", "no_grad")


def grad_context(grad_mode: str) -> Any:
    """Serving code runs under inference_mode (Inductor then decomposes some SDPA calls that it sends to a
    fused kernel under no_grad) or no_grad."""
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"grad mode {grad_mode!r}; want one of {GRAD_MODES}")
    return torch.inference_mode() if grad_mode == "inference" else torch.no_grad()


def run_model(name: str, modes: tuple[str, ...], device: str, dtype: torch.dtype | None = None,
              batch: int | None = None, seq: int | None = None, log: Callable[[str], None] = print,
              grad_mode: str = "inference", quant: str | None = None, enable: tuple[str, ...] = ()) -> dict:
    """One model's forward under each mode; `quant`: quantized by torchao first (models.QUANT), every mode alike;
    `enable`: opt-in rules fusekit also fires."""
    cpu = device == "cpu"
    model, inputs, desc = models.make(name, device, dtype, batch, seq)
    if quant:
        models.quantize(model, quant)
    tokens = desc["batch"] * desc["seq"]
    res: dict[str, Any] = {**desc, "grad_mode": grad_mode, "quant": quant, "modes": {}}
    torch._dynamo.reset()
    compiled: dict[str, Callable[..., Any]] = {}
    with grad_context(grad_mode):
        ref = models.first_output(model(**inputs)).float()
        for mode in modes:
            if cpu and graphed(mode):
                continue  # CUDA graphs need a GPU
            f = _compiled(mode, model, cpu, enable)
            if not cpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            # cold compiles for Inductor and fusekit alike (a cache hit would also skip fusekit's pass)
            with stats.collect() as records, no_compile_caches():
                t0 = time.perf_counter()
                if graphed(mode):
                    torch.compiler.cudagraph_mark_step_begin()
                out = models.first_output(f(**inputs)).float().clone()
                if graphed(mode):  # CUDA graphs record on a later call
                    for _ in range(2):
                        torch.compiler.cudagraph_mark_step_begin()
                        out = models.first_output(f(**inputs)).float().clone()
                if not cpu:
                    torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated() / 2**20 if not cpu else None
            err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            r: dict[str, Any] = {"compile_s": compile_s, "peak_mib": peak, "max_rel_err_vs_eager": err}
            if mode.startswith("fusekit"):
                rep = Report(list(records))
                r["sites"] = {k: v for k, v in rep.sites.items() if v}
                r["errors"] = len(rep.errors)
                r["report"] = str(rep)
            res["modes"][mode] = r
            compiled[mode] = f
            log(f"  {name:8s} {grad_mode:9s} {mode:11s} compile {compile_s:6.1f} s  peak "
                f"{'-' if peak is None else f'{peak:,.0f} MiB':>10s}  rel err {err:.1e}"
                + (f"  fused {r['sites']}" if "sites" in r else ""))
        rounds: dict[str, list[float]] = {m: [] for m in compiled}
        for _ in range(ROUNDS):
            for mode, f in compiled.items():
                rounds[mode].append(_time(lambda: f(**inputs), cpu, graphed(mode), rep_ms=100))
        for mode, f in compiled.items():
            r = res["modes"][mode]
            ts = sorted(rounds[mode])
            r.update(ms=statistics.median(ts), ms_min=ts[0], ms_max=ts[-1], rounds_ms=rounds[mode],
                     host_ms=None if cpu else _host_ms(lambda: f(**inputs), graphed(mode)))
            r["tokens_per_s"] = tokens / r["ms"] * 1e3
            host = "-" if r["host_ms"] is None else f"{r['host_ms']:.3f}"
            log(f"  {name:8s} {grad_mode:9s} {mode:11s} {r['ms']:9.3f} ms (min {ts[0]:.3f}, max {ts[-1]:.3f}, "
                f"{ROUNDS} rounds)  host {host} ms  {r['tokens_per_s']:12,.0f} tok/s")
    compiled.clear()
    torch._dynamo.reset()
    speedups(res["modes"])
    if res["modes"].get("inductor", {}).get("ms") and "fusekit" in res["modes"]:
        res["compile_ratio_vs_inductor"] = res["modes"]["fusekit"]["compile_s"] / res["modes"]["inductor"]["compile_s"]
    del model
    if not cpu:
        torch.cuda.empty_cache()
    return res


def speedups(modes: dict[str, dict]) -> None:
    """Each mode's vs_inductor and vs_eager from the modes' ms: fusekit-ro (CUDA graphs) against inductor-ro, Inductor
    with CUDA graphs, where that ran (else against inductor); every other mode, inductor-ro included, against
    inductor."""
    base = modes.get("inductor", {}).get("ms")
    base_ro = modes.get("inductor-ro", {}).get("ms") or base
    for mode, m in modes.items():
        b = base_ro if graphed(mode) and mode != "inductor-ro" else base
        m["vs_inductor"] = b / m["ms"] if b else None
        m["vs_eager"] = modes["eager"]["ms"] / m["ms"] if "eager" in modes else None


def markdown(results: list[dict], env: dict) -> str:
    lines = [f"# fusekit bench: {env['device']}", "",
             f"torch {env['torch']}, transformers {env['transformers']}"
             + (f", torchao {env['torchao']}: every mode runs the model quantized by torchao ({env['quant']}: "
                f"{models.QUANT[env['quant']]})" if env.get("quant") else "")
             + (f"; fusekit with options={{'enable': {env['enable']}}}" if env.get("enable") else "")
             + f". Latency: the median of {ROUNDS} rounds in "
             f"which the modes take turns (each round's median from "
             f"{'triton do_bench' if env['cuda'] else 'a timed loop'}; min-max over the rounds); host ms = the time "
             "a call takes to return with the GPU idle (near the latency: host-bound); compile = first call(s), "
             "wall clock; "
             "vs Inductor: fusekit-ro (CUDA graphs) against inductor-ro where it ran; "
             "error = max|out - eager| / max|eager| on logits / last hidden state.", "",
             "| model | dtype | batch x seq | grad mode | mode | ms | min-max ms | host ms | tokens/s | vs Inductor | vs eager | compile s | peak MiB | rel err | fused sites |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for mode, r in res["modes"].items():
            vi = f"{r['vs_inductor']:.2f}x" if r.get("vs_inductor") else "-"
            ve = f"{r['vs_eager']:.2f}x" if r.get("vs_eager") else "-"
            peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:,.0f}"
            sites = ", ".join(f"{k.split('.')[-1]}x{v}" for k, v in r.get("sites", {}).items()) or "-"
            model = res["model"] + (f" ({res['quant']})" if res.get("quant") else "")
            lines.append(f"| {model} | {res['dtype']} | {res['batch']}x{res['seq']} | "
                         f"{res.get('grad_mode', 'no_grad')} | {mode} | {r['ms']:.3f} | "
                         f"{r.get('ms_min', r['ms']):.3f}-{r.get('ms_max', r['ms']):.3f} | "
                         f"{'-' if r.get('host_ms') is None else format(r['host_ms'], '.3f')} | "
                         f"{r['tokens_per_s']:,.0f} | {vi} | {ve} | {r['compile_s']:.1f} | {peak} | "
                         f"{r['max_rel_err_vs_eager']:.1e} | {sites} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if any(m in r["modes"] for r in results)]
    fig, ax = plt.subplots(figsize=(1.8 * len(results) + 2, 4))
    w = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [j + i * w for j in range(len(results))]
        ys = [r["modes"][mode]["vs_inductor"] if mode in r["modes"] and r["modes"][mode]["vs_inductor"] else 0
              for r in results]
        ax.bar(xs, ys, w, label=mode)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(results))],
                  [f"{r['model']}\n{r.get('grad_mode', '')}" for r in results])
    ax.set_ylabel("speed vs Inductor (higher is faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def environment() -> dict:
    import transformers

    cuda = torch.cuda.is_available()
    return {"device": torch.cuda.get_device_name() if cuda else "CPU (tiny configurations)", "cuda": cuda,
            "torch": torch.__version__, "transformers": transformers.__version__}


def bench(model_names: list[str], modes: tuple[str, ...], out: pathlib.Path, device: str | None = None,
          dtype: torch.dtype | None = None, batch: int | None = None, seq: int | None = None,
          grad_modes: tuple[str, ...] = ("inference",), quant: str | None = None,
          enable: tuple[str, ...] = ()) -> list[dict]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = environment()
    if enable:
        env["enable"] = list(enable)
    if quant:  # every mode runs the model quantized by torchao
        import torchao

        env.update(quant=quant, torchao=torchao.__version__)
    shown = [m for m in modes if not (device == "cpu" and graphed(m))]  # the modes that will have rows
    print(f"fusekit bench on {env['device']} (torch {env['torch']}): {', '.join(model_names)} x {', '.join(shown)}"
          + (f", quantized by torchao {env['torchao']} ({quant}: {models.QUANT[quant]})" if quant else ""), flush=True)
    results, t0 = [], time.time()
    for i, name in enumerate(model_names, 1):
        print(f"[{i}/{len(model_names)} {time.time() - t0:5.0f}s] {name}", flush=True)
        for gm in grad_modes:
            results.append(run_model(name, modes, device, dtype, batch, seq, log=lambda s: print(s, flush=True),
                                     grad_mode=gm, quant=quant, enable=enable))
        out.mkdir(parents=True, exist_ok=True)  # write after every model: a long run keeps what it has
        (out / "bench.json").write_text(json.dumps({"env": env, "results": results}, indent=1, default=str))
        (out / "bench.md").write_text(markdown(results, env))
    plot(results, out / "bench.png")
    print()
    print(markdown(results, env))
    print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}, {out / 'bench.png'}")
    return results
