"""Attention chains -> one fused attention op (PyTorch's flash / cuDNN / memory-efficient kernels).

When Inductor does not pick a fused SDPA kernel it decomposes SDPA into the math backend: fp32 upcast,
q and k each scaled by sqrt(scale), two bmms on FFMA cores, the mask added, a softmax that zeroes fully
masked rows (``_safe_softmax``), a cast back. The ``sdpa_math`` rules are traced from that decomposition
itself (``trace="inductor"``), so they match what Inductor emits; the ``softmax_chain`` rules match the
same computation written out in a model (matmul, scale, mask, softmax, matmul), whose fully masked rows
are NaN. (Without a mask, Inductor's own fuse_attention pass already turns the written-out chain into
SDPA, so ``sdpa_math_no_mask`` covers it.) Both become ``fusekit::attention``; on CPU its kernel is the reference below.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from fusion_backend import guards as G
from fusion_backend.registry import Fixtures, Pattern, rand

HALF = (torch.float16, torch.bfloat16)


def attention_ref(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float = 0.125,
                  safe: bool = True) -> Tensor:
    if safe:  # SDPA on its math backend: the decomposition Inductor emits
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    return torch.matmul(torch.softmax(s, dim=-1), v)


def attention_eager(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float = 0.125,
                    safe: bool = True) -> Tensor:
    """The same-dtype eager baseline whose float64 error bounds the kernel's: scores and probabilities
    rounded to q's dtype, as an unfused fp16/bf16 attention computes them."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + (torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, float("-inf"))
                 if mask.dtype == torch.bool else mask)
    p = torch.softmax(s.float(), dim=-1)
    if safe:
        p = p.nan_to_num(0.0)
    return torch.matmul(p.to(q.dtype), v)


