"""fusekit::decode_attention alone on decode shapes (one new token per sequence; batch 1 and 32; early, middle and late
positions of the cache) against F.scaled_dot_product_attention with the same additive mask (what Inductor's graph
runs; grouped heads through repeat_kv, as transformers' SDPA path does): grouped-head shapes (Llama-3, Qwen2.5,
Gemma-3 and Gemma-2 widths) and MHA shapes (GPT-NeoX, Phi-3, StableLM-2 and GPT-2 widths, where a one-row tile runs:
the streaming tile on sm_90 builds; the tensor-core one-row tile and the 4-row group tile, forced by
FUSEKIT_DECODE_ATTN_ROWS=1 and 4, beside it). Median us of triton.testing.do_bench (L2 flushed), the visible K/V
bytes' share of the copy bandwidth, the error against a float64 reference. --splits also times each forced split
count (FUSEKIT_DECODE_ATTN_SPLITS), --stages each forced ring depth of the streaming tile
(FUSEKIT_DECODE_ATTN_STAGES). Needs a CUDA GPU; prints a markdown table.

    python benchmarks/bench_decode_attention.py [--shapes gqa|mha|all] [--splits 4,8,16] [--stages 2,3,4]
"""
import argparse

import torch
import torch.nn.functional as F

# name: (query heads, KV heads, head dim, cache slots)
GQA = {"llama3_1b": (32, 8, 64, 4096), "llama": (16, 4, 128, 4096), "qwen2.5_1.5b": (12, 2, 128, 4096),
       "gemma3_1b": (4, 1, 256, 4096), "gemma2_2b": (8, 4, 256, 4096)}
MHA = {"gpt_neox": (16, 16, 128, 4096), "phi3": (32, 32, 96, 4096), "stablelm": (32, 32, 64, 4096),
       "gpt2": (12, 12, 64, 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="all", choices=("gqa", "mha", "all"))
    ap.add_argument("--splits", default="", help="comma-separated split counts also timed (forced)")
    ap.add_argument("--stages", default="", help="MHA shapes: comma-separated ring depths of the streaming tile "
                    "also timed (forced)")
    ap.add_argument("--batches", default="1,32")
    a = ap.parse_args()
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    from fusion_backend import _ext
    from fusion_backend.patterns.decode import repeat_kv
    from fusion_backend.tools.cuda_graphs import environment
    from fusion_backend.tools.decode_bench import copy_bandwidth

    print(_ext.load_for_device())
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    shapes = {**(GQA if a.shapes != "mha" else {}), **(MHA if a.shapes != "gqa" else {})}
    forced = [("FUSEKIT_DECODE_ATTN_SPLITS", s) for s in a.splits.split(",") if s]
    stages = [("FUSEKIT_DECODE_ATTN_STAGES", s) for s in a.stages.split(",") if s]
    bench = lambda f: do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3  # noqa: E731 - us
    print("| model | B | pos | SDPA us | fusekit us | vs SDPA | % copy | one-row mma tile us | 4-row tile us | "
          + "".join(f"splits {s} us | " for _, s in forced) + "".join(f"stages {s} us | " for _, s in stages)
          + "err (SDPA's) |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * (len(forced) + len(stages)) + "---|")
    for name, (hq, hkv, d, s) in shapes.items():
        for b in (int(x) for x in a.batches.split(",")):
            for pos in ((128, 1000) if s == 1024 else (128, 1024, 4000)):
                q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
                k = torch.randn(b, hkv, s, d, device=dev, dtype=dt)
                v = torch.randn(b, hkv, s, d, device=dev, dtype=dt)
                mask = torch.zeros(b, 1, 1, s, device=dev, dtype=dt)
                mask[..., pos + 1:] = torch.finfo(dt).min
                scale = d ** -0.5
                n = hq // hkv
                sdpa = lambda: F.scaled_dot_product_attention(  # noqa: E731
                    q, repeat_kv(k, n), repeat_kv(v, n), attn_mask=mask, scale=scale)
                fk = lambda: torch.ops.fusekit.decode_attention(q, k, v, mask, scale)  # noqa: E731
                ref = F.scaled_dot_product_attention(q.double(), repeat_kv(k, n).double(), repeat_kv(v, n).double(),
                                                     attn_mask=mask.double(), scale=scale)
                ts, t = bench(sdpa), bench(fk)
                outs = [fk()]
                one_row = n == 1 and d <= 128  # (MHA: a one-row tile runs)
                tiles = "- | - | "
                if one_row:
                    tiles = ""
                    for rows in ("1", "4"):
                        with environment({"FUSEKIT_DECODE_ATTN_ROWS": rows}):  # read at each launch
                            outs.append(fk())
                            tiles += f"{bench(fk):.1f} | "
                cols = ""
                for var, val in forced + (stages if one_row else []):
                    with environment({var: val}):
                        outs.append(fk())
                        cols += f"{bench(fk):.1f} | "
                cols += "" if one_row else "- | " * len(stages)
                err = max((o.double() - ref).abs().max().item() for o in outs)
                err_sdpa = (sdpa().double() - ref).abs().max().item()
                floor_us = 2 * b * hkv * (pos + 1) * d * 2 / bw * 1e6  # the visible K and V rows
                print(f"| {name} | {b} | {pos} | {ts:.1f} | {t:.1f} | {ts / t:.2f}x | {100 * floor_us / t:.0f}% | "
                      f"{tiles}{cols}{err:.1e} ({err_sdpa:.1e}) |", flush=True)


if __name__ == "__main__":
    main()
