"""Matmuls with a fused epilogue -> fusekit::matmul_epilogue (csrc/matmul_epilogue.cu): one tensor-core
GEMM applies scale, bias, activation and residual in registers before its single store, so the product
never round-trips through HBM (Inductor's default mode calls cuBLAS, then a separate pointwise kernel).

The rules are generated from small tables (epilogues x matmul forms: 3-D and 4-D batched, F.linear, and
x @ W + b with W [K, N]), longest epilogue first; other spellings (baddbmm, GPT-2's addmm Conv1D, HF's
gelu_new) are variants of the same rules. Each is traced from what Inductor itself hands its post-grad pass
(``trace="inductor"``), so the GPU graph's addmm -> mm + add unfusion, the views around a 3-D linear and
the fp32 upcast of the activation are matched as Inductor emits them.

Dtypes: fp16 and bf16; fp32 only where the graph allows TF32 on CUDA (tf32_allowed below; the kernel then
runs on TF32 tensor cores, as cuBLAS does). An fp16/bf16 result returned as ``.float()`` becomes the
kernel's own fp32 store (``out_dtype``): passes.absorb_output_casts takes the cast after a rule's match, and
a rule's fp32 form without its downcast (``output_casts``) takes the graph that Inductor's pointless_convert
pass leaves of ``gelu(...).float()``.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import Fixtures, Pattern, rand

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
    with fp32_matmul_precision("ieee"):
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


# ---- checks: what the kernel takes (can fire), and where it measured faster (should fire) -----------
def matmul_operands(a: str, b: str, bias: str | None = None, residual: str | None = None,
                    linear: bool = False) -> G.Guard:
    """What the TMA GEMM of fusekit::matmul_epilogue reads (csrc/matmul_epilogue.cu): a [L, M, K] /
    [.., M, K] with a unit last stride, b [L, K, N] / [K, N] ([.., N, K] when `linear`) with a unit
    stride in one of its last two dims (4-D and up: a and b share leading dims that merge into one L),
    K and N multiples of 8, every other stride and storage offset a
    multiple of 8 elements (16 bytes), a contiguous bias [N] and a residual shaped like the output with a
    unit last stride. Sizes and strides must be plain ints here (a symbolic one: no rewrite)."""
    def ints(*vals: Any) -> bool:
        return all(isinstance(v, int) for v in vals)

    def aligned(t: Tensor, skip: int) -> bool:  # strides except the unit one (index `skip`), and offset
        return all(st % 8 == 0 and st > 0 for i, st in enumerate(t.stride()) if i != skip % t.dim()
                   and t.shape[i] > 1) and t.storage_offset() % 8 == 0

    def merges(t: Tensor) -> bool:  # the dims before the last two are viewable as one (4-D and up)
        lead = [(n, st) for n, st in zip(t.shape[:-2], t.stride()[:-2]) if n != 1]
        return all(st == st2 * n2 for (_, st), (n2, st2) in zip(lead, lead[1:]))

    def check(s: G.Site) -> str | None:
        ta, tb = s.tensor(a), s.tensor(b)
        if not ints(*ta.shape, *tb.shape, *ta.stride(), *tb.stride(), ta.storage_offset(), tb.storage_offset()):
            return "symbolic sizes or strides"
        bt = tb.transpose(-1, -2) if linear else tb
        if bt.dim() >= 3:
            if ta.dim() != bt.dim() or tuple(ta.shape[:-2]) != tuple(bt.shape[:-2]):
                return (f"batched {a} {tuple(ta.shape)} and {b} {tuple(tb.shape)} are not [..., M, K] @ "
                        f"[..., K, N] with the same leading dims")
            if not (merges(ta) and merges(bt)):
                return (f"the leading dims of {a} (strides {ta.stride()}) or {b} (strides {tb.stride()}) are "
                        f"not viewable as one batch dim")
        elif bt.dim() != 2 or ta.dim() < 2:
            return f"{a} {tuple(ta.shape)} @ {b} {tuple(tb.shape)}: want 2-D or 3-D operands"
        k, n = bt.shape[-2], bt.shape[-1]
        if k % 8 or n % 8 or k == 0:
            return f"K={k} and N={n} must be positive multiples of 8 (16-byte rows for TMA)"
        if ta.stride(-1) != 1 or not aligned(ta, -1):
            return f"{a} needs a unit last stride and 16-byte strides; strides {ta.stride()}"
        if ta.dim() > 2 and bt.dim() == 2 and not ta.is_contiguous():
            return f"{a} {tuple(ta.shape)} with a 2-D weight must be contiguous (rows flattened into M)"
        unit = -1 if bt.stride(-1) == 1 else -2 if bt.stride(-2) == 1 else None
        if unit is None or not aligned(bt, unit):
            return f"{b} needs a unit stride in one of its last two dims and 16-byte strides; strides {tb.stride()}"
        out = (*ta.shape[:-1], n)
        if bias is not None:
            tbias = s.tensor(bias)
            if tuple(tbias.shape) != (n,) or tbias.stride(0) != 1 or tbias.storage_offset() % 8:
                return f"{bias} {tuple(tbias.shape)} must be a contiguous [{n}] vector"
        if residual is not None:
            r = s.tensor(residual)
            if not ints(*r.shape, *r.stride(), r.storage_offset()) or tuple(r.shape) != out:
                return f"{residual} {tuple(r.shape)} must be shaped like the output {out}"
            if r.stride(-1) != 1 or not aligned(r, -1) or (r.dim() > 2 and bt.dim() == 2 and not r.is_contiguous()):
                return f"{residual} needs a unit last stride and 16-byte strides; strides {r.stride()}"
        return None

    return G.Guard(f"matmul_operands({a}, {b}{', ' + bias if bias else ''}{', ' + residual if residual else ''})",
                 check)


def tf32_enabled() -> bool:
    """Whether fp32 CUDA matmuls may use TF32 (torch.set_float32_matmul_precision("high"), the legacy
    torch.backends.cuda.matmul.allow_tf32 = True, or fp32_precision = "tf32"). Dynamo guards this state:
    flipping it recompiles, so a compiled graph never keeps TF32 after it is turned off."""
    m = torch.backends.cuda.matmul
    prec = getattr(m, "fp32_precision", None)  # every setter updates it (torch >= 2.9)
    return prec == "tf32" if prec is not None else bool(m.allow_tf32)


@contextlib.contextmanager
def fp32_matmul_precision(prec: str) -> Iterator[None]:
    """torch.backends.cuda.matmul.fp32_precision set to `prec` ("tf32" or "ieee") inside the block."""
    m = torch.backends.cuda.matmul
    old, m.fp32_precision = m.fp32_precision, prec
    try:
        yield
    finally:
        m.fp32_precision = old


def tf32_allowed(a: str, b: str, linear: bool = False) -> G.Guard:
    """An fp32 matmul rule fires only where TF32 is allowed (on CUDA its kernel runs on TF32 tensor cores,
    which full-fp32 matmuls do not; on CPU, where the op is the fp32 reference, the rule keeps the same
    condition so that a graph fuses alike on both). On CUDA b must also be K-major (a linear weight [N, K],
    k.transpose(-1, -2)): TF32 wgmma reads K-major operands only, and the op's copy of an N-major b measured
    slower than Inductor (H200: 0.64x at 1024^3)."""
    def check(s: G.Site) -> str | None:
        t = s.tensor(a)
        if t.dtype != torch.float32:
            return None
        if not tf32_enabled():
            return ("float32 without TF32 (torch.backends.cuda.matmul.fp32_precision is not 'tf32'): the GEMM "
                    "would lose precision; the fp32 matmul stays with Inductor")
        tb = s.tensor(b)
        k_dim = -1 if linear else -2  # b's K dim: [.., N, K] weight, or [.., K, N]
        if t.device.type == "cuda" and tb.stride(k_dim) != 1 and tb.shape[k_dim] != 1:
            return f"float32 (TF32) needs a K-major {b} (unit stride along K); strides {tb.stride()}"
        return None

    return G.Guard(f"tf32_allowed({a}, {b})", check)


def matmul_heavy_epilogue_k(b: str, linear: bool = False, low: int = 128, high: int = 1024,
                            top: int = 4096) -> G.Guard:
    """Policy for GELU (erf and tanh)/SiLU epilogues (H200, benchmarks/bench_matmul.py): with
    low < K < high and N > 64 the epilogue's transcendental math neither hides under the GEMM (cooperative
    schedule) nor costs less than Inductor's separate pointwise kernel: 0.96-0.98x at K = 768 (erf), 0.99x
    for GPT-2 end to end (tanh: 1.08x alone, but no faster than cuBLAS's addmm + gelu_new in the model). From K = top
    on, the GEMM's main loop trails cuBLAS's by about what the fused epilogue saves: 8x4096^3 measured
    0.94-0.97x in one run, 1.02-1.04x in another. Short K (1.2-1.8x), N <= 64 (1.18-1.25x) and
    high <= K < top (ping-pong; 1.09-1.34x at K = 1024-2048) fire."""
    def check(s: G.Site) -> str | None:
        tb = s.tensor(b)
        k, n = (tb.shape[-1], tb.shape[-2]) if linear else (tb.shape[-2], tb.shape[-1])
        if not (isinstance(k, int) and isinstance(n, int)) or n <= 64:
            return None
        if low < k < high:
            where = f"in ({low}, {high})"
        elif k >= top:
            where = f">= {top}"
        else:
            return None
        return f"K={k} {where} with N={n} > 64: this epilogue measured slower than Inductor there"

    return G.Guard(f"matmul_heavy_epilogue_k({b})", check, policy=True)


# Heavy activations fire only inside a K window (at K = 768 they lost to cuBLAS + Inductor's epilogue), and
# linear + bias + residual is off by default (it takes the residual from Inductor's LayerNorm kernel; BERT
# 0.93x end to end). Measured with benchmarks/bench_matmul.py and `fusekit bench` (benchmarks/RESULTS.md).
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
        # the last case is compiled on CUDA by the GPU tests: aligned, so Inductor's pad_mm leaves it alone; the
        # linears' cases have more rows than a decode step's (at 64 rows or fewer the decode_gemm rules take them)
        cases = ((1, 5, 32, 40), (2, 8, 16, 24)) if rank == 3 else ((5, 32, 40), (16, 16, 24))
        if form == "linear":
            cases = ((1, 65, 32, 40), (2, 40, 16, 24)) if rank == 3 else ((65, 32, 40), (80, 16, 24))
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
        output_casts=(torch.float32,),
        expand_optional=form == "batched" and rank == 3,  # a direct torch.bmm
        inputs=make, trace="inductor", trace_case=trace_case,
        variants=_variants(arg_names, scale, act, form, rank),
        guards=(G.same_dtype(*names), tf32_allowed("a", "b", form == "linear"),
                matmul_operands("a", "b", "bias" if bias else None, "residual" if residual else None,
                                  form == "linear"),
                *([matmul_heavy_epilogue_k("b", form == "linear")] if act in HEAVY_ACTS else [])),
        fixtures=Fixtures(cases=cases, gpu_cases=gpu_cases, baseline=tf32_baseline,
                          bad_layout=_bad_layout(make, trace_case), bad_reason="multiples of 8"),
    )


# 4-D: only the rules with an activation. Without one, a 4-D matmul * scale (+ bias) is typically attention
# scores that feed a softmax (when the attention rule did not fire), and Inductor folds the scale and
# bias into the softmax kernel: fusing them into the GEMM would save no pass.
PATTERNS = [_rule(*r, form="batched", rank=3) for r in BATCHED] + \
           [_rule(*r, form="batched", rank=4) for r in BATCHED if r[3] != "none"] + \
           [_rule(*r, form="linear", rank=rank) for rank in (3, 2) for r in LINEAR] + \
           [_rule(*r, form="mm", rank=rank) for rank in (3, 2) for r in MM]
