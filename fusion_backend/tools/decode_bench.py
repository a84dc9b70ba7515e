"""``fusekit bench --phase decode``: one decode step of Hugging Face decoders against a ``StaticCache``
(eager / Inductor / fusekit, each plain and replayed as a CUDA graph), at several batch sizes and cache
positions, with the step's byte floor (weights + the visible KV rows at the measured copy bandwidth), compile
time, the match report and fusekit's logits against Inductor's; plus a greedy ``model.generate`` with a
static cache (tokens/s, tokens compared with eager's). Writes decode.md, decode.json and decode.png.

The cache is filled with random rows up to its end, so one compiled step serves every position: only
``cache_position`` (a static input of the CUDA graph) changes, and with it the mask.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import statistics
import time
from typing import Any, Callable

import torch

from .. import stats
from .. import build
from . import models
from ..backend import backend as fusekit_backend
from ..report import Report, near_miss_groups, no_compile_caches
from .cuda_graphs import capture
from .e2e import environment, fusekit_options

# The families whose near misses the table explains: a layer's attention and its GEMMs
STEP_FAMILIES = ("decode", "decode_gemm")

BACKENDS = ("eager", "inductor", "fusekit")
WITHOUT = "fusekit without "  # an ablation's backend: fusekit with one rule (or family) off (--ablate)
GPU_BATCHES = (1, 8, 32, 64)
GPU_POSITIONS = (128, 1024, 2048, 4000)
CACHE_LEN = 4096
ROUNDS = 3  # interleaved timing rounds per position


def length_counters(cache: Any) -> list[torch.Tensor]:
    """The write-position counters of a cache whose layers count their own length (transformers >= 5.2x): each
    call advances them in place."""
    return [n for layer in getattr(cache, "layers", ())
            if isinstance(n := getattr(layer, "cumulative_length", None), torch.Tensor)]


def cache_restorer(cache: Any) -> Callable[[], None]:
    """A function that puts `cache` back as it is now: its rows, the length counters of caches that count their own
    (a tensor each step advances in place), and a sliding-window layer's Python int."""
    layers = list(getattr(cache, "layers", ()))
    rows = [(layer.keys.clone(), layer.values.clone()) for layer in layers]
    counters = length_counters(cache)
    saved = [n.clone() for n in counters]
    ints = [(layer, layer.cumulative_length_int) for layer in layers
            if isinstance(getattr(layer, "cumulative_length_int", None), int)]

    def restore():
        for layer, (k, v) in zip(layers, rows):
            layer.keys.copy_(k)
            layer.values.copy_(v)
        for n, s in zip(counters, saved):
            n.copy_(s)
        for layer, i in ints:
            layer.cumulative_length_int = i

    return restore


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a parameter as stored: a tensor subclass (a torchao quantized weight) by its inner tensors."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


class ModelCannotRun(Exception):
    """The model's own eager step failed (not a backend's compile)."""


@contextlib.contextmanager
def _int_mm_rows_padded():
    """torch._int_mm with fewer than 17 rows padded to 17 (cuBLAS refuses fewer; the rows past the input are
    dropped): an eager int8 x int8 reference at 1-16 rows (the tests' and bench_decode_gemm.py's), never timed."""
    int_mm = torch._int_mm

    def padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.is_cuda and a.shape[0] <= 16:
            return int_mm(torch.cat([a, a.new_zeros(17 - a.shape[0], a.shape[1])]), b)[: a.shape[0]]
        return int_mm(a, b)

    torch._int_mm = padded
    try:
        yield
    finally:
        torch._int_mm = int_mm


