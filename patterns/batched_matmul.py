"""Batched matmul with a fused epilogue: bmm -> * scale -> + bias -> GELU in one kernel, so the
activation never round-trips through HBM (Inductor calls cuBLAS, then a separate pointwise kernel).

The CUDA kernel lands with the batched-matmul issue; until then this rule fires only on CPU with
options={"cpu_reference": True}.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import Pattern, rand


def bmm_scale_bias_gelu_ref(a: Tensor, b: Tensor, scale: float = 0.125, bias: Tensor = None,
                            approximate: str = "none") -> Tensor:
    return F.gelu(torch.bmm(a, b) * scale + bias, approximate=approximate)


def _abias(case, dt, dev):
    bsz, m, k, n = case
    return rand((bsz, m, k), dt, dev), rand((bsz, k, n), dt, dev), rand((n,), dt, dev)


PATTERNS = [
    Pattern(
        "batched_matmul.bmm_scale_bias_gelu",  # gelu(bmm(a, b) * s + bias): attention-MLP style epilogue
        reference=bmm_scale_bias_gelu_ref, op="bmm_scale_bias_gelu", static={"approximate": "none"},
        inputs=_abias, trace_case=(2, 4, 8, 16), cases=((2, 16, 32, 24), (1, 5, 8, 7)),
        guards=(G.ndim("a", 3), G.ndim("b", 3), G.same_dtype("a", "b", "bias"),
                G.last_dim_vector("bias", "b"), G.contiguous("a", "b", "bias")),
        variants=(lambda a, b, scale, bias: F.gelu(bias + scale * torch.matmul(a, b)),),
        bad_layout=lambda dt, dev: (rand((2, 16, 32), dt, dev), rand((2, 24, 32), dt, dev).transpose(1, 2),
                                    rand((24,), dt, dev)),
    ),
]
