"""Quantize sequences -> one pass that reads x once and writes int8 once.

Outputs must equal eager PyTorch bit for bit (round half to even, clamp, then the cast), so these
patterns carry an exact tolerance.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import EXACT, Fixtures, Pattern, rand


FP8 = torch.float8_e4m3fn


def dyn_quant_i8_ref(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    xf = x.float()
    s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 127.0
    return torch.clamp(torch.round(xf / s), -128, 127).to(torch.int8), s


def dyn_quant_fp8_ref(x: Tensor, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    xf = x.float()
    s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 448.0
    return (xf / s).clamp(-448.0, 448.0).to(FP8), s


def silu_mul_fp8_rows_ref(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """SwiGLU's product as torchao's float8 dynamic per-row config quantizes it for the down projection: the row's
    max |h| / 448 in h's dtype, then float32 (decode_gemm's x quantization, spelled again: a family imports no other)."""
    h = F.silu(gate) * up
    s = (h.abs().amax(h.dim() - 1, keepdim=True) / 448.0).float()
    return (h.float() / s).clamp(-448.0, 448.0).to(FP8), s


def quant_fp8_ref(x: Tensor, scale: float = 0.05) -> Tensor:
    return (x / scale).clamp(-448.0, 448.0).to(FP8)


def quant_i8_channel_ref(x: Tensor, scale: Tensor, zp: Tensor, qmin: int = -128, qmax: int = 127) -> Tensor:
    return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)


def dequant_i8_ref(q: Tensor, scale: float = 0.05, zp: float = 3.0,
                   dtype: torch.dtype = torch.float16) -> Tensor:
    return ((q.to(torch.float32) - zp) * scale).to(dtype)


def quant_i8_ref(x: Tensor, scale: float = 0.05, zp: float = 3.0, qmin: int = -128,
                 qmax: int = 127) -> Tensor:
    return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)


def _rowwise_spellings(qmax: float, quantize):
    """Hand-written per-row dynamic quantization without an epsilon (x's absmax by amax or max().values, over
    127 or 127.0): the op with eps=0, as clamp(min=0) of an absmax (>= 0 or NaN) is the absmax itself. An
    all-zero row gives s = 0 and x / s = NaN both ways: int8 0 from the op, and eager's NaN -> int8 cast is
    undefined in C++ (0 on x86 CPUs); NaN for fp8 both ways. x stays in float32 (x.float() first), where the op
    computes; a 16-bit absmax / qmax is another scale and another rule's business."""
    def amax(x):
        xf = x.float()
        s = xf.abs().amax(-1, keepdim=True) / qmax
        return quantize(xf / s), s

    def max_values(x):
        xf = x.float()
        s = xf.abs().max(dim=-1, keepdim=True).values / qmax
        return quantize(xf / s), s
    return amax, max_values


def _channel(per_row: bool, zp: bool = True):
    def make(case, dt, dev):
        m, n = case
        shape = (m, 1) if per_row else (n,)
        scale = torch.rand(shape, device=dev) * 0.2 + 0.01
        x = rand(case, dt, dev, 4.0)
        return (x, scale, torch.randn(shape, device=dev).round()) if zp else (x, scale)
    return make


def _no_zp(x, scale, qmin, qmax):  # round(x / scale) without a zero point: the op with zp = 0
    return torch.clamp(torch.round(x / scale), qmin, qmax).to(torch.int8)


def _zeros_like_scale(a):  # the op's zero point where the rule has none (+ 0 changes no int8)
    return torch.zeros_like(a["scale"], memory_format=torch.contiguous_format)


def _int8(case, dt, dev):
    return (torch.randint(-128, 128, tuple(case), device=dev, dtype=torch.int8),)


# Sizes below which Inductor's kernels measured faster (H200, CUDA graphs):
# per-channel and fp32 dynamic below ~1M elements, per-row and 16-bit dynamic below ~5M (too few rows to fill the GPU).
MIN_NUMEL_CHANNEL = 990_000
MIN_NUMEL_PER_ROW = 4_990_000
MIN_NUMEL_DYN = {torch.float16: 4_990_000, torch.bfloat16: 4_990_000, torch.float32: 990_000}


_ROWS = ((4, 64), (3, 5, 33), (2, 4096))
def _channel_guards(per_row: bool, zp: bool = True):
    params = ("scale", "zp") if zp else ("scale",)
    return (G.channel_params("x", *params, per_row=per_row), G.float32(*params),
            G.contiguous("x", *params), G.int8_range("qmin", "qmax"))


