"""Where a decode step's GPU time goes: torch.profiler's kernel table for Inductor and fusekit (one Llama-style
step, StaticCache of 4096 slots), and fusekit::decode_attention alone against its byte floor.
python benchmarks/profile_decode_step.py [--batch 32] [--position 1024] [--out DIR]
python benchmarks/profile_decode_step.py --op-only [--batches 1,8,32]: each kernel of the op alone (us per call)
python benchmarks/profile_decode_step.py --timeline [--batch 32]: fusekit's step as a CUDA graph, each kernel's share
of the step's critical path (how far it moves the step's last kernel end: with PDL, kernels overlap, so their
durations add up to more than the step)"""
import argparse
import collections
import json
import pathlib
import re

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from fusion_backend.backend import backend
from fusion_backend.tools import decode_bench

# what a kernel's name says it does (first match wins)
KINDS = (("Triton (Inductor)", r"^triton_"),  # before the others: a fused kernel names the ops around it
         ("fusekit attention", r"fusekit|decode_attention|combine_splits|hidden_rows"),
         ("SDPA (cuDNN/flash/efficient)", r"cudnn|fmha|flash|attention|sdpa"),
         ("GEMM (cuBLAS)", r"nvjet|gemm|cublas|sm90_xmma|splitKreduce|cutlass"),
         ("other", r"."))


