"""``fusekit bench`` without a GPU (or with ``--cpu``): a flow check, not a benchmark.

fusekit's kernels are CUDA kernels. On a CPU its rules can still fire with ``options={"cpu_reference": True}``,
where each fused op runs its Python reference implementation: that is not meant to be fast, so nothing here is
timed. What it checks, on tiny configurations of the benchmark's models (``models.py``): which fusekit sites fire
in each model's graph, errors (sites skipped), near misses (sites a rule nearly matched, and the guard that said
no), and the output against eager: the prefill's logits / last hidden state, a decode step's logits against a
``StaticCache`` (and, with ``--generate``, the tokens of a greedy ``generate``).

The rest of each graph runs as ATen calls (Inductor's ``fallback_by_default``, where this torch has it): Dynamo,
AOTAutograd, Inductor's decompositions and graph passes and fusekit's pass run as on a GPU, but no C++ kernel is
generated or compiled (the slowest part of a CPU compile, and on a fresh machine one compiler run per kernel).
Inductor is not run as a mode of its own: the check is fusekit against eager.

Writes bench.md, bench.json, bench.png (prefill) and decode.md, decode.json, decode.png (decode), with the keys a GPU
run writes; what a CPU run does not measure (timings, memory, ratios) is null.
"""
from __future__ import annotations

import collections
import json
import pathlib
import time
import warnings
from typing import Any, Callable

import torch

from .. import stats
from ..backend import backend as fusekit_backend
from ..report import Report, near_miss_groups, no_compile_caches
from . import models

# Keys of a GPU run's records that a CPU run does not measure: written as null
PREFILL_TIMING = ("ms", "ms_min", "ms_max", "rounds_ms", "host_ms", "tokens_per_s", "vs_inductor", "vs_eager",
                  "peak_mib")
DECODE_TIMING = ("eager", "eager_range", "inductor", "inductor_range", "fusekit", "fusekit_range", "speedup",
                 "speedup+graph", "floor_ms", "floor_frac")
# Output against eager: max|fusekit - eager| / max|eager| at most this, per dtype (reference ops in the model's
# dtype; eager's own kernels round differently in 16 bits)
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DECODE_BATCHES = (2,)
DECODE_POSITIONS = (8, 40)  # below and above the tiny Mistral-style model's 16-slot sliding window
DECODE_CACHE = 64

INTRO = """a flow check, not a benchmark.
  Tiny configurations of the real models are compiled with backend="fusekit" and options={"cpu_reference": True}:
  each fused op runs its Python reference implementation, which is not meant to be fast, and the rest of the graph
  runs as ATen calls. Reported per model and phase: the fusekit sites that fire, errors, near misses, and the output
  against eager. Nothing is timed (compile time is shown for information): on a GPU, `fusekit bench` measures speed."""


def flow_options() -> dict[str, Any]:
    """fusekit's options for the check: its rules fire on CPU tensors (reference implementations), and Inductor
    falls back to ATen for every other node (no C++ code generated or compiled), where this torch has the key."""
    from torch._inductor import config as inductor_config

    opts: dict[str, Any] = {"cpu_reference": True}
    if hasattr(inductor_config, "fallback_by_default"):
        opts["fallback_by_default"] = True
    return opts