def _dyn(pid: str, ref, op: str, **kw) -> Pattern:
    return Pattern(
        pid, cuda_default=True, cuda_min_numel=MIN_NUMEL_DYN, reference=ref, op=op, literals=("eps",),
        inputs=lambda case, dt, dev: (rand(case, dt, dev, 3.0),),
        guards=(G.contiguous("x"),), tol=EXACT,
        fixtures=Fixtures(cases=_ROWS, bad_layout=lambda dt, dev: (rand((16, 8), dt, dev).t(),)), **kw)


def _per_channel(pid: str, per_row: bool, zp: bool = True, cuda_default=(torch.float16, torch.bfloat16),
                 **kw) -> Pattern:
    shape = (8, 1) if per_row else (16,)  # bad_layout's x: [16, 8].t()
    return Pattern(
        pid,
        # measured (with zp): fp16/bf16 0.77-0.84x (per column), 0.85-0.94x (per row) Inductor's time at 20M/50M
        # (H200, 3-round medians); fp32 at parity (benchmarks/RESULTS.md), so opt-in there
        cuda_default=cuda_default,
        cuda_min_numel=MIN_NUMEL_PER_ROW if per_row else MIN_NUMEL_CHANNEL,
        reference=quant_i8_channel_ref, op="quant_i8_channel", inputs=_channel(per_row, zp),
        trace_case=(2, 8), guards=_channel_guards(per_row, zp), tol=EXACT,
        fixtures=Fixtures(cases=((4, 32), (33, 64)), bad_layout=lambda dt, dev: (
            rand((16, 8), dt, dev, 4.0).t(), torch.rand(shape, device=dev) + 0.1,
            *((torch.zeros(shape, device=dev),) if zp else ()))), **kw)


def _per_tensor(pid: str, **kw) -> Pattern:
    return Pattern(
        pid, cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=quant_i8_ref, op="quant_i8",
        inputs=lambda case, dt, dev: (rand(case, dt, dev, 4.0),),  # |x| up to ~16: exercises the clamp
        guards=(G.contiguous("x"), G.int8_range("qmin", "qmax")),
        tol=EXACT, fixtures=Fixtures(bad_layout=lambda dt, dev: (rand((16, 8), dt, dev, 4.0).t(),)), **kw)


def _vector_rows(*names: str) -> G.Guard:
    """Can fire: rows a multiple of 8 wide, starting on 16 bytes (the op reads 8 values at a time)."""
    def check(s: G.Site) -> str | None:
        for n in names:
            t = s.tensor(n)
            if t.shape[-1] % 8 or t.storage_offset() % 8:
                return f"{n} {tuple(t.shape)}: rows not a multiple of 8 wide or not on 16 bytes"
        return None

    return G.Guard(f"vector_rows({', '.join(names)})", check)


def _silu_mul_fp8_rows(rank: int) -> Pattern:
    """The down projection's input quantization fused into SwiGLU's product at prefill sizes (the decode GEMM rules
    take the product and the quantization inside their own launches up to 64 rows, and come first). Inductor reads
    gate and up twice (a looped reduction: the max, then the quotients); the op once. `rank`: [B, S, N] (a
    decoder's batch of prompts) or [T, N] (tokens); the max's dim is spelled by number."""
    return Pattern(
        f"quantize.silu_mul_fp8_rows{'' if rank == 3 else '_2d'}", reference=silu_mul_fp8_rows_ref,
        op="silu_mul_fp8_rows", dtypes=(torch.float16, torch.bfloat16), trace="inductor",
        trace_case=(2, 40, 24) if rank == 3 else (80, 24),
        inputs=lambda case, dt, dev: (rand(case, dt, dev, 2.0), rand(case, dt, dev)),
        guards=(G.contiguous("gate", "up"), _vector_rows("gate", "up")),
        # not yet measured against Inductor's reduction on a GPU: opt-in, and only at prefill sizes
        cuda_default=False, cuda_min_numel=1 << 20, tol=EXACT,
        fixtures=Fixtures(
            cases=((3, 40, 64), (1, 300, 24)) if rank == 3 else ((120, 64), (300, 24)),
            # the bench models' widths, one row, rows of 8, a row wider than the op keeps in registers
            gpu_cases=((4, 512, 5632), (2, 1, 8960), (3, 1000, 8), (1, 5, 33000)) if rank == 3 else
            ((2048, 5632), (1, 8960), (1000, 8), (5, 33000)),
            bad_layout=lambda dt, dev: ((rand((64, 16), dt, dev).t(), rand((16, 64), dt, dev)) if rank == 2 else
                                        (rand((2, 64, 16), dt, dev).transpose(1, 2), rand((2, 16, 64), dt, dev))),
            bad_reason="contiguous",
            # where the rule does not fire, Inductor's CPU code may round a quotient to the next e4m3 (one step:
            # 2^-3 relative, 2^-9 among the subnormals)
            inductor_tol={dt: (2.0 ** -9, 0.125) for dt in (torch.float16, torch.bfloat16)}),
    )