# ---- checks (can fire) ------------------------------------------------------------------------------
def attention_inputs(q: str, k: str, v: str, mask: str | None = None) -> G.Guard:
    """q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,D] with D % 8 == 0 and D <= 256 and unit last-dim stride
    (what PyTorch's fused SDPA kernels take); a mask is bool or q's dtype and broadcasts to
    [B,H,Sq,Sk]. Sizes must be provably equal (symbolic sizes too)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    def check(s: G.Site) -> str | None:
        tq, tk, tv = s.tensor(q), s.tensor(k), s.tensor(v)
        if (bad := G.qkv_problem((q, k, v), tq, tk, tv)) is not None:
            return bad
        same = [(tq.shape[0], tk.shape[0]), (tq.shape[0], tv.shape[0]), (tq.shape[1], tk.shape[1]),
                (tq.shape[1], tv.shape[1]), (tk.shape[2], tv.shape[2]), (tq.shape[3], tk.shape[3]),
                (tq.shape[3], tv.shape[3])]
        if not all(known(a == b) for a, b in same):
            return (f"shapes do not line up as [B,H,Sq,D], [B,H,Sk,D], [B,H,Sk,D]: {tuple(tq.shape)}, "
                    f"{tuple(tk.shape)}, {tuple(tv.shape)}")
        if not (known(tq.shape[2] > 0) and known(tk.shape[2] > 0)):
            return "empty query or key sequence"
        d = tq.shape[3]
        if not (known(d % 8 == 0) and known(d <= 256) and known(d > 0)):
            return f"head dim {d} is not a multiple of 8 in [8, 256]"
        if (bad := G.unit_last_stride_problem(tq, tk, tv)) is not None:
            return bad
        if mask is not None:
            full = (tq.shape[0], tq.shape[1], tq.shape[2], tk.shape[2])
            return G.mask_problem(mask, s.tensor(mask), (torch.bool, tq.dtype), full, "[B,H,Sq,Sk]")
        return None

    return G.Guard(f"attention_inputs({q}, {k}, {v}{', ' + mask if mask else ''})", check)


# case = (B, H, Sq, Sk, D, mask: "key" [B,1,1,Sk] | "full" [B,1,Sq,Sk], layout: "bhsd" | "bshd")
def _qkv(case, dt, dev):
    b, h, sq, sk, d, _, layout = case
    if layout == "bshd":  # heads split from [B, S, H*D] and transposed, as in HF models
        return tuple(rand((b, s, h, d), dt, dev).transpose(1, 2) for s in (sq, sk, sk))
    return rand((b, h, sq, d), dt, dev), rand((b, h, sk, d), dt, dev), rand((b, h, sk, d), dt, dev)


def _keep(case, dev):
    """A padding-style mask with one fully masked query row (and, for key masks, a fully masked batch)."""
    b, _, sq, sk, _, kind, _ = case
    keep = torch.rand((b, 1, 1 if kind == "key" else sq, sk), device=dev) > 0.2
    keep[..., 0] = True
    keep[0, 0, -1, :] = False  # fully masked: SDPA's math gives 0 there, a plain softmax NaN
    return keep


def _float_mask(case, dt, dev):
    keep = _keep(case, dev)
    return (*_qkv(case, dt, dev), torch.zeros(keep.shape, dtype=dt, device=dev).masked_fill(~keep, float("-inf")))


def _bool_mask(case, dt, dev):
    return (*_qkv(case, dt, dev), _keep(case, dev))


def _bad_stride(dt, dev):  # q with a non-unit last-dim stride: no fused kernel takes it
    q, k, v, m = _float_mask(CASES[0], dt, dev)
    return (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, m)


CASES = ((2, 3, 5, 6, 8, "full", "bhsd"), (2, 2, 7, 7, 16, "key", "bshd"), (1, 2, 9, 3, 8, "full", "bshd"))
GPU_CASES = ((16, 12, 256, 256, 64, "key", "bshd"), (2, 4, 197, 197, 64, "full", "bshd"),
             (1, 1, 1, 1, 8, "full", "bhsd"), (2, 3, 127, 33, 128, "key", "bhsd"),
             (1, 2, 65, 300, 256, "full", "bshd"))
TRACE = (2, 3, 5, 6, 8, "full", "bhsd")
COMMON = dict(reference=attention_ref, op="attention", dtypes=HALF, trace="inductor", trace_case=TRACE,
              literals=("scale",))


def _fixtures(bad_layout) -> Fixtures:
    return Fixtures(cases=CASES, gpu_cases=GPU_CASES, baseline=attention_eager, bad_layout=bad_layout,
                    bad_reason="last-dim stride")

# The bool-mask rule contains the float-mask one (plus the mask conversion): it goes first.
PATTERNS = [
    Pattern(
        "attention.sdpa_math_bool_mask",  # SDPA + boolean mask (True = attend), decomposed by Inductor
        static={"safe": True}, inputs=_bool_mask,
        guards=(attention_inputs("q", "k", "v", "mask"),), **COMMON,
        fixtures=_fixtures(lambda dt, dev: (*_bad_stride(dt, dev)[:3], _bool_mask(CASES[0], dt, dev)[3])),
    ),
    Pattern(
        "attention.sdpa_math",  # SDPA + additive mask decomposed by Inductor (BERT-style encoders)
        static={"safe": True}, inputs=_float_mask,
        guards=(attention_inputs("q", "k", "v", "mask"),), **COMMON,
        fixtures=_fixtures(_bad_stride),
    ),
    Pattern(
        "attention.sdpa_math_no_mask",  # SDPA without a mask (ViT-style), decomposed by Inductor
        static={"safe": True, "mask": None}, inputs=lambda c, dt, dev: _qkv(c, dt, dev),
        guards=(attention_inputs("q", "k", "v"),), **COMMON,
        fixtures=_fixtures(lambda dt, dev: _bad_stride(dt, dev)[:3]),
    ),
    Pattern(
        "attention.softmax_chain",  # softmax(q @ k^T * s + mask) @ v written out (eager attention)
        static={"safe": False}, inputs=_float_mask,
        guards=(attention_inputs("q", "k", "v", "mask"),), **COMMON,
        fixtures=_fixtures(_bad_stride),
    ),
]
