"""fusekit::decode_attention alone on MHA decode shapes (one query row per head; GPT-NeoX, Phi-3, StableLM-2 and GPT-2
widths; batch 1 and 32; early, middle and late positions) against F.scaled_dot_product_attention with the same additive
mask (what Inductor's graph runs): the one-row tile and, forced by FUSEKIT_DECODE_ATTN_ROWS=4, the 4-row group tile.
Median us of triton.testing.do_bench (L2 flushed), the visible K/V bytes' share of the copy bandwidth, the error
against a float64 reference. Needs a CUDA GPU; prints a markdown table.

    python benchmarks/bench_decode_attention.py
"""
import argparse
import os

import torch
import torch.nn.functional as F


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    from fusion_backend import _ext

    print(_ext.load_for_device())
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x = torch.empty(1 << 28, device=dev, dtype=torch.uint8)
    t = do_bench(lambda: x.clone(), warmup=10, rep=100, return_mode="median")
    copy_bw = 2 * x.numel() / t / 1e6  # GB/s
    print(f"copy bandwidth {copy_bw:.0f} GB/s")
    models = {"gpt_neox": (16, 128, 4096), "phi3": (32, 96, 4096), "stablelm": (32, 64, 4096), "gpt2": (12, 64, 1024)}
    variants = {"rows4": {"FUSEKIT_DECODE_ATTN_ROWS": "4"}, "one_row": {}}
    ENVS = ("FUSEKIT_DECODE_ATTN_ROWS",)
    print("| model | B | pos | SDPA us | " + " | ".join(f"{v} us" for v in variants) + " | best vs SDPA | best % copy bw |")
    print("|---|---|---|---|" + "---|" * len(variants) + "---|---|")
    for name, (H, D, S) in models.items():
        for B in (1, 32):
            for pos in ((128, 1000) if S == 1024 else (128, 1024, 4000)):
                q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
                k = torch.randn(B, H, S, D, device=dev, dtype=dt)
                v = torch.randn(B, H, S, D, device=dev, dtype=dt)
                mask = torch.zeros(B, 1, 1, S, device=dev, dtype=dt)
                mask[..., pos + 1:] = torch.finfo(dt).min
                scale = D ** -0.5
                ts = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale), warmup=25, rep=200, return_mode="median")
                ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double(), scale=scale)
                res, outs = {}, {}
                for vn, env in variants.items():
                    for e in ENVS:
                        os.environ.pop(e, None)
                    os.environ.update(env)
                    f = lambda: torch.ops.fusekit.decode_attention(q, k, v, mask, scale)
                    outs[vn] = f()
                    res[vn] = do_bench(f, warmup=25, rep=200, return_mode="median")
                for e in ENVS:
                    os.environ.pop(e, None)
                err = max((o.double() - ref).abs().max().item() for o in outs.values())
                err_sdpa = (F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).double() - ref).abs().max().item()
                best = min(res.values())
                floor_us = 2 * B * H * (pos + 1) * D * 2 / copy_bw / 1e3
                print(f"| {name} | {B} | {pos} | {ts*1e3:.1f} | " + " | ".join(f"{res[vn]*1e3:.1f}" for vn in variants)
                      + f" | {ts/best:.2f}x | {100*floor_us/(best*1e3):.0f}% |"
                      + f" err {err:.1e} (sdpa {err_sdpa:.1e})", flush=True)


if __name__ == "__main__":
    main()