def rest_of_graph() -> str:
    return ("ATen calls (Inductor's fallback_by_default: no C++ kernels compiled)" if "fallback_by_default" in
            flow_options() else "Inductor's C++ kernels (this torch has no fallback_by_default)")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|."""
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def sites_text(sites: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sites.items()) or "none"


def verdict(errors: int, err: float | None, dtype: str, sites: dict[str, int]) -> str:
    tol = TOL.get(getattr(torch, dtype, None), 1e-2)
    if errors:
        return "ERRORS"
    if err is None or not err <= tol:  # NaN fails too
        return "MISMATCH"
    return "ok" if sites else "ok, none fired"


def _fusekit_info(records: list[stats.GraphRecord], compile_s: float, err: float | None) -> dict[str, Any]:
    rep = Report(list(records))
    groups = near_miss_groups(rep)
    return {"compile_s": compile_s, "max_rel_err_vs_eager": err,
            "sites": {k: v for k, v in rep.sites.items() if v}, "errors": len(rep.errors),
            "near_misses": len(rep.near_misses), "near_miss_groups": groups, "graphs": len(rep.graphs),
            "report": str(rep)}


# ---- prefill --------------------------------------------------------------------------------------------------
def prefill_check(name: str, dtype: torch.dtype | None = None, batch: int | None = None, seq: int | None = None,
                  grad_mode: str = "inference") -> dict:
    """One model's prompt under eager and fusekit (reference ops): the record a GPU run writes, timings null."""
    from .e2e import grad_context

    model, inputs, desc = models.make(name, "cpu", dtype, batch, seq)
    torch._dynamo.reset()
    with grad_context(grad_mode):
        ref = models.first_output(model(**inputs)).float()
        fn = torch.compile(model, backend=fusekit_backend(options=flow_options()))
        with stats.collect() as records, no_compile_caches():
            t0 = time.perf_counter()
            out = models.first_output(fn(**inputs)).float()
            compile_s = time.perf_counter() - t0
    torch._dynamo.reset()
    fk = _fusekit_info(records, compile_s, rel_err(out, ref))
    fk["check"] = verdict(fk["errors"], fk["max_rel_err_vs_eager"], desc["dtype"], fk["sites"])
    eager = {"compile_s": None, "max_rel_err_vs_eager": 0.0}
    return {**desc, "grad_mode": grad_mode, "check": "flow",
            "modes": {"eager": {**eager, **dict.fromkeys(PREFILL_TIMING)},
                      "fusekit": {**fk, **dict.fromkeys(PREFILL_TIMING)}},
            "compile_ratio_vs_inductor": None}


def prefill_line(r: dict) -> str:
    fk = r["modes"]["fusekit"]
    return (f"{r['model']:8s} {r['batch']}x{r['seq']} {r['dtype']} {r['grad_mode']}: fired {sites_text(fk['sites'])}; "
            f"errors {fk['errors']}; near misses {fk['near_misses']}; output vs eager "
            f"{fk['max_rel_err_vs_eager']:.1e} ({fk['check']}); compile {fk['compile_s']:.1f} s")


# ---- decode ---------------------------------------------------------------------------------------------------
def decode_check(name: str, batch: int, positions: tuple[int, ...], cache_len: int = DECODE_CACHE) -> dict:
    """One decode step of `name` against a StaticCache (decode_bench.Step) at each of `positions`, eager and fusekit
    from the same cache state: fusekit's sites (first call's graphs) and its logits against eager's."""
    with warnings.catch_warnings():
        # transformers >= 5.2x renames past_key_values, which Step passes (as the GPU run's transformers wants)
        warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated", category=FutureWarning)
        return _decode_check(name, batch, positions, cache_len)


