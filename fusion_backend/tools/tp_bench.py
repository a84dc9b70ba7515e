"""``fusekit bench --phase decode|prefill|both --tp N[,M]``: one decode step (or a prefill: ``--seq`` tokens a
sequence into the StaticCache) of a decoder sharded over N GPUs with transformers' tensor-parallel plan
(``from_pretrained(path, tp_plan="auto")``: DTensor weights, functional all-reduces in the graph, one process a GPU
over NCCL), Inductor against fusekit, each replayed as a CUDA graph on every rank. Per TP size and batch: ms per
step (the slowest rank's), the ratio, the share of the per-GPU byte floor (decode: the rank's weight shards and KV
rows at the copy bandwidth), the rules fired on rank 0, compile times, and both backends' logits against the
sharded eager step's. TP size 1 is the unsharded model in one process, for the scaling in the same run.

Without a GPU it runs the tiny configurations over gloo with fusekit's CPU references: rules and logits are checked,
nothing is timed. Writes tp.md, tp.json and tp.png.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from .. import collectives
from . import models
from .cuda_graphs import capture
from .decode_bench import WITHOUT, Prompt, Step, _compile, copy_bandwidth, first_call, step_sites, warm_up

BACKENDS = ("inductor", "fusekit")
ROUNDS = 5  # interleaved rounds; each times REPS replays of each backend's graph
REPS = 50
# The machine's NVLink multicast stays off (it can take the host's GPUs down): set for the ranks too
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(rank: int, world: int, port: int, backend: str) -> None:
    """This process as rank `rank` of `world` on this host, as torchrun would start it (transformers' tensor-parallel
    loading and fusekit's collective rewrite read LOCAL_RANK / LOCAL_WORLD_SIZE)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group(backend, rank=rank, world_size=world)


def _max_over_ranks(x: float, device: str) -> float:
    """The largest of each rank's x (a step is as slow as its slowest rank); x itself without a process group."""
    if not dist.is_initialized():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _ms_per_call(fn, device: str) -> float:
    """ms per call of fn over REPS back-to-back calls, every rank starting together (a fixed count: ranks that chose
    their own counts, as do_bench does, would wait on each other's collectives forever)."""
    if dist.is_initialized():
        dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / REPS


def _load(path: str, world: int, device: str, dtype: torch.dtype) -> Any:
    import transformers

    if world == 1:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=dtype).eval()
    collectives.drop_backward_hooks(model)  # training-only hooks that break the graph at every layer (both backends)
    return model


def run_tp(name: str, desc: dict, path: str, world: int, batch: int, position: int, device: str, cache_len: int,
           bw: float | None, ablate: tuple[str, ...] = (), phase: str = "decode", seq: int = 512) -> dict:
    """On every rank: one model's step at `batch` (a decode step at `position`, or a prefill of `seq` tokens), eager
    (the reference), Inductor, fusekit and fusekit without each rule of `ablate`; the result rank 0 keeps. `device`
    is this rank's."""
    cpu = device == "cpu"
    dtype = getattr(torch, desc["dtype"])
    built = (_load(path, world, device, dtype), desc)
    prefill = phase == "prefill"
    st = Prompt(name, device, batch, seq, cache_len, built=built) if prefill else Step(name, device, batch, cache_len,
                                                                                       built=built)
    res: dict[str, Any] = {**st.desc, "phase": phase, "tp": world, "batch": batch,
                           "position": None if prefill else position, "cache_len": st.cache_len,
                           "process_group": dist.get_backend() if world > 1 else "-",
                           "backends": {}}
    logits: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        torch._dynamo.reset()
        logits["eager"] = first_call(st, st.model, position, cpu)[0]
        steps = {}
        backends = (*BACKENDS, *(WITHOUT + r for r in ablate))
        for be in backends:
            fn = (_compile("fusekit", st.model, cpu, disable=tuple(be.removeprefix(WITHOUT).split("+")))
                  if be.startswith(WITHOUT)
                  else _compile(be, st.model, cpu))
            logits[be], compile_s, rep = first_call(st, fn, position, cpu)
            info: dict[str, Any] = {"compile_s": compile_s, **(step_sites(rep) if be != "inductor" else {})}
            info["max_abs_vs_eager"] = (logits[be] - logits["eager"]).abs().max().item()
            res["backends"][be] = info
            steps[be] = st.repeated(fn)
        if not cpu:
            graphs = {be: capture(steps[be]) for be in backends}
            timed = {be: (g.replay if g is not None else steps[be]) for be, g in graphs.items()}
            res["graphs"] = all(g is not None for g in graphs.values())
            rounds: dict[str, list[float]] = {be: [] for be in backends}
            for _ in range(ROUNDS):
                for be, fn in timed.items():
                    rounds[be].append(_ms_per_call(fn, device))
            del graphs, timed
            for be, ts in rounds.items():
                res["backends"][be]["ms"] = _max_over_ranks(statistics.median(ts), device)
            i, f = res["backends"]["inductor"]["ms"], res["backends"]["fusekit"]["ms"]
            res["speedup"] = i / f
            if not prefill:  # a prefill's floor is its arithmetic, not its bytes
                floor_s = (st.weight_bytes() + st.kv_bytes(position)) / bw
                res["floor_ms"] = _max_over_ranks(floor_s * 1e3, device)
                res["floor_frac"] = res["floor_ms"] / f
            for r in ablate:  # what the rule gains: fusekit without it over fusekit
                res["backends"][WITHOUT + r]["gain"] = res["backends"][WITHOUT + r]["ms"] / f
        del steps
        torch._dynamo.reset()
    del st
    if not cpu:
        torch.cuda.empty_cache()
    return res


