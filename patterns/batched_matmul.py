"""Matmuls with a fused epilogue -> fusekit::matmul_epilogue (csrc/matmul_epilogue.cu): one tensor-core
GEMM applies scale, bias, activation and residual in registers before its single store, so the product
never round-trips through HBM (Inductor's default mode calls cuBLAS, then a separate pointwise kernel).

The rules are generated from small tables (epilogues x matmul forms: 3-D and 4-D batched, F.linear, and
x @ W + b with W [K, N]), longest epilogue first; other spellings (baddbmm, GPT-2's addmm Conv1D, HF's
gelu_new) are variants of the same rules. Each is traced from what Inductor itself hands its post-grad pass
(``trace="inductor"``), so the GPU graph's addmm -> mm + add unfusion, the views around a 3-D linear and
the fp32 upcast of the activation are matched as Inductor emits them.

Dtypes: fp16 and bf16; fp32 only where the graph allows TF32 on CUDA (guards.tf32_allowed; the kernel then
runs on TF32 tensor cores, as cuBLAS does). An fp16/bf16 result returned as ``.float()`` becomes the
kernel's own fp32 store (``out_dtype``): passes.absorb_output_casts takes the cast after a rule's match, and
a rule's fp32 form without its downcast (``output_casts``) takes the graph that Inductor's pointless_convert
pass leaves of ``gelu(...).float()``.
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
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def matmul_epilogue_ref(a: Tensor, b: Tensor, bias: Tensor = None, residual: Tensor = None,
                        scale: float = 0.125, act: str = "none", linear: bool = False,
                        out_dtype: torch.dtype = None) -> Tensor:
    """ACT[act](matmul(a, b) * scale + bias) + residual, each term only when given; linear: F.linear(a, b,
    bias) with b a weight [N, K] (no scale); out_dtype: the output cast (None: none), stored from the fp32
    accumulator: the epilogue then runs in out_dtype, with no rounding to a's dtype in between."""
    if out_dtype is not None and out_dtype != a.dtype:
        a, b, bias, residual = (None if t is None else t.to(out_dtype) for t in (a, b, bias, residual))
    if linear:
        y = F.linear(a, b, bias)
    else:
        y = torch.matmul(a, b)  # bmm for 3-D operands (Inductor drops matmul's no-op expand/views)
        if scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
    y = ACTS[act](y)
    y = y if residual is None else y + residual
    return y if out_dtype is None else y.to(out_dtype)


def tf32(t: Tensor) -> Tensor:
    """fp32 `t` with the low 13 mantissa bits cleared: the TF32 value a Hopper tensor core multiplies when it
    reads an fp32 operand (wgmma takes the top 19 bits)."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32) if t.dtype == torch.float32 else t


def tf32_baseline(**kw) -> Tensor:
    """The error bound of the GPU tests: eager in the same dtype. For fp32, whose rules fire only where TF32
    is allowed, that is a TF32 GEMM: the reference on TF32 operands with fp32 accumulation. (cuBLAS under
    allow_tf32 computes that at the benchmark's shapes, but picks full-fp32 kernels at some small ones,
    e.g. [1, 8, 8], whose error then is not TF32's.)"""
    if kw["a"].dtype != torch.float32:
        return matmul_epilogue_ref(**kw)
    with G.fp32_matmul_precision("ieee"):
        return matmul_epilogue_ref(**{**kw, "a": tf32(kw["a"]), "b": tf32(kw["b"])})


def _inputs(has_bias: bool, has_residual: bool, form: str):
    """Cases by form. "batched": (L, M, K, N[, "bT"]) or (B, H, M, K, N[, "bT"]), b [.., K, N] ("bT": a
    k.transpose(-1, -2) view); "linear": (M, K, N) / (B, S, K, N) with a weight [N, K]; "mm": the same
    with b [K, N] (GPT-2's Conv1D)."""
    def make(case, dt, dev):
        if form == "batched":
            *lead, m, k, n = [c for c in case if isinstance(c, int)]
            a = rand((*lead, m, k), dt, dev)
            b = (rand((*lead, n, k), dt, dev, scale=k ** -0.5).transpose(-1, -2) if "bT" in case
                 else rand((*lead, k, n), dt, dev, scale=k ** -0.5))
            out = (*lead, m, n)
        else:
            *lead, k, n = case
            a = rand((*lead, k), dt, dev)
            b = rand((n, k) if form == "linear" else (k, n), dt, dev, scale=k ** -0.5)
            out = (*lead, n)
        extra = ([rand((out[-1],), dt, dev)] if has_bias else []) + ([rand(out, dt, dev)] if has_residual else [])
        return (a, b, *extra)

    return make


def _bad_layout(make, case):
    """N = 20, not a multiple of 8: the TMA GEMM needs 16-byte rows, so the rule must stay off."""
    return lambda dt, dev: make((*case[:-1], 20), dt, dev)


def gelu_new(y: Tensor) -> Tensor:
    """GELU's tanh form as HF's NewGELUActivation (GPT-2's gelu_new) spells it out."""
    return 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y ** 3)))