def _decode_check(name: str, batch: int, positions: tuple[int, ...], cache_len: int) -> dict:
    from .decode_bench import Step

    st = Step(name, "cpu", batch, cache_len)
    positions = tuple(p for p in positions if p < st.cache_len) or (st.cache_len // 2,)
    res: dict[str, Any] = {**st.desc, "seq": 1, "cache_len": st.cache_len, "check": "flow", "backends": {},
                           "positions": {}}
    ref, out = {}, {}
    first: list[stats.GraphRecord] = []
    with torch.no_grad():
        torch._dynamo.reset()
        for p in positions:
            st.restore()
            st.at(p)
            ref[p] = st(st.model).float()
        fn = torch.compile(st.model, backend=fusekit_backend(options=flow_options()))
        compile_s = 0.0
        with stats.collect() as records, no_compile_caches():
            for i, p in enumerate(positions):
                st.restore()
                st.at(p)
                t0 = time.perf_counter()
                out[p] = st(fn).float()
                compile_s += time.perf_counter() - t0  # the first call compiles; a later one only if it recompiles
                if i == 0:
                    first = list(records)
        every = list(records)
        torch._dynamo.reset()
    errs = {p: rel_err(out[p], ref[p]) for p in positions}
    fk = _fusekit_info(first, compile_s, max(errs.values()))
    fk["graphs"] = len(every)  # a later position may compile again (a sliding window's length turns symbolic)
    fk["errors"] = sum(len(g.errors) for g in every)
    for p in positions:
        same = bool((out[p].argmax(-1) == ref[p].argmax(-1)).all())
        res["positions"][str(p)] = {**dict.fromkeys(DECODE_TIMING), "fusekit_vs_eager_max_abs":
                                    (out[p] - ref[p]).abs().max().item(), "fusekit_vs_eager_rel": errs[p],
                                    "argmax_equal_eager": same}
    fk["check"] = verdict(fk["errors"], fk["max_rel_err_vs_eager"], st.desc["dtype"], fk["sites"])
    res["backends"] = {"eager": {"compile_s": None}, "fusekit": fk}
    res["fusekit_vs_eager_max_abs"] = max(r["fusekit_vs_eager_max_abs"] for r in res["positions"].values())
    res["fusekit_vs_inductor_max_abs"] = res["eager_vs_inductor_max_abs"] = None  # Inductor is not run
    res["compiled_while_timed"] = None  # nothing is timed
    return res


def decode_line(r: dict) -> str:
    fk = r["backends"]["fusekit"]
    pos = ", ".join(f"@{p} {row['fusekit_vs_eager_rel']:.1e}" for p, row in r["positions"].items())
    argmax = all(row["argmax_equal_eager"] for row in r["positions"].values())
    return (f"{r['model']:8s} batch {r['batch']}: fired {sites_text(fk['sites'])}; errors {fk['errors']}; near misses "
            f"{fk['near_misses']}; logits vs eager {pos} ({fk['check']}); next token = eager's: "
            f"{'yes' if argmax else 'NO'}; compile {fk['compile_s']:.1f} s ({fk['graphs']} graph(s))")


def generate_check(name: str, batch: int = 2, prompt: int = 16, new: int = 16) -> dict:
    """Greedy ``generate`` with a static cache (transformers compiles its decode forward; on CPU only when
    compile_config._compile_all_devices is set), eager and fusekit: the tokens compared with eager's."""
    from transformers import CompileConfig

    model, _, desc = models.make(name, "cpu", None, batch, prompt)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g)
    out: dict[str, Any] = {**desc, "check": "flow", "prompt": prompt, "new_tokens": new, "cache_len": prompt + new,
                           "backends": {}}
    kw: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              cache_implementation="static")
    tokens: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        tokens["eager"] = model.generate(ids, disable_compile=True, **kw)[:, prompt:]
        out["backends"]["eager"] = {"first_run_s": None, "s": None, "tokens_per_s": None}
        cc = CompileConfig(backend=fusekit_backend(options=flow_options()), mode=None, fullgraph=False, dynamic=False)
        cc._compile_all_devices = True  # else transformers does not compile on CPU, and fusekit never runs
        torch._dynamo.reset()
        try:
            with stats.collect() as records, no_compile_caches():
                t0 = time.perf_counter()
                tokens["fusekit"] = model.generate(ids, compile_config=cc, **kw)[:, prompt:]
                first = time.perf_counter() - t0
            rep = Report(list(records))
            limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
            out["backends"]["fusekit"] = {"first_run_s": first, "s": None, "tokens_per_s": None,
                                          "graphs": len(rep.graphs), "sites": {k: v for k, v in rep.sites.items() if v},
                                          "errors": len(rep.errors),
                                          # a sliding window's length (a Python int) recompiles each step under
                                          # dynamic=False: past Dynamo's limit, the later steps run eagerly
                                          "recompile_limit_hit": len(rep.graphs) >= limit}
        except Exception as e:  # noqa: BLE001 - report it, keep the check going
            out["backends"]["fusekit"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        torch._dynamo.reset()
    for be, t in tokens.items():
        same = t == tokens["eager"]
        diff = (~same).any(0).nonzero()
        out["backends"][be].update(tokens_equal_eager=bool(same.all()), match_frac=same.float().mean().item(),
                                   first_divergence=int(diff[0]) if len(diff) else None)
    return out


def generate_line(gr: dict) -> str:
    b = gr["backends"]["fusekit"]
    if "error" in b:
        return f"generate {gr['model']}: fusekit error: {b['error']}"
    return (f"generate {gr['model']:8s} batch {gr['batch']}, {gr['prompt']}+{gr['new_tokens']} tokens: fusekit compiled "
            f"{b['graphs']} graph(s){' (Dynamo recompile limit hit: later steps ran eagerly)' if b['recompile_limit_hit'] else ''}"
            f", fired {sites_text(b['sites'])}; tokens = eager's: "
            f"{'yes' if b['tokens_equal_eager'] else 'NO, first divergence at %s' % b['first_divergence']}")


# ---- reports --------------------------------------------------------------------------------------------------
def _header(env: dict, what: str) -> list[str]:
    return [f"# fusekit bench{what} on {env['device']}: a flow check, not a benchmark", "",
            f"No GPU here (or `--cpu`), so this run checks fusekit's flow, not its speed: tiny configurations of the "
            f"real models (2 layers, hidden 64-128, float32 unless `--dtype`) compiled with `backend=\"fusekit\"` and "
            f"`options={{\"cpu_reference\": True}}`, in which each fused op runs its Python reference implementation "
            f"(not meant to be fast) and the rest of the graph runs as {env['rest_of_graph']}. Per model: the fusekit "
            f"sites that fired, errors (sites skipped), near misses (a rule's search pattern matched and a guard said "
            f"no) and the output against eager (max|fusekit - eager| / max|eager|; check: within {TOL[torch.float32]:g} "
            f"in float32). Compile = the first call(s), wall clock, for information. On CPU every rule may fire, "
            f"whatever its default on a GPU (`fusekit doctor` shows what fires by default there). Nothing is timed: "
            f"on a GPU, `fusekit bench` measures the real models against Inductor.", "",
            f"torch {env['torch']}, transformers {env['transformers']}.", ""]


def _misses_section(rows: list[tuple[str, dict]]) -> list[str]:
    lines = ["", "Near misses, the most frequent per model (all of them in the `report` of the .json):", ""]
    for label, fk in rows:
        groups = fk.get("near_miss_groups") or []
        if groups:
            lines.append(f"- {label}: " + "; ".join(f"`{g['pattern']}` x{g['count']}: {g['example'].split(': ', 1)[1]}"
                                                    for g in groups[:3])
                         + (f"; {len(groups) - 3} more kind{'s' if len(groups) > 4 else ''}" if len(groups) > 3
                            else ""))
    return lines if len(lines) > 3 else []


def prefill_markdown(results: list[dict], env: dict) -> str:
    lines = _header(env, "") + [
        "| model | dtype | batch x seq | grad mode | fusekit sites fired | errors | near misses | output vs eager | "
        "check | compile s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fk = r["modes"]["fusekit"]
        lines.append(f"| {r['model']} | {r['dtype']} | {r['batch']}x{r['seq']} | {r['grad_mode']} | "
                     f"{sites_text(fk['sites'])} | {fk['errors']} | {fk['near_misses']} | "
                     f"{fk['max_rel_err_vs_eager']:.1e} | {fk['check']} | {fk['compile_s']:.1f} |")
    lines += _misses_section([(f"{r['model']} ({r['grad_mode']})" if len({x['grad_mode'] for x in results}) > 1
                               else r["model"], r["modes"]["fusekit"]) for r in results])
    return "\n".join(lines) + "\n"


def decode_markdown(results: list[dict], gens: list[dict], env: dict) -> str:
    lines = _header(env, " --phase decode") + [
        "One decode step (one new token per sequence) against a StaticCache whose every slot holds a row, at each "
        "position, eager and fusekit from the same cache state.", "",
        "| model | batch | positions / cache slots | fusekit sites fired | errors | near misses | logits vs eager | "
        "next token = eager's | check | compile s | graphs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fk = r["backends"]["fusekit"]
        pos = ", ".join(f"@{p} {row['fusekit_vs_eager_rel']:.1e}" for p, row in r["positions"].items())
        same = all(row["argmax_equal_eager"] for row in r["positions"].values())
        lines.append(f"| {r['model']} | {r['batch']} | {', '.join(r['positions'])} / {r['cache_len']} | "
                     f"{sites_text(fk['sites'])} | {fk['errors']} | {fk['near_misses']} | {pos} | "
                     f"{'yes' if same else 'NO'} | {fk['check']} | {fk['compile_s']:.1f} | {fk['graphs']} |")
    lines += _misses_section([(r["model"], r["backends"]["fusekit"]) for r in results])
    if gens:
        lines += ["", "generate (greedy, static cache; transformers compiles the decode forward with fusekit):", "",
                  "| model | batch | prompt + new | graphs compiled | fusekit sites fired (all graphs) | tokens = eager's | "
                  "first divergence |", "|---|---|---|---|---|---|---|"]
        for gr in gens:
            b = gr["backends"]["fusekit"]
            if "error" in b:
                lines.append(f"| {gr['model']} | {gr['batch']} | {gr['prompt']}+{gr['new_tokens']} | error: "
                             f"{b['error']} | | | |")
                continue
            lines.append(f"| {gr['model']} | {gr['batch']} | {gr['prompt']}+{gr['new_tokens']} | {b['graphs']}"
                         f"{' (recompile limit hit: later steps eager)' if b['recompile_limit_hit'] else ''} | "
                         f"{sites_text(b['sites'])} | {b['tokens_equal_eager']} | "
                         f"{'-' if b['first_divergence'] is None else b['first_divergence']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[tuple[str, dict]], path: pathlib.Path, title: str, err_label: str) -> None:
    """Per model: the fusekit sites fired, stacked by rule (left), and the output's error against eager (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, _ in rows]
    rules = sorted({k for _, fk in rows for k in fk["sites"]})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(9.0, 1.5 * len(rows) + 5), 4.5),
                                  gridspec_kw={"width_ratios": [3, 2]})
    xs = list(range(len(rows)))
    bottom = [0] * len(rows)
    cmap = plt.get_cmap("tab20")
    for i, rule in enumerate(rules):
        ys = [fk["sites"].get(rule, 0) for _, fk in rows]
        ax.bar(xs, ys, 0.6, bottom=bottom, label=rule, color=cmap(i % 20))
        bottom = [b + y for b, y in zip(bottom, ys)]
    for x, total in zip(xs, bottom):
        ax.text(x, total, str(total), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(bottom + [1]) * (1.25 + 0.12 * ((len(rules) + 1) // 2)))  # room for the legend
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("fusekit sites fired")
    ax.set_title(f"{title}: sites fired per model (tiny configurations)", fontsize=9)
    if rules:
        ax.legend(fontsize=7, ncol=2, loc="upper center")
    floor = 1e-10
    errs = [fk["max_rel_err_vs_eager"] for _, fk in rows]
    ys = [max(e, floor) if e is not None and e == e else 1.0 for e in errs]
    colors = ["tab:green" if fk["check"].startswith("ok") else "tab:red" for _, fk in rows]
    ax2.scatter(xs, ys, c=colors, s=40, zorder=3)
    for x, y, e in zip(xs, ys, errs):
        ax2.annotate("0" if e == 0 else f"{e:.0e}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                     fontsize=7)
    ax2.axhline(TOL[torch.float32], color="k", lw=0.8, ls="--", label=f"check: {TOL[torch.float32]:g} (float32)")
    ax2.set_yscale("log")
    ax2.set_ylim(floor / 3, 1.0)
    ax2.set_xlim(-0.5, len(rows) - 0.5)
    ax2.set_xticks(xs, labels, fontsize=8)
    ax2.set_ylabel(err_label, fontsize=8)
    ax2.set_title(f"against eager (0 drawn at {floor:g})", fontsize=9)
    ax2.grid(axis="y", alpha=0.3)
    ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle("fusekit on CPU: a flow check with reference implementations (not a speed measurement)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    from .e2e import environment as env

    return {**env(), "device": "CPU", "check": "flow", "rest_of_graph": rest_of_graph(), "copy_gbps": None}


def summary(pre: list[dict], dec: list[dict]) -> str:
    """The closing line: how many of the checks (one per model and phase) passed."""
    checks = [r["modes"]["fusekit"]["check"] for r in pre] + [r["backends"]["fusekit"]["check"] for r in dec]
    bad = [c for c in checks if not c.startswith("ok")]
    return (f"flow check: {len(checks) - len(bad)} of {len(checks)} model/phase checks ok (no fusekit error, output "
            f"within tolerance of eager)" + (f"; {len(bad)} not: {', '.join(sorted(set(bad)))}" if bad else ""))


def bench(names: list[str], out: pathlib.Path, phases: tuple[str, ...] = ("prefill", "decode"),
          dtype: torch.dtype | None = None, batch: int | None = None, seq: int | None = None,
          grad_modes: tuple[str, ...] = ("inference",), batches: tuple[int, ...] | None = None,
          positions: tuple[int, ...] | None = None, generate: bool | None = None,
          log: Callable[[str], None] = print) -> dict:
    """The CPU flow check of `names` in `phases`; writes the .md/.json/.png files into `out` as it goes."""
    env = environment()
    decoders = [n for n in names if not models.MODELS[n].encoder]
    batches = batches or DECODE_BATCHES
    positions = positions or DECODE_POSITIONS
    log(f"fusekit bench on CPU: {INTRO}")
    if "prefill" in phases:
        log(f"  prefill: {', '.join(names)}: eager and fusekit, batch {batch or models.TINY['batch']} x "
            f"{seq or models.TINY['seq']} tokens, {str(dtype)[6:] if dtype else 'float32'}, {' and '.join(grad_modes)}")
    if "decode" in phases:
        log(f"  decode: {', '.join(decoders) or 'no decoder among the models'}: eager and fusekit, one step at batch "
            f"{', '.join(map(str, batches))}, positions {', '.join(map(str, positions))} of a {DECODE_CACHE}-slot "
            f"StaticCache" + ("; and generate" if generate else ""))
    out.mkdir(parents=True, exist_ok=True)
    pre: list[dict] = []
    dec: list[dict] = []
    gens: list[dict] = []
    t0 = time.time()
    if "prefill" in phases:
        for i, name in enumerate(names, 1):
            for gm in grad_modes:
                pre.append(prefill_check(name, dtype, batch, seq, gm))
                log(f"[prefill {i}/{len(names)} {time.time() - t0:4.0f}s] {prefill_line(pre[-1])}")
            (out / "bench.json").write_text(json.dumps({"env": env, "results": pre}, indent=1, default=str))
            (out / "bench.md").write_text(prefill_markdown(pre, env))
        both = len(grad_modes) > 1
        plot([(r["model"] + (f"\n{r['grad_mode']}" if both else ""), r["modes"]["fusekit"]) for r in pre],
             out / "bench.png", "prefill",
             "output: max|fusekit - eager| / max|eager|")
    if "decode" in phases:
        def save() -> None:
            (out / "decode.json").write_text(json.dumps({"env": env, "steps": dec, "generate": gens}, indent=1,
                                                        default=str))
            (out / "decode.md").write_text(decode_markdown(dec, gens, env))

        for i, name in enumerate(decoders, 1):
            for b in batches:
                dec.append(decode_check(name, b, positions))
                log(f"[decode {i}/{len(decoders)} {time.time() - t0:4.0f}s] {decode_line(dec[-1])}")
                save()
        if generate:
            for name in decoders:
                gens.append(generate_check(name))
                log(f"[{time.time() - t0:4.0f}s] {generate_line(gens[-1])}")
                save()
        save()
        plot([(r["model"], r["backends"]["fusekit"]) for r in dec], out / "decode.png", "decode step",
             "logits: max|fusekit - eager| / max|eager|")
    log(summary(pre, dec))
    written = [f for f in ("bench.md", "bench.json", "bench.png", "decode.md", "decode.json", "decode.png")
               if (out / f).exists() and (("prefill" in phases) if f.startswith("bench") else ("decode" in phases))]
    log(f"wrote {', '.join(str(out / f) for f in written)} ({time.time() - t0:.0f} s)")
    return {"prefill": pre, "decode": dec, "generate": gens}