def _rank(rank: int, world: int, port: int, jobs: list[tuple[str, dict, str]], batches: dict[str, tuple[int, ...]],
          position: int, cache_len: int, out: str, ablate: tuple[str, ...], seq: int) -> None:
    """`batches`: each phase's (decode, prefill), in the order run."""
    os.environ.update(NO_MULTICAST)
    cpu = not torch.cuda.is_available()
    device = "cpu" if cpu else f"cuda:{rank}"
    if world > 1:
        if not cpu:
            torch.cuda.set_device(rank)
        init_rank(rank, world, port, "gloo" if cpu else "nccl")
    try:
        bw = None if cpu else copy_bandwidth(device)
        if not cpu:  # (nothing is timed on CPU)
            warm_up(device, {getattr(torch, desc["dtype"]) for _, desc, _ in jobs}, log=rank == 0)
        results = []
        for name, desc, path in jobs:
            for phase, b in [(p, b) for p, bs in batches.items() for b in bs]:
                r = run_tp(name, desc, path, world, b, position, device, cache_len, bw, ablate, phase, seq)
                if rank == 0:
                    r["copy_gbps"] = bw / 1e9 if bw else None
                    results.append(r)
                    print(_line(r), flush=True)
        if rank == 0:
            pathlib.Path(out).write_text(json.dumps(results, default=str))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _line(r: dict) -> str:
    i, f = r["backends"]["inductor"], r["backends"]["fusekit"]
    floor = f", floor {r['floor_frac']:.0%}" if "floor_frac" in r else ""
    timed = f"  {i['ms']:.3f} -> {f['ms']:.3f} ms ({r['speedup']:.2f}x{floor})" if "ms" in f else ""
    timed += "".join(f"; {be} {v['ms']:.3f} ms" for be, v in r["backends"].items() if "gain" in v)
    return (f"  {r['model']:8s} tp{r['tp']} {r['process_group']:8s} {_step(r):12s} b{r['batch']:<3d}{timed}  err vs eager fusekit {f['max_abs_vs_eager']:.2e}"
            f" inductor {i['max_abs_vs_eager']:.2e}  fused {f['sites']}")


def _step(r: dict) -> str:
    return f"prefill {r['seq']}" if r.get("phase") == "prefill" else f"decode at {r['position']}"