def _baddbmm(a: Tensor, b: Tensor, bias: Tensor, scale: float = None) -> Tensor:
    return torch.baddbmm(bias, a, b) if scale is None else torch.baddbmm(bias, a, b, alpha=scale)


def _addmm_3d(a: Tensor, b: Tensor, bias: Tensor) -> Tensor:
    """GPT-2's Conv1D: addmm on the flattened rows of a, viewed back."""
    y = torch.addmm(bias, a.view(-1, a.size(-1)), b)
    return y.view(a.size()[:-1] + y.size()[-1:])


def _addmm_2d(a: Tensor, b: Tensor, bias: Tensor) -> Tensor:
    return torch.addmm(bias, a, b)


# (name, has scale, has bias, act, has residual), longest epilogue first within each form
BATCHED = [(f"bmm_scale_bias_{act}", True, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
          [(f"bmm_bias_{act}", False, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
          [("bmm_scale_bias", True, True, "none", False), ("bmm_scale", True, False, "none", False)]
LINEAR = [(f"linear_bias_{act}", False, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")] + \
         [("linear_bias_residual", False, True, "none", True)]
MM = [(f"mm_bias_{act}", False, True, act, False) for act in ("gelu", "gelu_tanh", "relu", "silu")]


def _variants(names: list[str], scale: bool, act: str, form: str, rank: int) -> tuple:
    """Other spellings of a rule, called with its arguments in order: HF's gelu_new for the tanh form;
    baddbmm(bias, a, b, alpha=scale) for a 3-D batched rule with bias and activation (without an
    activation cuBLAS's baddbmm already is one kernel); addmm(bias, a, b) for the mm rules (Conv1D)."""
    acts = [ACTS[act]] + ([gelu_new] if act == "gelu_tanh" else [])
    pre: list = []
    if form == "batched" and rank == 3 and act != "none" and scale:  # (an alpha-less baddbmm binds scale=1)
        pre.append(_baddbmm)
    if form == "mm":
        pre.append(_addmm_3d if rank == 3 else _addmm_2d)
    out = []
    for f in acts:
        for g in pre:
            out.append(lambda *t, f=f, g=g: f(g(**dict(zip(names, t)))))
        if f is not ACTS[act]:
            out.append(lambda *t, f=f: f(matmul_epilogue_ref(**dict(zip(names, t)), **_pre_static(form, scale))))
    return tuple(out)


def _pre_static(form: str, scale: bool) -> dict:
    """matmul_epilogue_ref's static arguments for the product before the activation."""
    return {"act": "none", "linear": form == "linear", **({} if scale else {"scale": None})}


# Heavy activations fire only inside a K window (at K = 768 they lost to cuBLAS + Inductor's epilogue), and
# linear + bias + residual is off by default (it takes the residual from Inductor's LayerNorm kernel; BERT
# 0.93x end to end). Measurements: benchmarks/results/h200_matmul.md and benchmarks/NOTES.md.
HEAVY_ACTS = ("gelu", "gelu_tanh", "silu")
CUDA_DEFAULT = {"linear_bias_residual": False, "linear_bias_residual_2d": False}


def _rule(name: str, scale: bool, bias: bool, act: str, residual: bool, form: str, rank: int) -> Pattern:
    static = {"act": act, "linear": form == "linear", "out_dtype": None}  # out_dtype: set by the cast pass
    if not scale:
        static["scale"] = None
    if not bias:
        static["bias"] = None
    if not residual:
        static["residual"] = None
    names = ["a", "b"] + (["bias"] if bias else []) + (["residual"] if residual else [])
    if form != "batched":
        trace_case = (2, 8, 16, 24) if rank == 3 else (16, 16, 24)
        # the last case is compiled on CUDA by the GPU tests: aligned, so Inductor's pad_mm leaves it alone
        cases = ((1, 5, 32, 40), (2, 8, 16, 24)) if rank == 3 else ((5, 32, 40), (16, 16, 24))
        gpu_cases = ((4, 512, 768, 3072), (2, 129, 72, 200), (1, 1, 8, 8)) if rank == 3 else \
            ((2048, 2048, 5632), (129, 72, 200), (1, 8, 8))
    elif rank == 3:
        trace_case = (2, 8, 16, 24)
        cases = ((1, 5, 32, 16, "bT"), (2, 8, 16, 24))
        gpu_cases = ((96, 512, 64, 512), (96, 512, 512, 64, "bT"), (3, 129, 72, 200, "bT"), (1, 1, 8, 8),
                     (2, 300, 512, 64), (4, 1000, 256, 136, "bT"))
    else:  # matmul of [B, H, M, K] @ [B, H, K, N]: attention-style scores with a bias and activation
        trace_case = (2, 3, 8, 16, 24)
        cases = ((1, 2, 5, 32, 16, "bT"), (2, 3, 8, 16, 24))
        gpu_cases = ((8, 12, 512, 64, 512, "bT"), (2, 3, 129, 72, 200), (1, 1, 1, 8, 8), (4, 2, 1000, 256, 136, "bT"))
    suffix = {2: "_2d", 3: "", 4: "_4d"}[rank]
    short, make = name + suffix, _inputs(bias, residual, form)
    arg_names = [n for n in ("a", "b", "bias", "residual", "scale") if n not in static]
    return Pattern(
        f"batched_matmul.{short}", cuda_default=CUDA_DEFAULT.get(short, True),
        reference=matmul_epilogue_ref, op="matmul_epilogue", static=static, dtypes=DTYPES,
        baseline=tf32_baseline, output_casts=(torch.float32,),
        expand_optional=form == "batched" and rank == 3,  # a direct torch.bmm
        inputs=make, trace="inductor", trace_case=trace_case, cases=cases,
        gpu_cases=gpu_cases, variants=_variants(arg_names, scale, act, form, rank),
        guards=(G.same_dtype(*names), G.tf32_allowed("a", "b", form == "linear"),
                G.matmul_operands("a", "b", "bias" if bias else None, "residual" if residual else None,
                                  form == "linear"),
                *([G.matmul_heavy_epilogue_k("b", form == "linear")] if act in HEAVY_ACTS else [])),
        bad_layout=_bad_layout(make, trace_case), bad_reason="multiples of 8",
    )


# 4-D: only the rules with an activation. Without one, a 4-D matmul * scale (+ bias) is typically attention
# scores that feed a softmax (when the attention rule did not fire), and Inductor folds the scale and
# bias into the softmax kernel: fusing them into the GEMM would save no pass.
PATTERNS = [_rule(*r, form="batched", rank=3) for r in BATCHED] + \
           [_rule(*r, form="batched", rank=4) for r in BATCHED if r[3] != "none"] + \
           [_rule(*r, form="linear", rank=rank) for rank in (3, 2) for r in LINEAR] + \
           [_rule(*r, form="mm", rank=rank) for rank in (3, 2) for r in MM]