class Step:
    """One decode step of `name` at batch `batch` against a StaticCache of `cache_len` slots."""

    def __init__(self, name: str, device: str, batch: int, cache_len: int, dtype: torch.dtype | None = None,
                 quant: str | None = None, built: tuple[Any, dict[str, Any]] | None = None):
        """`built`: (model, description) made elsewhere (a tensor-parallel shard loaded by tp_bench), instead of
        models.make's."""
        from transformers import StaticCache

        if built is None:
            self.model, _, self.desc = models.make(name, device, dtype, batch, 1)
        else:
            self.model, self.desc = built[0], {**built[1], "batch": batch}
        if quant:
            models.quantize(self.model, quant)
        cfg = self.model.config
        limit = getattr(cfg, "max_position_embeddings", None) or cfg.n_positions
        self.cache_len = min(cache_len, limit)
        self.cache = StaticCache(config=cfg, max_cache_len=self.cache_len)
        g = torch.Generator().manual_seed(0)
        self.token = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to(device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.position = 0
        with torch.no_grad():
            try:
                self(self.model)  # allocates the cache layers
            except RuntimeError as e:
                raise ModelCannotRun(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from e
            for layer in getattr(self.cache, "layers", ()):  # every slot a plausible row; the mask decides what is read
                for t in (layer.keys, layer.values):
                    t.normal_(0, 0.5)
        # the cache as filled: timing steps write rows (and a full sliding window rolls), so every backend's
        # logits are taken from this state
        self.saved = [(layer.keys.clone(), layer.values.clone()) for layer in getattr(self.cache, "layers", ())]
        # write-position counters of caches that count their own length (transformers >= 5.2x): a tensor each
        # step advances in place (replays of a graph included), and a sliding-window layer's Python int
        layers = getattr(self.cache, "layers", ())
        self.lens = length_counters(self.cache)
        self.sliding = [layer for layer in layers if isinstance(getattr(layer, "cumulative_length_int", None), int)]
        self._pos_as_lens = [self.pos.view(n.shape) for n in self.lens]

    def restore(self) -> None:
        for layer, (k, v) in zip(getattr(self.cache, "layers", ()), self.saved):
            layer.keys.copy_(k)
            layer.values.copy_(v)

    def at(self, position: int) -> None:
        """Step at `position`: the mask's cache_position, and the caches' write slot."""
        self.position = position
        self.pos.fill_(position)
        self._rewind()

    def _rewind(self) -> None:
        """The caches' write slot back to `pos` (one copy kernel for the tensor counters)."""
        if self.lens:
            torch._foreach_copy_(self.lens, self._pos_as_lens)
        for layer in self.sliding:
            layer.cumulative_length_int = self.position

    def __call__(self, fn: Callable[..., Any]) -> torch.Tensor:
        return fn(self.token, past_key_values=self.cache, cache_position=self.pos, use_cache=True).logits

    def repeated(self, fn: Callable[..., Any]) -> Callable[[], torch.Tensor]:
        """The step as timed: every call (a graph replay too) first rewinds the caches' write position to
        `pos`, which each step advances in place; without it hundreds of timed steps from position 4000 would
        write past the cache's end. One small copy kernel, the same for every backend."""
        def step() -> torch.Tensor:
            self._rewind()
            return self(fn)
        return step

    def kv_bytes(self, position: int) -> int:
        """Bytes of the KV rows visible at `position` (slots 0..position), every layer."""
        total = 0
        for layer in getattr(self.cache, "layers", ()):
            k = layer.keys
            slots = min(position + 1, k.shape[2])  # a sliding-window layer holds fewer slots
            total += 2 * k.shape[0] * k.shape[1] * slots * k.shape[3] * k.element_size()
        return total

    def weight_bytes(self) -> int:
        return sum(tensor_bytes(p) for p in self.model.parameters())


class Prompt:
    """`length` tokens per sequence into a StaticCache of `slots` slots at positions 0..length-1 (a prefill). It
    has Step's interface where tp_bench times either (a prompt rewrites its slots from 0 each call: nothing to
    restore, no position)."""

    def __init__(self, name: str, device: str, batch: int, length: int, slots: int,
                 built: tuple[Any, dict[str, Any]] | None = None):
        from transformers import StaticCache

        if built is None:
            self.model, _, self.desc = models.make(name, device, None, batch, length)
        else:
            self.model, self.desc = built[0], {**built[1], "batch": batch, "seq": length}
        cfg = self.model.config
        self.cache_len = slots
        self.cache = StaticCache(config=cfg, max_cache_len=slots)
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, cfg.vocab_size, (batch, length), generator=g).to(device)
        self.pos = torch.arange(length, device=device)
        self.lens: list[torch.Tensor] = []
        with torch.no_grad():
            self(self.model)  # allocates the cache layers
        self.lens = length_counters(self.cache)  # advanced by each call: rewound before each

    def __call__(self, fn):
        for n in self.lens:
            n.zero_()
        return fn(self.tokens, past_key_values=self.cache, cache_position=self.pos, use_cache=True).logits

    def restore(self) -> None:
        pass

    def at(self, position: int) -> None:
        pass

    def repeated(self, fn: Callable[..., Any]) -> Callable[[], torch.Tensor]:
        return lambda: self(fn)


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), triton's do_bench median."""
    from triton.testing import do_bench

    x = torch.empty(2**29, dtype=torch.float16, device=device)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=20, rep=200, return_mode="median")
    return 2 * x.numel() * 2 / (ms * 1e-3)


