"""fusekit::decode_attention's kernels one call each at a few shapes (bf16, D 128, the additive bf16 causal mask
transformers builds), for Nsight Compute: what bounds the main kernel and the combine at batch 1 and 32.

ncu --csv --page raw --metrics <list> -k regex:"decode_attention_kernel|combine_splits" --launch-skip 0 \
    python benchmarks/probes/decode_attention_ncu.py          (each shape: 2 warm-up calls, then 1 call)"""
import torch

from fusion_backend import _ext

SHAPES = [("b32 @128", 32, 16, 4, 4096, 128), ("b32 @1024", 32, 16, 4, 4096, 1024),
          ("b32 @4000", 32, 16, 4, 4096, 4000), ("b1 @1024", 1, 16, 4, 4096, 1024),
          ("b32 1025 slots, no mask", 32, 16, 4, 1025, None)]

_ext.load_for_device()
for name, b, hq, hkv, slots, pos in SHAPES:
    dt = torch.bfloat16
    q = torch.randn(b, 1, hq, 128, device="cuda", dtype=dt).transpose(1, 2)
    k, v = (torch.randn(b, hkv, slots, 128, device="cuda", dtype=dt) for _ in range(2))
    mask = None  # pos None: every slot visible, no mask (no CTA only reads its mask)
    if pos is not None:
        keep = torch.arange(slots, device="cuda") <= pos
        mask = torch.zeros(b, 1, 1, slots, device="cuda", dtype=dt).masked_fill(~keep, torch.finfo(dt).min)
    for _ in range(3):
        torch.ops.fusekit.decode_attention(q, k, v, mask, 0.088)
    torch.cuda.synchronize()
    print(name, flush=True)