def markdown(results: list[dict], env: dict) -> str:
    ablated = list(dict.fromkeys(be for r in results for be in r["backends"] if be.startswith(WITHOUT)))
    where = f"{env['gpus']} x {env['device']}" if env["gpus"] else f"{env['device']}, gloo ranks, nothing timed"
    cache = results[0]["cache_len"] if results else "-"
    lines = [f"# fusekit tensor-parallel steps on {where}",
             "",
             f"torch {env['torch']}, transformers {env['transformers']}; transformers' tp_plan=\"auto\" (TP 1: the "
             f"unsharded model); a decode step at a position of a {cache}-slot StaticCache, or a prefill "
             "of a prompt into it from slot 0; CUDA graphs for both backends; ms per step of the slowest rank "
             f"(median of {ROUNDS} rounds of {REPS} replays); floor (decode): the rank's weight shards + KV rows at "
             "the copy bandwidth.",
             "",
             "| model | TP | process group | batch | step | Inductor ms | fusekit ms | speed-up | per-GPU floor ms | "
             "floor share "
             + "".join(f"| {be} ms (the rule's gain) " for be in ablated)
             + "| max abs vs eager (Inductor / fusekit) | compile fusekit / Inductor | rules fired (rank 0) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(ablated)]
    f3 = lambda x: f"{x:.3f}" if isinstance(x, float) else "-"  # noqa: E731
    for r in results:
        i, f = r["backends"]["inductor"], r["backends"]["fusekit"]
        without = [r["backends"].get(be, {}) for be in ablated]
        lines.append(
            f"| {r['model']} | {r['tp']} | {r['process_group']} | {r['batch']} | {_step(r)} | {f3(i.get('ms'))} | "
            f"{f3(f.get('ms'))} | "
            + (f"{r['speedup']:.2f}x | " if "speedup" in r else "- | ")
            + (f"{r['floor_ms']:.3f} | {r['floor_frac']:.0%} | " if "floor_frac" in r else "- | - | ")
            + "".join(f"{f3(w['ms'])} ({w['gain']:.2f}x) | " if "gain" in w else "- | " for w in without)
            + f"{i['max_abs_vs_eager']:.2e} / {f['max_abs_vs_eager']:.2e} | "
            f"{f['compile_s'] / i['compile_s']:.2f}x | "
            + ", ".join(f"{k.split('.', 1)[1]} x{v}" for k, v in sorted(f["sites"].items())) + " |")
    misses = {(r["model"], r["tp"], r.get("phase", "decode")): r["backends"]["fusekit"]["near_misses"]
              for r in results}
    misses = {k: v for k, v in misses.items() if v}
    if misses:
        lines += ["", "Near misses (rank 0):"]
        lines += [f"- {m} tp{t} {ph}: " + "; ".join(f"{g['pattern']} x{g['count']}: {g['example']}" for g in v)
                  for (m, t, ph), v in misses.items()]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: pathlib.Path) -> None:
    rows = [r for r in results if "speedup" in r]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, len(rows) * 0.8), 3.5))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows])
    ax.set_xticks(range(len(rows)), [f"{r['model']}\ntp{r['tp']} b{r['batch']}\n{_step(r)}" for r in rows],
                  fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("fusekit speed vs Inductor (step)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _unshardable(config: Any, tp: int) -> str | None:
    """Why transformers' plan cannot split this model over `tp` ranks (a rank would hold part of a head), or None."""
    for key in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(config, key, None)
        if tp > 1 and isinstance(n, int) and n % tp:
            return f"{key} = {n} is not a multiple of {tp}"
    return None


def bench(names: list[str], out: pathlib.Path, tps: tuple[int, ...], batches: tuple[int, ...] | None = None,
          position: int | None = None, ablate: tuple[str, ...] = (), phases: tuple[str, ...] = ("decode",),
          prefill_batch: int | None = None, seq: int | None = None) -> list[dict]:
    """`batches`: the decode steps'; `prefill_batch` x `seq`: the prefill's prompt (GPU default 4 x 512)."""
    import torch.multiprocessing as mp

    from .e2e import environment

    cpu = not torch.cuda.is_available()
    gpus = 0 if cpu else torch.cuda.device_count()
    if not cpu and max(tps) > gpus:
        raise SystemExit(f"--tp {max(tps)} needs {max(tps)} GPUs; this machine has {gpus}")
    per_phase = {"decode": batches or ((2,) if cpu else (1, 32)), "prefill": (prefill_batch or (2 if cpu else 4),)}
    per_phase = {p: per_phase[p] for p in phases}
    cache_len = 64 if cpu else 4096
    position = position or (40 if cpu else 1024)
    seq = seq or (16 if cpu else 512)
    env = {**environment(), "gpus": gpus}
    out.mkdir(parents=True, exist_ok=True)
    print(f"fusekit bench --phase {','.join(phases)} --tp {','.join(map(str, tps))} on {env['device']} x{gpus} "
          f"(torch {env['torch']}): {', '.join(names)}; "
          + "; ".join(f"decode batches {b} at position {position} of {cache_len}" if p == "decode"
                      else f"prefill {b[0]} x {seq}" for p, b in per_phase.items()), flush=True)
    results: list[dict] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for name in names:  # random weights, saved once: every rank loads its shard of the same model
            model, _, desc = models.make(name, "cpu" if cpu else "cuda")
            model.save_pretrained(f"{tmp}/{name}")
            jobs.append((name, desc, f"{tmp}/{name}", model.config))
            del model
        if not cpu:
            torch.cuda.empty_cache()
        for tp in tps:
            print(f"[{time.time() - t0:5.0f}s] TP {tp}", flush=True)
            for name, *_, config in jobs:
                if why := _unshardable(config, tp):
                    print(f"  {name:8s} tp{tp}: skipped: {why}", flush=True)
            runs = [j[:3] for j in jobs if not _unshardable(j[3], tp)]
            if not runs:
                continue
            part = pathlib.Path(tmp) / f"tp{tp}.json"
            mp.spawn(_rank, args=(tp, free_port(), runs, per_phase, position, cache_len, str(part), ablate, seq),
                     nprocs=tp)
            results += json.loads(part.read_text())
            (out / "tp.json").write_text(json.dumps({"env": env, "steps": results}, indent=1, default=str))
            (out / "tp.md").write_text(markdown(results, env))
    plot(results, out / "tp.png")
    print()
    print(markdown(results, env))
    print(f"wrote {out / 'tp.md'}, {out / 'tp.json'}" + (f", {out / 'tp.png'}" if not cpu else ""))
    return results