def _ms(fn: Callable[[], Any], cpu: bool) -> float:
    if cpu:
        fn()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def _compile(backend: str, model: Any, cpu: bool, enable: tuple[str, ...] = (), disable: tuple[str, ...] = ()) -> Any:
    """Default dynamism: a sliding-window cache's length counter is a Python int that changes every step (one
    recompile makes it symbolic; dynamic=False would recompile every step). No Dynamo reset here: the
    backends' compiled steps live side by side, and are timed in interleaved rounds."""
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend=fusekit_backend(options=fusekit_options(cpu, enable, disable)))


def first_call(st: Step, fn: Callable[..., Any], position: int, cpu: bool) -> tuple[torch.Tensor, float, Report]:
    """`fn`'s first step at `position` from the cache as filled (a compiled fn compiles here): its logits, the
    seconds it took, and the report of what fusekit fused in that compile."""
    st.restore()
    st.at(position)
    with stats.collect() as records, no_compile_caches():
        t0 = time.perf_counter()
        logits = st(fn).float()
        if not cpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return logits, seconds, Report(list(records))


def step_sites(rep: Report) -> dict[str, Any]:
    """A step's fused sites, the near misses of a layer's attention and GEMMs, and the count of rule errors."""
    return {"sites": {k: v for k, v in rep.sites.items() if v},
            "near_misses": [g for g in near_miss_groups(rep) if g["pattern"].split(".")[0] in STEP_FAMILIES],
            "errors": len(rep.errors)}


def _ablation_mode(row: dict, without: str) -> str:
    """The timing an ablation compares: "+graph" where fusekit and `without` both ran as CUDA graphs, else ""."""
    return "+graph" if row.get(without + "+graph") and row.get("fusekit+graph") else ""