def kernels(step, n=5):
    """The kernel table of n steps, and GPU us per step by kind of kernel."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    by_kind, count = collections.Counter(), collections.Counter()
    for e in events:
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us <= 0:
            continue
        kind = next(k for k, rx in KINDS if re.search(rx, e.key, re.IGNORECASE))
        by_kind[kind] += us / n
        count[kind] += e.count / n
    total = sum(by_kind.values())
    lines = [f"{k:32s} {us:9.1f} us/step {us / total:5.0%}  {count[k]:5.0f} kernels/step" for k, us in by_kind.most_common()]
    lines.append(f"{'GPU busy':32s} {total:9.1f} us/step")
    table = events.table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=90)
    return table + "\n" + "\n".join(lines)


def masks(b, s, pos, dtype):
    """A static cache's causal mask at `pos`: bool (True = attend) and additive, as transformers builds it
    in bf16 (hidden = -65536)."""
    keep = (torch.arange(s, device="cuda") <= pos).view(1, 1, 1, s).expand(b, 1, 1, s)
    return keep, torch.zeros(b, 1, 1, s, device="cuda", dtype=dtype).masked_fill(~keep, -65536.0)


def visible_bytes(k, pos):
    """The K and V bytes a step at `pos` must read: slots 0..pos of every sequence and KV head."""
    b, hkv, _, d = k.shape
    return 2 * b * hkv * (pos + 1) * d * k.element_size()


def op_kernels(batches, positions, s=4096, hkv=4, hq=16, d=128):
    """us per call of each kernel the op launches, at the Llama-style step's shapes (bf16, transformers' mask)."""
    op = torch.ops.fusekit.decode_attention
    for b in batches:
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=k.dtype).transpose(1, 2)
        for pos in positions:
            _, bias = masks(b, s, pos, k.dtype)
            for _ in range(5):
                op(q, k, v, bias, 0.088)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    op(q, k, v, bias, 0.088)
                torch.cuda.synchronize()
            parts = [(e.key.split("(")[0].split("::")[-1].split("<")[0], e.self_device_time_total / e.count)
                     for e in prof.key_averages() if e.count >= 20 and e.self_device_time_total > 0]
            vis = visible_bytes(k, pos)
            print(f"op b{b} @{pos}: " + ", ".join(f"{n} {us:.1f} us" for n, us in parts)
                  + f"; total {sum(us for _, us in parts):.1f} us for {vis / 1e6:.1f} MB visible", flush=True)


def short(name):
    """A kernel's name without its namespace, template arguments' namespaces and parameter list."""
    name = re.sub(r"\(anonymous namespace\)::", "", name.replace("void ", ""))
    return re.sub(r"\w+::", "", re.sub(r"\(.*", "", name))[:60]


def timeline(st, fn, out, replays=10, gap_us=30.0):
    """Replays of the step's CUDA graph under torch.profiler: per kernel name, us per step by which it moves the
    step's last kernel end (the first kernel of a replay counts whole); replays are told apart by a gap."""
    from fusion_backend.tools.cuda_graphs import capture_output

    st.restore()
    g, _ = capture_output(st.repeated(fn))
    assert g is not None, "the step could not be captured"
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
            torch.cuda.synchronize()
    trace = out / "timeline_trace.json"
    prof.export_chrome_trace(str(trace))
    ks = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in json.loads(trace.read_text())["traceEvents"]
                if e.get("cat") == "kernel")
    adv, dur, cnt = collections.Counter(), collections.Counter(), collections.Counter()
    end, walls, first, seq = None, [], None, []  # seq: per replay, (start, duration, on path, name)
    for t0, t1, name in ks:
        if end is None or t0 - end > gap_us:  # a new replay
            if end is not None:
                walls.append(end - first)
            end, first = t0, t0
            seq.append([])
        n = short(name)
        a = max(0.0, t1 - end)
        adv[n] += a
        dur[n] += t1 - t0
        cnt[n] += 1
        seq[-1].append((t0 - first, t1 - t0, a, n))
        end = max(end, t1)
    walls.append(end - first)
    steps = len(seq)
    same = [r for r in seq if [x[3] for x in r] == [x[3] for x in seq[-1]]]  # replays with the same kernels
    med = lambda xs: sorted(xs)[len(xs) // 2]
    last = [f"{i:4d} {med([r[i][0] for r in same]):8.1f} {med([r[i][1] for r in same]):7.1f} "
            f"{min(r[i][1] for r in same):6.1f}-{max(r[i][1] for r in same):5.1f} {med([r[i][2] for r in same]):7.1f}  {n}"
            for i, (_, _, _, n) in enumerate(seq[-1])]
    lines = [f"{steps} replays; step wall {sum(walls) / len(walls):.1f} us (first kernel start to last end); "
             f"kernel time {sum(dur.values()) / steps:.1f} us per step",
             f"{'kernel':60s} {'calls':>6s} {'us/step on path':>16s} {'us/step busy':>13s}"]
    for n, us in adv.most_common():
        lines.append(f"{n:60s} {cnt[n] / steps:6.0f} {us / steps:16.1f} {dur[n] / steps:13.1f}")
    lines += ["", f"in order, medians over {len(same)} replays: index, start us, duration us (min-max), us on the path, "
              "kernel"] + last
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op-only", action="store_true")
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--model", default="llama")
    ap.add_argument("--heads", default="16/4", help="--op-only: query heads / KV heads")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--out", default="out/profile")
    a = ap.parse_args()
    if a.op_only:
        from fusion_backend import _ext
        _ext.load_for_device()
        hq, hkv = (int(x) for x in a.heads.split("/"))
        return op_kernels([int(x) for x in a.batches.split(",")], (128, 1024, 4000), hkv=hkv, hq=hq)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    st = decode_bench.Step(a.model, "cuda", a.batch, 4096)
    if a.timeline:
        with torch.no_grad():
            st.at(a.position)
            fn = torch.compile(st.model, backend=backend())
            st(fn)
            text = timeline(st, fn, out)
        (out / "timeline.txt").write_text(text)
        print(f"== fusekit: b{a.batch} @{a.position}, CUDA graph\n{text}", flush=True)
        return
    with torch.no_grad():
        for name, fn in (("inductor", torch.compile(st.model)), ("fusekit", torch.compile(st.model, backend=backend()))):
            torch._dynamo.reset()
            st.restore()
            st.at(a.position)
            step = st.repeated(fn)
            step()
            table = kernels(step)
            (out / f"kernels_{name}.txt").write_text(table)
            print(f"== {name}: b{a.batch} @{a.position}, 5 steps\n{table}", flush=True)
    # the op alone at the step's shapes: 16 query heads over 4 KV heads, head dim 128, bf16
    lay = st.cache.layers[0]
    k, v = lay.keys, lay.values
    b, _, s, d = k.shape
    q = torch.randn(b, 1, 16, d, device="cuda", dtype=k.dtype).transpose(1, 2)
    op = torch.ops.fusekit.decode_attention
    bw = decode_bench.copy_bandwidth("cuda")
    for pos in sorted({128, a.position, 2048, 4000}):  # the op alone, L2 flushed between calls (do_bench)
        keep, bias = masks(b, s, pos, k.dtype)
        ms = do_bench(lambda m=bias: op(q, k, v, m, 0.088), warmup=25, rep=200, return_mode="median")
        msb = do_bench(lambda m=keep: op(q, k, v, m, 0.088), warmup=25, rep=200, return_mode="median")
        vis = visible_bytes(k, pos)
        print(f"decode_attention alone @{pos}: {ms * 1e3:.1f} us (bool mask {msb * 1e3:.1f} us); visible KV "
              f"{vis / 1e6:.1f} MB -> floor {vis / bw * 1e6:.1f} us ({vis / bw * 1e3 / ms:.0%} of floor); "
              f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
