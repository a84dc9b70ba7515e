"""Elementwise chains -> one pass over memory.

Each chain that eager runs as several kernels (one HBM round trip per op) becomes one fused op. Inductor
already fuses plain chains itself, so on CUDA these fire only where fusekit's kernel is at least as fast
(see benchmarks/); on CPU they run their reference with options={"cpu_reference": True}.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import Fixtures, Pattern, rand


# Below ~1M elements Inductor's kernels measured as fast or faster (H200).
MIN_NUMEL = 990_000


def add_mul_exp_ref(x: Tensor, y: Tensor, c: float = 2.0) -> Tensor:
    return torch.exp((x + y) * c)


def mul_add_ref(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return q * k + v


def gelu_ref(x: Tensor, approximate: str = "none") -> Tensor:
    return F.gelu(x, approximate=approximate)


def bias_gelu_ref(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    return F.gelu(x + bias, approximate=approximate)


def silu_mul_ref(g: Tensor, u: Tensor) -> Tensor:
    return F.silu(g) * u


def gelu_mul_ref(g: Tensor, u: Tensor, approximate: str = "none") -> Tensor:
    return F.gelu(g, approximate=approximate) * u


def bias_relu_ref(x: Tensor, bias: Tensor) -> Tensor:
    return F.relu(x + bias)


def scale_residual_add_ref(x: Tensor, residual: Tensor, scale: float = 0.5) -> Tensor:
    return residual + x * scale


def _like(n: int, scale: float = 1.0):
    return lambda case, dt, dev: tuple(rand(case, dt, dev, scale) for _ in range(n))


def _x_and_bias(case, dt, dev):
    return rand(case, dt, dev), rand(case[-1:], dt, dev)


def _transposed(n: int):
    """Inputs that fail the contiguity guard: the first tensor is a transposed view."""
    def make(dt, dev):
        first = rand((16, 8), dt, dev).t()
        return (first, *(rand((8, 16), dt, dev) for _ in range(n - 1)))
    return make


# Longer chains first: a rule must not take the nodes of a longer one that contains it (gelu_mul before
# gelu, scale_residual_add before mul_add).
PATTERNS = [
    Pattern(
        "elementwise.gelu_mul_erf",  # gelu(g) * u: GeGLU MLPs (T5 v1.1, Gemma use the tanh form)
        cuda_default=(torch.float16, torch.bfloat16),  # measured: faster than Inductor at 20M and 50M (H200; benchmarks/RESULTS.md)
        cuda_min_numel=MIN_NUMEL,
        reference=gelu_mul_ref, op="gelu_mul", static={"approximate": "none"}, inputs=_like(2),
        guards=(G.same_shape("g", "u"), G.same_dtype("g", "u"), G.contiguous("g", "u")),
        variants=(lambda g, u: u * F.gelu(g),),
        fixtures=Fixtures(bad_layout=_transposed(2)),
    ),
    Pattern(
        "elementwise.gelu_mul_tanh",  # gelu_tanh(g) * u: GeGLU, tanh form
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=gelu_mul_ref, op="gelu_mul", static={"approximate": "tanh"}, inputs=_like(2),
        guards=(G.same_shape("g", "u"), G.same_dtype("g", "u"), G.contiguous("g", "u")),
        variants=(lambda g, u: u * F.gelu(g, approximate="tanh"),),
        fixtures=Fixtures(bad_layout=_transposed(2)),
    ),
    Pattern(
        "elementwise.silu_mul",  # silu(g) * u: SwiGLU in Llama-style MLPs
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=silu_mul_ref, op="silu_mul", inputs=_like(2),
        guards=(G.same_shape("g", "u"), G.same_dtype("g", "u"), G.contiguous("g", "u")),
        variants=(lambda g, u: u * F.silu(g), lambda g, u: g * torch.sigmoid(g) * u),
        fixtures=Fixtures(bad_layout=_transposed(2)),
    ),
    Pattern(
        "elementwise.bias_gelu_erf",  # gelu(x + b): the MLP up-projection epilogue (BERT; CUDA mm + add)
        cuda_default=(torch.float16, torch.bfloat16),  # measured: faster than Inductor at 20M and 50M (H200; benchmarks/RESULTS.md)
        cuda_min_numel=MIN_NUMEL,
        reference=bias_gelu_ref, op="bias_gelu", static={"approximate": "none"}, inputs=_x_and_bias,
        guards=(G.last_dim_vector("bias", "x"), G.same_dtype("x", "bias"), G.contiguous("x", "bias")),
        variants=(lambda x, b: F.gelu(b + x),),
        fixtures=Fixtures(bad_layout=lambda dt, dev: (rand((16, 8), dt, dev).t(), rand((16,), dt, dev))),
    ),
    Pattern(
        "elementwise.bias_gelu_tanh",  # gelu_tanh(x + b): GPT-2's MLP epilogue on CUDA (mm + add)
        cuda_default=(torch.float16, torch.bfloat16),  # measured: faster than Inductor at 20M and 50M (H200; benchmarks/RESULTS.md)
        cuda_min_numel=MIN_NUMEL,
        reference=bias_gelu_ref, op="bias_gelu", static={"approximate": "tanh"}, inputs=_x_and_bias,
        guards=(G.last_dim_vector("bias", "x"), G.same_dtype("x", "bias"), G.contiguous("x", "bias")),
        variants=(lambda x, b: F.gelu(b + x, approximate="tanh"),),
        fixtures=Fixtures(bad_layout=lambda dt, dev: (rand((16, 8), dt, dev).t(), rand((16,), dt, dev))),
    ),
    Pattern(
        "elementwise.bias_relu",  # relu(x + b): an MLP epilogue (CUDA mm + add)
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=bias_relu_ref, op="bias_relu", inputs=_x_and_bias,
        guards=(G.last_dim_vector("bias", "x"), G.same_dtype("x", "bias"), G.contiguous("x", "bias")),
        variants=(lambda x, b: torch.relu(b + x), lambda x, b: (x + b).clamp_min(0)),
        fixtures=Fixtures(bad_layout=lambda dt, dev: (rand((16, 8), dt, dev).t(), rand((16,), dt, dev))),
    ),
    Pattern(
        "elementwise.gelu_erf",  # gelu(x), erf form: BERT's MLP after addmm (bias already in the GEMM)
        cuda_default=(torch.float16, torch.bfloat16),  # measured: faster than Inductor at 20M and 50M (H200; benchmarks/RESULTS.md)
        cuda_min_numel=MIN_NUMEL,
        reference=gelu_ref, op="gelu", static={"approximate": "none"}, inputs=_like(1),
        guards=(G.contiguous("x"),),
        fixtures=Fixtures(bad_layout=_transposed(1)),
    ),
    Pattern(
        "elementwise.gelu_tanh",  # gelu(x, approximate="tanh"): GPT-2's gelu_new after addmm
        cuda_default=(torch.float16, torch.bfloat16),  # measured: faster than Inductor at 20M and 50M (H200; benchmarks/RESULTS.md)
        cuda_min_numel=MIN_NUMEL,
        reference=gelu_ref, op="gelu", static={"approximate": "tanh"}, inputs=_like(1),
        guards=(G.contiguous("x"),),
        variants=(lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))),),
        fixtures=Fixtures(bad_layout=_transposed(1)),
    ),
    Pattern(
        "elementwise.scale_residual_add",  # residual + x * s: scaled residual branches (DeepNet, ReZero)
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=scale_residual_add_ref, op="scale_residual_add", inputs=_like(2),
        guards=(G.same_shape("x", "residual"), G.same_dtype("x", "residual"),
                G.contiguous("x", "residual")),
        variants=(lambda x, r, s: x * s + r, lambda x, r, s: torch.add(r, x.mul(s))),
        fixtures=Fixtures(bad_layout=_transposed(2)),
    ),
    Pattern(
        "elementwise.add_mul_exp",  # exp((x + y) * c): 3 kernels -> 1 (the user's kernel-fusion project)
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=add_mul_exp_ref, op="add_mul_exp", inputs=_like(2, 0.5),
        guards=(G.same_shape("x", "y"), G.same_dtype("x", "y"), G.contiguous("x", "y")),
        variants=(lambda x, y, c: (y + x).mul(c).exp(),
                  lambda x, y, c: torch.exp(c * torch.add(x, y))),
        fixtures=Fixtures(bad_layout=_transposed(2)),
    ),
    Pattern(
        "elementwise.mul_add",  # q * k + v: 2 kernels -> 1 (the user's C++-extension project)
        cuda_default=False,  # measured: at parity with Inductor (H200; benchmarks/RESULTS.md); opt-in
        reference=mul_add_ref, op="mul_add", inputs=_like(3),
        guards=(G.same_shape("q", "k", "v"), G.same_dtype("q", "k", "v"), G.contiguous("q", "k", "v")),
        variants=(lambda q, k, v: v + k * q, lambda q, k, v: torch.add(v, torch.mul(q, k)),
                  lambda q, k, v: q.mul(k).add(v)),
        fixtures=Fixtures(bad_layout=_transposed(3)),
    ),
]