def run_model(name: str, batch: int, positions: tuple[int, ...], device: str, cache_len: int, bw: float | None,
              log: Callable[[str], None] = print, enable: tuple[str, ...] = (), quant: str | None = None,
              ablate: tuple[str, ...] = ()) -> dict:
    cpu = device == "cpu"
    st = Step(name, device, batch, cache_len, quant=quant)
    positions = tuple(p for p in positions if p < st.cache_len) or (st.cache_len // 2,)
    res: dict[str, Any] = {**st.desc, "seq": 1, "cache_len": st.cache_len, "backends": {}, "positions": {}}
    wbytes = st.weight_bytes()
    logits: dict[str, torch.Tensor] = {}
    steps: dict[str, Callable[[], Any]] = {}
    fns: list[Any] = []
    backends = [*BACKENDS, *(WITHOUT + r for r in ablate)]
    with torch.no_grad():
        torch._dynamo.reset()
        for be in list(backends):  # compiled side by side: Dynamo keeps one cache entry per backend
            fn = (_compile("fusekit", st.model, cpu, enable, disable=tuple(be.removeprefix(WITHOUT).split("+")))
                  if be.startswith(WITHOUT) else _compile(be, st.model, cpu, enable))
            try:
                logits[be], compile_s, rep = first_call(st, fn, positions[0], cpu)
            except Exception as e:  # Inductor's step of a torchao-quantized model may fail (int8 below 17 rows)
                if be != "inductor" or not quant:
                    raise
                res["backends"][be] = {"compile_s": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
                backends.remove(be)
                log(f"  {name:8s} b{batch:<3d} {be:9s} failed: {res['backends'][be]['error']}")
                continue
            fns.append(fn)
            info: dict[str, Any] = {"compile_s": compile_s if be != "eager" else None}
            if be == "fusekit":
                info.update(step_sites(rep), report=str(rep))
            elif be.startswith(WITHOUT):
                info.update(sites=step_sites(rep)["sites"])
            res["backends"][be] = info
            steps[be] = st.repeated(fn)
        # Timed in interleaved rounds (every backend once per round): a slow host drifts from run to run,
        # and in a row timed one backend after another the drift lands on one backend.
        for p in positions:  # once at every position first: a sliding window's int turns symbolic here
            st.at(p)
            for be in backends:
                steps[be]()
        graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for p in positions:
            st.at(p)
            row = res["positions"].setdefault(str(p), {})
            # CUDA graphs captured at this position: a graph replays the Python branches taken when it was
            # captured (a sliding-window layer writes in place below its window and rolls above it), so one
            # captured at another position would write outside the window's cache
            timed, graphs = dict(steps), []
            for be in backends if not cpu else ():
                g = capture(steps[be])
                if g is not None:
                    timed[be + "+graph"] = g.replay
                    graphs.append(g)
            rounds: dict[str, list[float]] = {k: [] for k in timed}
            for _ in range(ROUNDS):
                for k, fn in timed.items():
                    rounds[k].append(_ms(fn, cpu))
            del timed, graphs
            for k, ts in rounds.items():
                row[k] = statistics.median(ts)
                row[k + "_range"] = (min(ts), max(ts))
            row["floor_ms"] = (wbytes + st.kv_bytes(p)) / bw * 1e3 if bw else None
        # graphs Dynamo compiled while timing (a recompile would be timed as a step): 0 expected
        res["compiled_while_timed"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
        for be in backends:
            log(f"  {name:8s} b{batch:<3d} {be:9s} compile {res['backends'][be]['compile_s'] or 0:5.1f} s  " + "  ".join(
                f"@{p}: {row[be]:.3f}" + (f"/{row[be + '+graph']:.3f}g" if be + "+graph" in row else "")
                for p, row in res["positions"].items())
                + (f"  fused {res['backends'][be].get('sites')}" if be == "fusekit" else ""))
        del fns, steps
        torch._dynamo.reset()
    ref = logits.get("inductor")
    res["fusekit_vs_inductor_max_abs"] = (logits["fusekit"] - ref).abs().max().item() if ref is not None else None
    res["eager_vs_inductor_max_abs"] = (logits["eager"] - ref).abs().max().item() if ref is not None else None
    res["fusekit_vs_eager_max_abs"] = (logits["fusekit"] - logits["eager"]).abs().max().item()
    log(f"  {name:8s} b{batch:<3d} logits max abs: fusekit - Inductor {res['fusekit_vs_inductor_max_abs']}, "
        f"eager - Inductor {res['eager_vs_inductor_max_abs']}, fusekit - eager {res['fusekit_vs_eager_max_abs']}")
    for row in res["positions"].values():
        for mode in ("", "+graph"):
            i, f = row.get("inductor" + mode), row.get("fusekit" + mode)
            row["speedup" + mode] = i / f if i and f else None
        best = row.get("fusekit+graph") or row.get("fusekit")
        row["floor_frac"] = row["floor_ms"] / best if row.get("floor_ms") and best else None
        for r in ablate:  # what the rule gains: fusekit without it over fusekit
            mode = _ablation_mode(row, WITHOUT + r)
            without, f = row.get(WITHOUT + r + mode), row.get("fusekit" + mode)
            row["gain " + r] = without / f if without and f else None
    del st
    if not cpu:
        torch.cuda.empty_cache()
    return res


def generate_bench(name: str, device: str, batch: int, prompt: int, new: int, cache_len: int | None = None,
                   log: Callable[[str], None] = print, enable: tuple[str, ...] = ()) -> dict:
    """Greedy ``generate`` with a static cache, compiled by each backend (transformers compiles the decode
    forward itself, ``compile_config``): tokens/s of a second run, and tokens compared with eager's.
    cache_len None: transformers sizes the cache to prompt + new (``cache_implementation="static"``); else one
    ``StaticCache`` of that many slots, reset before each run (a server's cache sized to the context)."""
    from transformers import CompileConfig, StaticCache

    cpu = device == "cpu"
    model, _, desc = models.make(name, device, None, batch, prompt)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    out: dict[str, Any] = {**desc, "prompt": prompt, "new_tokens": new, "cache_len": cache_len or prompt + new,
                           "backends": {}}
    tokens: dict[str, torch.Tensor] = {}
    for be in BACKENDS:
        torch._dynamo.reset()
        kw: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        cache = None if cache_len is None else StaticCache(config=model.config, max_cache_len=cache_len)
        if cache is None:
            kw["cache_implementation"] = "static"
        if be == "eager":
            kw["disable_compile"] = True
        elif be == "inductor":  # CUDA graphs for both on a GPU (transformers' default compile mode)
            kw["compile_config"] = CompileConfig(backend="inductor", mode=None if cpu else "reduce-overhead",
                                                 fullgraph=False, dynamic=False)
        else:  # fusekit takes the mode itself; torch.compile passes a mode only to Inductor
            backend = fusekit_backend(mode=None if cpu else "reduce-overhead",
                                      options=fusekit_options(cpu, enable))
            kw["compile_config"] = CompileConfig(backend=backend, mode=None, fullgraph=False, dynamic=False)
        try:
            with torch.no_grad():
                def run() -> torch.Tensor:
                    if cache is not None:  # the same cache object both times: its buffers are the graphs' own
                        cache.reset()
                        return model.generate(ids, past_key_values=cache, **kw)
                    return model.generate(ids, **kw)

                t0 = time.perf_counter()
                run()  # compiles
                first = time.perf_counter() - t0
                if not cpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                seq = run()
                if not cpu:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - report it, keep the benchmark going
            out["backends"][be] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            log(f"  generate {name} {be}: {out['backends'][be]['error']}")
            continue
        tokens[be] = seq[:, prompt:]
        out["backends"][be] = {"first_run_s": first, "s": dt, "tokens_per_s": batch * new / dt}
        log(f"  generate {name} b{batch} {be:9s} {batch * new / dt:10,.0f} tok/s  (first run {first:.1f} s)")
    if "eager" in tokens:
        for be, t in tokens.items():
            same = (t == tokens["eager"])
            first_diff = (~same).any(0).nonzero()
            out["backends"][be]["tokens_equal_eager"] = bool(same.all())
            out["backends"][be]["first_divergence"] = int(first_diff[0]) if len(first_diff) else None
            out["backends"][be]["match_frac"] = same.float().mean().item()
    return out


def markdown(results: list[dict], gens: list[dict], env: dict) -> str:
    lines = [f"# fusekit bench --phase decode: {env['device']}", "",
             f"torch {env['torch']}, transformers {env['transformers']}. One decode step (1 new token per sequence) "
             f"against a StaticCache; ms, the median of {ROUNDS} interleaved rounds (each a triton do_bench median; "
             f"min-max in decode.json); +graph = the compiled step replayed as a CUDA "
             f"graph. Floor = (weights + KV rows visible at the position) / copy bandwidth "
             f"({(env.get('copy_gbps') or 0):,.0f} GB/s)."
             + (f" fusekit with options={{'enable': {env['enable']}}}." if env.get("enable") else "")
             + (f" Every backend runs the model quantized by torchao ({env['quant']}: "
                f"{models.QUANT[env['quant']]}); the floor counts the weights at their stored size."
                if env.get("quant") else ""), "",
             "| model | batch | position | eager | Inductor | fusekit | Inductor+graph | fusekit+graph | "
             "speedup | speedup+graph | floor ms | floor / fusekit | sites |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "-" if x is None else fmt.format(x)

    for r in results:
        sites = ", ".join(f"{k.split('.')[-1]}x{v}" for k, v in r["backends"]["fusekit"].get("sites", {}).items()) or "-"
        for p, row in r["positions"].items():
            lines.append(f"| {r['model']} | {r['batch']} | {p}/{r['cache_len']} | {f(row.get('eager'))} | "
                         f"{f(row.get('inductor'))} | {f(row.get('fusekit'))} | {f(row.get('inductor+graph'))} | "
                         f"{f(row.get('fusekit+graph'))} | {f(row.get('speedup'), '{:.2f}x')} | "
                         f"{f(row.get('speedup+graph'), '{:.2f}x')} | {f(row.get('floor_ms'))} | "
                         f"{f(row.get('floor_frac'), '{:.0%}')} | {sites} |")
    ablated = [be for be in dict.fromkeys(be for r in results for be in r["backends"]) if be.startswith(WITHOUT)]
    if ablated:
        lines += ["", "Ablations: fusekit with one rule off, timed in the same rounds (+graph where both ran as CUDA "
                  "graphs); gain = that step over fusekit's.", "",
                  "| model | batch | position | fusekit | without | ms | gain | its sites |", "|---|---|---|---|---|---|---|---|"]
        for r in results:
            for be in ablated:
                if be not in r["backends"]:
                    continue
                rule = be.removeprefix(WITHOUT)
                sites = ", ".join(f"{k.split('.')[-1]}x{v}" for k, v in r["backends"][be].get("sites", {}).items()) or "-"
                for p, row in r["positions"].items():
                    mode = _ablation_mode(row, be)
                    lines.append(f"| {r['model']} | {r['batch']} | {p} | {f(row.get('fusekit' + mode))} | {rule} | "
                                 f"{f(row.get(be + mode))} | {f(row.get('gain ' + rule), '{:.3f}x')} | {sites} |")
    if env.get("skipped"):
        lines += ["", "Not run (the model itself failed the step): " + "; ".join(env["skipped"]) + "."]
    lines += ["", "Compile: the first call of each backend, compiled one after the other, Inductor first; kernels it compiles land in the "
              "on-disk kernel cache, where fusekit's compile finds the ones it shares, so this ratio favours fusekit "
              "(`benchmarks/bench_compile.py` times both with warm kernels).", "",
              "| model | batch | compile Inductor s | compile fusekit s | ratio | fusekit - Inductor logits (max abs) | eager - Inductor |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        ci, cf = r["backends"]["inductor"]["compile_s"], r["backends"]["fusekit"]["compile_s"]
        lines.append(f"| {r['model']} | {r['batch']} | {f(ci, '{:.1f}')} | {f(cf, '{:.1f}')} | "
                     f"{f(cf / ci if ci else None, '{:.2f}x')} | {f(r['fusekit_vs_inductor_max_abs'], '{:.2e}')} | "
                     f"{f(r['eager_vs_inductor_max_abs'], '{:.2e}')} |")
    failed = [(r, be, b["error"]) for r in results for be, b in r["backends"].items() if b.get("error")]
    if failed:
        lines += ["", "Backends whose step failed (not timed): " + "; ".join(
            f"{r['model']} b{r['batch']} {be}: {err}" for r, be, err in failed) + "."]
    missed = [(r, g) for r in results for g in r["backends"]["fusekit"].get("near_misses", [])]
    if missed:
        lines += ["", "Near misses of the attention and GEMM rules (what kept a layer's site from firing; count, one "
                  "example):", ""]
        lines += [f"- {r['model']} b{r['batch']}: {g['pattern']} x{g['count']} ({g['example'][:200]})" for r, g in missed]
    if gens:
        lines += ["", "generate (greedy, static cache, compiled by transformers' compile_config):", "",
                  "| model | batch | prompt + new | cache slots | backend | tokens/s | vs Inductor | first run s | tokens = eager | first divergence |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for gr in gens:
            base = gr["backends"].get("inductor", {}).get("tokens_per_s")
            for be, b in gr["backends"].items():
                if "error" in b:
                    lines.append(f"| {gr['model']} | {gr['batch']} | {gr['prompt']}+{gr['new_tokens']} | "
                                 f"{gr.get('cache_len', '-')} | {be} | error: {b['error']} | | | | |")
                    continue
                lines.append(f"| {gr['model']} | {gr['batch']} | {gr['prompt']}+{gr['new_tokens']} | "
                             f"{gr.get('cache_len', '-')} | {be} | {b['tokens_per_s']:,.0f} | {f(b['tokens_per_s'] / base if base else None, '{:.2f}x')} | "
                             f"{b['first_run_s']:.1f} | {b.get('tokens_equal_eager', '-')} | "
                             f"{f(b.get('first_divergence'), '{}')} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        ps = list(r["positions"])
        ys = [r["positions"][p].get("speedup+graph") or r["positions"][p].get("speedup") or 0 for p in ps]
        ax.plot([int(p) for p in ps], ys, marker="o", label=f"{r['model']} b{r['batch']}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("cache position")
    ax.set_ylabel("fusekit speed vs Inductor (decode step)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def warm_up(device: str, dtypes: set[torch.dtype], log: bool = True) -> None:
    """What would otherwise land in the first compile timed: Inductor's one-time start-up (compile workers, code
    cache), and on a GPU fusekit's tracing of its rules for `dtypes` (the install does it: python -m
    fusion_backend.build)."""
    torch.compile(lambda x: (x * 2).sin())(torch.randn(8, device=device))
    torch._dynamo.reset()
    if torch.device(device).type == "cuda":
        t_trace = time.time()
        build.trace_patterns(["cuda"], dtypes)
        if log:
            print(f"fusekit's rules for {', '.join(str(d)[6:] for d in sorted(dtypes, key=str))} traced or loaded in "
                  f"{time.time() - t_trace:.0f} s", flush=True)


def bench(names: list[str], out: pathlib.Path, device: str | None = None, batches: tuple[int, ...] | None = None,
          positions: tuple[int, ...] | None = None, generate: bool | None = None, gen_batch: int | None = None,
          gen_caches: tuple[int | None, ...] | None = None, enable: tuple[str, ...] = (),
          quant: str | None = None, ablate: tuple[str, ...] = ()) -> list[dict]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    names = [n for n in names if not models.MODELS[n].encoder]
    batches = batches or ((2,) if cpu else GPU_BATCHES)
    positions = positions or ((8, 40) if cpu else GPU_POSITIONS)
    cache_len = 64 if cpu else CACHE_LEN
    env = environment()
    bw = None if cpu else copy_bandwidth(device)
    env["copy_gbps"] = bw / 1e9 if bw else None
    env["enable"] = list(enable)
    env["quant"] = quant
    env["ablate"] = list(ablate)
    print(f"fusekit bench --phase decode{' --quant ' + quant if quant else ''} on {env['device']} "
          f"(torch {env['torch']}): {', '.join(names)}; "
          f"batches {batches}; positions {positions} of {cache_len}", flush=True)
    results: list[dict] = []
    gens: list[dict] = []
    warm_up(device, {models.MODELS[n].dtype for n in names})
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / "decode.json").write_text(json.dumps({"env": env, "steps": results, "generate": gens}, indent=1,
                                                    default=str))
        (out / "decode.md").write_text(markdown(results, gens, env))

    for i, name in enumerate(names, 1):
        for b in batches:
            print(f"[{i}/{len(names)} {time.time() - t0:5.0f}s] {name} batch {b}", flush=True)
            try:
                results.append(run_model(name, b, positions, device, cache_len, bw, log=lambda s: print(s, flush=True),
                                         enable=enable, quant=quant, ablate=ablate))
            except ModelCannotRun as e:  # a backend's failure is not caught: only the model's own eager step
                print(f"    skipped: {e}", flush=True)
                env.setdefault("skipped", []).append(f"{name} batch {b}: {e}")
                torch._dynamo.reset()
            save()
    if generate if generate is not None else not cpu:
        # the cache transformers sizes to the run, and (GPU) the bench's serving-sized one
        gen_caches = gen_caches or ((None,) if cpu else (None, cache_len))
        for name in names:
            for gc in gen_caches:
                print(f"[{time.time() - t0:5.0f}s] generate {name} (cache {gc or 'prompt + new'})", flush=True)
                gb = gen_batch or (2 if cpu else 32)
                gens.append(generate_bench(name, device, gb, 16 if cpu else 512, 16 if cpu else 256, gc,
                                           log=lambda s: print(s, flush=True), enable=enable))
                save()
    plot(results, out / "decode.png")
    print()
    print(markdown(results, gens, env))
    print(f"wrote {out / 'decode.md'}, {out / 'decode.json'}, {out / 'decode.png'}")
    return results
