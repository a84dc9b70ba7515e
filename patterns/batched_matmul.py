"""Matmuls with a fused epilogue -> fusekit::matmul_epilogue (csrc/matmul_epilogue.cu): one tensor-core
GEMM applies scale, bias, activation and residual in registers before its single store, so the product
never round-trips through HBM (Inductor's default mode calls cuBLAS, then a separate pointwise kernel).

The rules are generated from two small tables (epilogues x matmul forms), longest epilogue first. Each is
traced from what Inductor itself hands its post-grad pass (``trace="inductor"``), so the GPU graph's
addmm -> mm + add unfusion, the views around a 3-D linear and the fp32 upcast of the activation are
matched as Inductor emits them. fp16/bf16 only: fp32 matmuls stay with Inductor and cuBLAS.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import Pattern, rand

ACTS = {
    "none": lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
HALF = (torch.float16, torch.bfloat16)


def matmul_epilogue_ref(a: Tensor, b: Tensor, bias: Tensor = None, residual: Tensor = None,
                        scale: float = 0.125, act: str = "none", linear: bool = False) -> Tensor:
    """ACT[act](matmul(a, b) * scale + bias) + residual, each term only when given; linear: F.linear(a, b,
    bias) with b a weight [N, K] (no scale)."""
    if linear:
        y = F.linear(a, b, bias)
    else:
        y = torch.matmul(a, b)  # bmm for 3-D operands (Inductor drops matmul's no-op expand/views)
        if scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
    y = ACTS[act](y)
    return y if residual is None else y + residual


def _inputs(has_bias: bool, has_residual: bool, linear: bool):
    """case (L, M, K, N[, "bT"]) for batched rules, (M, K, N) / (B, S, K, N) for linear ones."""
    def make(case, dt, dev):
        if linear:
            *lead, k, n = case
            a, b = rand((*lead, k), dt, dev), rand((n, k), dt, dev, scale=k ** -0.5)
            out = (*lead, n)
        else:
            (l, m, k, n), bt = case[:4], "bT" in case[4:]
            a = rand((l, m, k), dt, dev)
            b = (rand((l, n, k), dt, dev, scale=k ** -0.5).transpose(1, 2) if bt  # k.transpose(-1, -2)
                 else rand((l, k, n), dt, dev, scale=k ** -0.5))
            out = (l, m, n)
        extra = ([rand((out[-1],), dt, dev)] if has_bias else []) + ([rand(out, dt, dev)] if has_residual else [])
        return (a, b, *extra)

    return make


def _bad_layout(make, case):
    """N = 20, not a multiple of 8: the TMA GEMM needs 16-byte rows, so the rule must stay off."""
    return lambda dt, dev: make((*case[:-1], 20), dt, dev)


# (name, has scale, has bias, act, has residual), longest epilogue first within each form
BATCHED = [(f"bmm_scale_bias_{act}", True, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
          [(f"bmm_bias_{act}", False, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
          [("bmm_scale_bias", True, True, "none", False), ("bmm_scale", True, False, "none", False)]
LINEAR = [(f"linear_bias_{act}", False, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
         [("linear_bias_residual", False, True, "none", True)]


# Measured selection (benchmarks/results/h200_matmul.md): GELU(erf) and SiLU epilogues measured 0.96-0.98x
# at K = 768, so their rules carry a K-window guard (guards.matmul_heavy_epilogue_k). Linear + bias +
# residual measured 1.28-1.33x alone, but in BERT it takes the residual add away from Inductor's
# bias + residual + LayerNorm kernel (no traffic saved) at N = 768, where this GEMM is slower than cuBLAS:
# BERT fp16 0.93x end to end, so it is off by default. Everything else measured 1.01x or faster.
HEAVY_ACTS = ("gelu", "silu")
CUDA_DEFAULT = {"linear_bias_residual": False, "linear_bias_residual_2d": False}


def _rule(name: str, scale: bool, bias: bool, act: str, residual: bool, linear: bool, rank: int) -> Pattern:
    static = {"act": act, "linear": linear}
    if not scale:
        static["scale"] = None
    if not bias:
        static["bias"] = None
    if not residual:
        static["residual"] = None
    names = ["a", "b"] + (["bias"] if bias else []) + (["residual"] if residual else [])
    if linear:
        trace_case = (2, 8, 16, 24) if rank == 3 else (16, 16, 24)
        # the last case is compiled on CUDA by the GPU tests: aligned, so Inductor's pad_mm leaves it alone
        cases = ((1, 5, 32, 40), (2, 8, 16, 24)) if rank == 3 else ((5, 32, 40), (16, 16, 24))
        gpu_cases = ((4, 512, 768, 3072), (2, 129, 72, 200), (1, 1, 8, 8)) if rank == 3 else \
            ((2048, 2048, 5632), (129, 72, 200), (1, 8, 8))
    else:
        trace_case = (2, 8, 16, 24)
        cases = ((1, 5, 32, 16, "bT"), (2, 8, 16, 24))
        gpu_cases = ((96, 512, 64, 512), (96, 512, 512, 64, "bT"), (3, 129, 72, 200, "bT"), (1, 1, 8, 8),
                     (2, 300, 512, 64), (4, 1000, 256, 136, "bT"))
    short, make = name + ("" if rank == 3 else "_2d"), _inputs(bias, residual, linear)
    return Pattern(
        f"batched_matmul.{short}", cuda_default=CUDA_DEFAULT.get(short, True),
        reference=matmul_epilogue_ref, op="matmul_epilogue", static=static, dtypes=HALF,
        inputs=make, trace="inductor", trace_case=trace_case, cases=cases,
        gpu_cases=gpu_cases,
        guards=(G.same_dtype(*names), G.matmul_operands("a", "b", "bias" if bias else None,
                                                        "residual" if residual else None, linear),
                *([G.matmul_heavy_epilogue_k("b", linear)] if act in HEAVY_ACTS else [])),
        bad_layout=_bad_layout(make, trace_case), bad_reason="multiples of 8",
    )


PATTERNS = [_rule(*r, linear=False, rank=3) for r in BATCHED] + \
           [_rule(*r, linear=True, rank=rank) for rank in (3, 2) for r in LINEAR]