PATTERNS = [
    *[_silu_mul_fp8_rows(rank) for rank in (3, 2)],  # a producer and its quantization: before the quantizations alone
    # Without an epsilon (before the rules with one, which would take its clamp(min=0.0) form too)
    _dyn("quantize.dyn_quant_i8_no_eps", dyn_quant_i8_ref, "dyn_quant_i8", static={"eps": 0.0},  # hand-written W8A8
         variants=_rowwise_spellings(127, lambda t: torch.clamp(torch.round(t), -128, 127).to(torch.int8))),
    _dyn("quantize.dyn_quant_fp8_no_eps", dyn_quant_fp8_ref, "dyn_quant_fp8", static={"eps": 0.0},
         variants=_rowwise_spellings(448.0, lambda t: t.clamp(-448.0, 448.0).to(FP8))),
    # per-token absmax -> scale -> int8 (SmoothQuant/W8A8 activations): one pass
    # measured: 0.51-0.82x Inductor's time at 20M/50M, every dtype (H200; benchmarks/RESULTS.md)
    _dyn("quantize.dyn_quant_i8", dyn_quant_i8_ref, "dyn_quant_i8"),
    # per-token absmax -> scale -> float8_e4m3fn (FP8 activations): one pass
    # measured: 0.55-0.85x Inductor's time at 20M/50M, every dtype (H200; benchmarks/RESULTS.md)
    _dyn("quantize.dyn_quant_fp8", dyn_quant_fp8_ref, "dyn_quant_fp8"),
    Pattern(
        "quantize.quant_fp8",  # static per-tensor FP8 e4m3, saturating: 3 kernels -> 1
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=quant_fp8_ref, op="quant_fp8",
        inputs=lambda case, dt, dev: (rand(case, dt, dev, 30.0),),  # |x / scale| beyond 448: saturates
        guards=(G.contiguous("x"),), tol=EXACT,
        variants=(lambda x, scale: torch.clamp(x / scale, -448.0, 448.0).to(FP8),),
        fixtures=Fixtures(bad_layout=lambda dt, dev: (rand((16, 8), dt, dev).t(),)),
    ),
    _per_channel("quantize.quant_i8_per_col", per_row=False),  # per-channel INT8, one scale/zp per column (weights)
    _per_channel("quantize.quant_i8_per_row", per_row=True),   # per-channel INT8, one scale/zp per row
    # the same without a zero point (symmetric weights, per-token scales): zp = 0
    # not measured: the op's zeros are one more (tiny) kernel launch; opt-in on CUDA until benchmarked
    *[_per_channel(f"quantize.quant_i8_per_{axis}_no_zp", per_row=axis == "row", zp=False, static={"zp": 0.0},
                   op_static={"zp": _zeros_like_scale}, variants=(_no_zp,), cuda_default=False)
      for axis in ("col", "row")],
    *[Pattern(
        f"quantize.dequant_i8_{str(out)[6:]}",  # (q.float() - zp) * scale [-> half]: int8 -> float in one pass
        reference=dequant_i8_ref, op="dequant_i8", static={"dtype": out}, inputs=_int8,
        dtypes=(torch.int8,), guards=(G.contiguous("q"),), tol=EXACT,
        cuda_default=False,  # measured: at parity with Inductor, every output dtype (H200; benchmarks/RESULTS.md); opt-in
        fixtures=Fixtures(bad_layout=lambda dt, dev: (
            torch.randint(-128, 128, (16, 8), device=dev, dtype=torch.int8).t(),)),
    ) for out in (torch.float16, torch.bfloat16, torch.float32)],  # the bare float32 form is a prefix: last
    # static per-tensor INT8 without a zero point: zp = 0 (before quant_i8, which would take its reference's `+ 0.0`)
    _per_tensor("quantize.quant_i8_no_zp", static={"zp": 0.0}, variants=(_no_zp,)),
    _per_tensor("quantize.quant_i8", variants=(  # static per-tensor INT8 (the user's kernel-fusion project): 5 kernels -> 1
        lambda x, scale, zp, qmin, qmax: (x / scale + zp).round().clamp(qmin, qmax).to(torch.int8),
        lambda x, scale, zp, qmin, qmax: torch.clamp(torch.round(x / scale + zp), qmin, qmax).char())),
]
