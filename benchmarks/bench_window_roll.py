"""fusekit::window_roll alone: a full sliding window's decode-step update (the window one slot to the left, the new
row last) against the same update as transformers writes it (roll, index_put of the last slot, copy_ back) compiled
by Inductor, on the KV shapes of sliding-window decoders. Median us of triton.testing.do_bench (L2 flushed), and the
share of the copy bandwidth (one read and one write of the window: the least any in-place update moves). Inductor's
time includes its host work (guards, three launches): at the small sizes the comparison is host-bound; a decode step
under CUDA graphs is the real figure (`fusekit bench --tp 1 --ablate cache.window_roll`). --sweep also times each
column piece the kernel could take (FUSEKIT_WINDOW_ROLL_PIECE). Needs a CUDA GPU; prints a markdown table.

    python benchmarks/bench_window_roll.py [--sweep]
"""
import argparse

import torch

# name: (KV heads, window, head dim), batches
SHAPES = {
    "Mistral-style bench model": ((4, 1024, 128), (1, 8, 32, 64)),
    "Mistral-7B": ((8, 4096, 128), (1, 32)),
    "Gemma-3-1B": ((1, 512, 256), (1, 32)),
    "Gemma-2-2B": ((4, 4096, 256), (1, 8)),
}


def transformers_update(cache: torch.Tensor, k: torch.Tensor) -> None:
    """StaticSlidingWindowLayer.update once its window is full (transformers 5.x), for one of K or V."""
    new = cache.roll(-1, dims=-2)
    new[:, :, torch.tensor([-1], device=cache.device)] = k
    cache.copy_(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="also time every column piece (16-byte chunks per CTA)")
    args = ap.parse_args()
    from triton.testing import do_bench  # here, so that --help works where triton is absent

    from fusion_backend import _ext
    from fusion_backend.tools.cuda_graphs import environment
    from fusion_backend.tools.decode_bench import copy_bandwidth

    print(_ext.load_for_device())
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    bw = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s")
    inductor = torch.compile(transformers_update)
    roll = torch.ops.fusekit.window_roll
    print("| shape | batch | window MB | Inductor us | fusekit us | speed-up | fusekit % copy | Inductor % copy |"
          + (" pieces (chunks: us) |" if args.sweep else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.sweep else ""))
    for name, ((h, w, d), batches) in SHAPES.items():
        for b in batches:
            cache = torch.randn(b, h, w, d, device=dev, dtype=dt)
            k = torch.randn(b, 1, h, d, device=dev, dtype=dt).transpose(1, 2)
            want = torch.cat([cache[:, :, 1:], k], 2)
            got = cache.clone()
            roll(got, k)
            assert torch.equal(got, want)
            ti = do_bench(lambda: inductor(cache, k), warmup=25, rep=200, return_mode="median")
            tf = do_bench(lambda: roll(cache, k), warmup=25, rep=200, return_mode="median")
            floor_us = 2 * cache.numel() * cache.element_size() / bw * 1e6
            sweep = ""
            if args.sweep:
                chunks = d * cache.element_size() // 16
                for c in (c for c in range(1, chunks + 1) if chunks % c == 0):
                    with environment({"FUSEKIT_WINDOW_ROLL_PIECE": str(c)}):  # read at each launch
                        sweep += f" {c}: {do_bench(lambda: roll(cache, k), warmup=25, rep=200, return_mode='median') * 1e3:.1f}"
                sweep += " |"
            print(f"| {name} ({h} x {w} x {d}) | {b} | {cache.numel() * 2 / 1e6:.1f} | {ti * 1e3:.1f} | "
                  f"{tf * 1e3:.1f} | {ti / tf:.2f}x | {100 * floor_us / (tf * 1e3):.0f}% | "
                  f"{100 * floor_us / (ti * 1e3):.0f}% |{sweep}", flush=True)


if __name__ == "__main__":
    main()
