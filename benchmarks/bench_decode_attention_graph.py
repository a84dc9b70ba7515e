"""fusekit::decode_attention alone as a decode step runs it: 8 layers' caches (bf16, head dim 128, an additive
bf16 causal mask as transformers builds it), one call per layer captured in a CUDA graph, the graph replayed;
us per call, the median of 7 timings of 20 replays; and whether a replay gives what a direct call gives.
GPT-2's shapes take head dim 64. --variants captures one more graph per VAR=value (a FUSEKIT_* switch the op
reads at each launch) on the same caches, timed interleaved, and says whether each equals the default bit for bit.

python benchmarks/bench_decode_attention_graph.py [--shapes "b1,mistral"] [--variants FUSEKIT_DECODE_ATTN_SPLITS=8]"""
import argparse
import statistics

import torch

from fusion_backend import _ext
from fusion_backend.tools.cuda_graphs import capture_output

SHAPES = [  # (name, batch, query heads, KV heads, cache slots, position[, head dim: 128])
    ("llama b1 @1024", 1, 16, 4, 4096, 1024), ("llama b1 @4000", 1, 16, 4, 4096, 4000),
    ("llama b32 @128", 32, 16, 4, 4096, 128), ("llama b32 @1024", 32, 16, 4, 4096, 1024),
    ("llama b32 @4000", 32, 16, 4, 4096, 4000), ("llama b64 @1024", 64, 16, 4, 4096, 1024), ("qwen2 b1 @1024", 1, 12, 2, 4096, 1024),
    ("qwen2 b1 @4000", 1, 12, 2, 4096, 4000), ("qwen2 b32 @1024", 32, 12, 2, 4096, 1024),
    ("mistral b1 window", 1, 16, 4, 1024, 1023), ("mistral b32 window", 32, 16, 4, 1024, 1023),
    ("gpt2 b32 @512", 32, 12, 12, 1024, 512, 64), ("gpt2 b32 @1000", 32, 12, 12, 1024, 1000, 64),
    ("gpt2 b64 @1000", 64, 12, 12, 1024, 1000, 64),
]


def replay_us(g, calls, replays=20):
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(replays):
        g.replay()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) * 1e3 / (replays * calls)


def time_graph(b, hq, hkv, slots, pos, d=128, variants=(None,), layers=8):
    """us per call for each variant (median of 7 interleaved timings); whether the default's replay equals a
    direct call; whether each variant's outputs equal the default's."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    caches = [(torch.randn(b, hkv, slots, d, device="cuda", dtype=dt), torch.randn(b, hkv, slots, d, device="cuda", dtype=dt))
              for _ in range(layers)]
    keep = torch.arange(slots, device="cuda") <= pos
    mask = torch.zeros(b, 1, 1, slots, device="cuda", dtype=dt).masked_fill(~keep, torch.finfo(dt).min)
    op = torch.ops.fusekit.decode_attention

    def graph(variant):  # one call per layer, captured with VAR=value set
        var, _, value = (variant or "").partition("=")
        g, outs = capture_output(lambda: [op(q, k, v, mask, 0.088) for k, v in caches], {var: value} if var else None)
        assert g is not None, variant
        return g, outs

    graphs = {v: graph(v) for v in variants}
    ref = [op(q, k, v, mask, 0.088) for k, v in caches]
    for g, _ in graphs.values():
        g.replay()
    base = graphs[variants[0]][1]
    same = all(torch.equal(a, r) for a, r in zip(base, ref))
    agree = {v: all(torch.equal(a, r) for a, r in zip(outs, base)) for v, (_, outs) in graphs.items()}
    for g, _ in graphs.values():
        for _ in range(5):
            g.replay()
    times = {v: [] for v in variants}
    for _ in range(7):
        for v, (g, _) in graphs.items():
            times[v].append(replay_us(g, layers))
    del caches, graphs
    return {v: statistics.median(t) for v, t in times.items()}, same, agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape names")
    ap.add_argument("--variants", default="", help="comma-separated VAR=value, each timed beside the default")
    a = ap.parse_args()
    _ext.load_for_device()  # the kernels load on first use otherwise
    shapes = [s for s in SHAPES if not a.shapes or any(x in s[0] for x in a.shapes.split(","))]
    variants = [None] + [v for v in a.variants.split(",") if v]
    names = ["default" if v is None else v for v in variants]
    print(f"# decode_attention alone, 8 layers in a CUDA graph: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| shape | " + " | ".join(f"us per call ({n})" for n in names) + " | replay == direct call | variants == default |")
    print("|---" * (len(names) + 3) + "|", flush=True)
    for name, *shape in shapes:
        us, same, agree = time_graph(*shape, variants=tuple(variants))
        cells = " | ".join(f"{us[v]:.1f}" for v in variants)
        print(f"| {name} | {cells} | {'yes' if same else 'NO'} | {'yes' if all(agree.values()) else 'NO'} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
