"""Where a decode step's GPU time goes: torch.profiler's kernel table for Inductor and fusekit (one Llama-style
step, StaticCache of 4096 slots), and fusekit::decode_attention alone against its byte floor.
python benchmarks/profile_decode_step.py [--batch 32] [--position 1024] [--out DIR]"""
import argparse
import pathlib

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from fusion_backend.tools import decode_bench
from fusion_backend.backend import backend


def kernels(step, n=5):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--out", default="out/profile")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    st = decode_bench.Step(a.model, "cuda", a.batch, 4096)
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
    b, hkv, s, d = k.shape
    q = torch.randn(b, 1, 16, d, device="cuda", dtype=k.dtype).transpose(1, 2)
    keep = (torch.arange(s, device="cuda") <= a.position).view(1, 1, 1, s).expand(b, 1, 1, s)
    bias = torch.zeros(b, 1, 1, s, device="cuda", dtype=k.dtype).masked_fill(~keep, float("-inf"))
    op = torch.ops.fusekit.decode_attention
    ms = do_bench(lambda: op(q, k, v, bias, 0.088), warmup=25, rep=200, return_mode="median")
    vis = 2 * b * hkv * (a.position + 1) * d * k.element_size()
    bw = decode_bench.copy_bandwidth("cuda")
    print(f"decode_attention alone: {ms * 1e3:.1f} us; visible KV {vis / 1e6:.1f} MB -> floor {vis / bw * 1e6:.1f} us "
          f"({vis / bw * 1e3 / ms:.0%} of floor); copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    msb = do_bench(lambda: op(q, k, v, keep, 0.088), warmup=25, rep=200, return_mode="median")
    print(f"decode_attention, bool mask: {msb * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
