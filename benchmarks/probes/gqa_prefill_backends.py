"""Which of PyTorch's SDPA kernels take grouped KV heads (enable_gqa) together with a mask, and what a prompt's
attention against a static cache costs with and without the repeat_kv copy (issue #23, part 2).

python benchmarks/probes/gqa_prefill_backends.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def main():
    dt, d, hq, hkv = torch.bfloat16, 128, 16, 4
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, 16 query heads, 4 KV heads, D 128; us")
    for b, lq, slots, pos in ((1, 512, 4096, 0), (4, 512, 4096, 0), (1, 512, 512, 0), (1, 2048, 4096, 0), (8, 128, 4096, 1024)):
        torch.manual_seed(0)
        q = torch.randn(b, hq, lq, d, device="cuda", dtype=dt)
        k = torch.randn(b, hkv, slots, d, device="cuda", dtype=dt)
        v = torch.randn(b, hkv, slots, d, device="cuda", dtype=dt)
        keep = torch.arange(slots, device="cuda")[None, :] <= (pos + torch.arange(lq, device="cuda"))[:, None]
        mask = torch.zeros(b, 1, lq, slots, device="cuda", dtype=dt).masked_fill(~keep, torch.finfo(dt).min)
        ref = F.scaled_dot_product_attention(q.double(), repeat_kv(k, 4).double(), repeat_kv(v, 4).double(),
                                             attn_mask=mask.double())
        row = [f"b{b} L{lq} S{slots} @{pos}"]

        def chain():
            return F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask)

        out = chain()
        row.append(f"repeat+sdpa {do_bench(chain, warmup=10, rep=50) * 1e3:.1f} (err {(out.double() - ref).abs().max():.1e})")
        comp = torch.compile(chain)
        comp()
        row.append(f"inductor {do_bench(comp, warmup=10, rep=50) * 1e3:.1f}")
        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
            try:
                with sdpa_kernel([be]):
                    f = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
                    out = f()
                    t = do_bench(f, warmup=10, rep=50) * 1e3
                row.append(f"gqa {be.name} {t:.1f} (err {(out.double() - ref).abs().max():.1e})")
            except Exception as e:  # noqa: BLE001
                row.append(f"gqa {be.name}: {type(e).__name__} {str(e).splitlines()[0][:60]}")
        if pos == 0:  # a fresh prompt: the mask is causal over the first lq slots
            try:
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    f = lambda: F.scaled_dot_product_attention(q, k[:, :, :lq], v[:, :, :lq], is_causal=True, enable_gqa=True)  # noqa: E731
                    out = f()
                    t = do_bench(f, warmup=10, rep=50) * 1e3
                row.append(f"flash causal over [:L] {t:.1f} (err {(out.double() - ref).abs().max():.1e})")
            except Exception as e:  # noqa: BLE001
                row.append(f"flash causal: {type(e).__name__} {str(e).splitlines()[0][:60]}")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
