"""fusekit::decode_attention alone on MHA decode shapes (one query row per head; GPT-NeoX, Phi-3, StableLM-2 and GPT-2
widths; batch 1 and 32; early, middle and late positions) against F.scaled_dot_product_attention with the same additive
mask (what Inductor's graph runs): the one-row tile and, forced by FUSEKIT_DECODE_ATTN_ROWS=4, the 4-row group tile.
Median us of triton.testing.do_bench (L2 flushed), the visible K/V bytes' share of the copy bandwidth, the error
against a float64 reference. Needs a CUDA GPU; prints a markdown table.

    python benchmarks/bench_decode_attention.py
"""
import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    from fusion_backend import _ext
    from fusion_backend.tools.cuda_graphs import environment
    from fusion_backend.tools.decode_bench import copy_bandwidth

    print(_ext.load_for_device())
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    models = {"gpt_neox": (16, 128, 4096), "phi3": (32, 96, 4096), "stablelm": (32, 64, 4096), "gpt2": (12, 64, 1024)}
    print("| model | B | pos | SDPA us | 4-row tile us | one-row tile us | one-row vs SDPA | one-row % copy | err (SDPA's) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (H, D, S) in models.items():
        for B in (1, 32):
            for pos in ((128, 1000) if S == 1024 else (128, 1024, 4000)):
                q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
                k = torch.randn(B, H, S, D, device=dev, dtype=dt)
                v = torch.randn(B, H, S, D, device=dev, dtype=dt)
                mask = torch.zeros(B, 1, 1, S, device=dev, dtype=dt)
                mask[..., pos + 1:] = torch.finfo(dt).min
                scale = D ** -0.5
                sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # noqa: E731
                fk = lambda: torch.ops.fusekit.decode_attention(q, k, v, mask, scale)  # noqa: E731
                ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double(),
                                                     scale=scale)
                ts = do_bench(sdpa, warmup=25, rep=200, return_mode="median")
                with environment({"FUSEKIT_DECODE_ATTN_ROWS": "4"}):  # read at each launch
                    four, t4 = fk(), do_bench(fk, warmup=25, rep=200, return_mode="median")
                one, t1 = fk(), do_bench(fk, warmup=25, rep=200, return_mode="median")
                err = max((o.double() - ref).abs().max().item() for o in (one, four))
                err_sdpa = (sdpa().double() - ref).abs().max().item()
                floor_ms = 2 * B * H * (pos + 1) * D * 2 / bw * 1e3  # the visible K and V rows
                print(f"| {name} | {B} | {pos} | {ts * 1e3:.1f} | {t4 * 1e3:.1f} | {t1 * 1e3:.1f} | {ts / t1:.2f}x | "
                      f"{100 * floor_ms / t1:.0f}% | {err:.1e} ({err_sdpa:.1e}) |", flush=True)

if __name__ == "__main__":
    main()
