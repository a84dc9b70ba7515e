"""How close [96,512,512,64] bmm * s + bias -> GELU can get to its memory floor (session 14): a Triton read of
the GEMM's 56 MB of inputs, the D2D copy of the bytes the fused kernel moves, cuBLAS's bare bmm, Inductor, and
Triton tl.dot kernels with the epilogue (BLOCK_M, BLOCK_K, stages, warps). Clean L2 flush, interleaved rounds
(bench_patterns.measure_rounds). Needs triton and a GPU, not fusekit's kernels:
    FUSEKIT_DISABLE_EXT=1 python benchmarks/probes/matmul_floor.py
Result: benchmarks/results/h200_matmul_floor.txt."""
import itertools
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_patterns import compiled, copy_bytes, measure_rounds  # noqa: E402
from fusion_backend import table  # noqa: E402


@triton.jit
def bmm_act(a_ptr, b_ptr, bias_ptr, d_ptr, K, sa_b, sa_m, sb_b, sb_k, sd_b, sd_m, scale,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + bid * sa_b + rm[:, None] * sa_m + rk[None, :]
    b = b_ptr + bid * sb_b + rk[:, None] * sb_k + rn[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BK
        b += BK * sb_k
    acc = acc * scale + tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    acc = 0.5 * acc * (1 + tl.erf(acc * 0.7071067811865476))  # GELU(erf)
    tl.store(d_ptr + bid * sd_b + rm[:, None] * sd_m + rn[None, :], acc.to(d_ptr.dtype.element_ty))


@triton.jit
def read_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(ITERS):
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


p = table.by_id("batched_matmul.bmm_scale_bias_gelu")
for dt in (torch.float16, torch.bfloat16):
    L, M, K, N = 96, 512, 512, 64
    args = p.make_args((L, M, K, N), dt, "cuda")
    a, b, bias, scale = args
    ref = p.eager(*args)
    want = p.eager(a.double(), b.double(), bias.double(), scale)
    d = torch.empty(L, M, N, device="cuda", dtype=dt)
    flat = torch.cat([a.view(-1), b.view(-1)])  # 56 MB: the GEMM's reads
    fns = {}
    for BM, BK, stages, warps in itertools.product((64, 128), (64, 128), (3, 4, 5), (4, 8)):
        if BM == 64 and warps == 8:
            continue
        def f(BM=BM, BK=BK, stages=stages, warps=warps):
            bmm_act[(M // BM, L)](a, b, bias, d, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                  d.stride(0), d.stride(1), scale, BM=BM, BN=N, BK=BK,
                                  num_stages=stages, num_warps=warps)
        try:
            f()
            torch.cuda.synchronize()
            err = (d.double() - want).abs().max().item()
            ref_err = (ref.double() - want).abs().max().item()
            if err > 2 * ref_err + 1e-3:
                print(f"skip {BM},{BK},{stages},{warps}: err {err:.2e} vs eager {ref_err:.2e}")
                continue
            fns[f"tri m{BM} k{BK} s{stages} w{warps}"] = f
        except Exception as e:
            print(f"fail {BM},{BK},{stages},{warps}: {str(e)[:80]}")
    outs = torch.empty(4096, device="cuda")
    for blk, it in ((4096, 4), (2048, 8)):
        nprog = triton.cdiv(flat.numel(), blk * it)
        fns[f"read56MB b{blk}x{it}"] = lambda blk=blk, it=it, nprog=nprog: read_sum[(nprog,)](flat, outs, flat.numel(), BLOCK=blk, ITERS=it)
    src = torch.empty(copy_bytes(a.numel() * 2 + b.numel() * 2 + ref.numel() * 2), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ind = compiled(p, "inductor"); ind(*args)
    fns.update({"copy": lambda: dst.copy_(src), "bmm": lambda: torch.bmm(a, b), "inductor": lambda: ind(*args)})
    meds = {k: statistics.median(v) for k, v in measure_rounds(fns, False, rounds=3, flush="clean", ungraphed=("copy",)).items()}
    print(f"== {dt}  [96,512,512,64]  clean flush, median of 3 interleaved rounds (us)")
    for k, v in sorted(meds.items(), key=lambda kv: kv[1]):
        print(f"  {k:28s} {v*1e3:6.1f}   ind/x {meds['inductor']/v:.3f}")
    torch._dynamo.reset()
