"""fusekit::decode_attention alone as a decode step runs it: 8 layers' caches (bf16, head dim 128, an additive
bf16 causal mask as transformers builds it), one call per layer captured in a CUDA graph, the graph replayed;
us per call, the median of 7 timings of 20 replays; and whether a replay gives what a direct call gives.

python benchmarks/bench_decode_attention_graph.py [--shapes "b1,mistral"]"""
import argparse
import statistics

import torch

from fusion_backend import _ext

SHAPES = [  # (name, batch, query heads, KV heads, cache slots, position)
    ("llama b1 @1024", 1, 16, 4, 4096, 1024), ("llama b1 @4000", 1, 16, 4, 4096, 4000),
    ("llama b32 @128", 32, 16, 4, 4096, 128), ("llama b32 @1024", 32, 16, 4, 4096, 1024),
    ("llama b32 @4000", 32, 16, 4, 4096, 4000), ("qwen2 b1 @1024", 1, 12, 2, 4096, 1024),
    ("qwen2 b1 @4000", 1, 12, 2, 4096, 4000), ("qwen2 b32 @1024", 32, 12, 2, 4096, 1024),
    ("mistral b1 window", 1, 16, 4, 1024, 1023), ("mistral b32 window", 32, 16, 4, 1024, 1023),
]


def time_graph(b, hq, hkv, slots, pos, layers=8):
    torch.manual_seed(0)
    dt, d = torch.bfloat16, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    caches = [(torch.randn(b, hkv, slots, d, device="cuda", dtype=dt), torch.randn(b, hkv, slots, d, device="cuda", dtype=dt))
              for _ in range(layers)]
    keep = torch.arange(slots, device="cuda") <= pos
    mask = torch.zeros(b, 1, 1, slots, device="cuda", dtype=dt).masked_fill(~keep, torch.finfo(dt).min)
    op = torch.ops.fusekit.decode_attention
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for k, v in caches:
            op(q, k, v, mask, 0.088)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [op(q, k, v, mask, 0.088) for k, v in caches]
    ref = [op(q, k, v, mask, 0.088) for k, v in caches]
    g.replay()
    same = all(torch.equal(a, r) for a, r in zip(outs, ref))
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(7):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(20):
            g.replay()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1e3 / (20 * layers))
    del caches, g
    return statistics.median(times), same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape names")
    a = ap.parse_args()
    _ext.load_for_device()  # the kernels load on first use otherwise
    shapes = [s for s in SHAPES if not a.shapes or any(x in s[0] for x in a.shapes.split(","))]
    print(f"# decode_attention alone, 8 layers in a CUDA graph: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| shape | us per call | replay == direct call |\n|---|---|---|", flush=True)
    for name, *shape in shapes:
        us, same = time_graph(*shape)
        print(f"| {name} | {us:.1f} | {'yes' if same else 'NO'} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
