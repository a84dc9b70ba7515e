"""Quantize sequences -> one pass that reads x once and writes int8 once.

Outputs must equal eager PyTorch bit for bit (round half to even, clamp, then the cast), so these
patterns carry an exact tolerance.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fusion_backend import guards as G
from fusion_backend.registry import EXACT, Pattern, rand


def quant_i8_ref(x: Tensor, scale: float = 0.05, zp: float = 3.0, qmin: int = -128,
                 qmax: int = 127) -> Tensor:
    return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)


PATTERNS = [
    Pattern(
        "quantize.quant_i8",  # static per-tensor INT8 (the user's kernel-fusion project): 5 kernels -> 1
        reference=quant_i8_ref, op="quant_i8",
        inputs=lambda case, dt, dev: (rand(case, dt, dev, 4.0),),  # |x| up to ~16: exercises the clamp
        guards=(G.contiguous("x"), G.int8_range("qmin", "qmax")),
        variants=(lambda x, scale, zp, qmin, qmax: (x / scale + zp).round().clamp(qmin, qmax).to(torch.int8),
                  lambda x, scale, zp, qmin, qmax: torch.clamp(torch.round(x / scale + zp), qmin, qmax).char()),
        bad_layout=lambda dt, dev: (rand((16, 8), dt, dev, 4.0).t(),),
        tol=EXACT,
    ),
]
