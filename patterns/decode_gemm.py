"""Decode GEMMs: the linears of a decode step, a few rows against a weight -> ``fusekit::decode_linear``.

In a decode step (M = batch x new tokens rows) every linear is one pass over its weight, and the step is
mostly that pass: Llama-style b32 at position 1024 spent 0.51 ms of 0.99 in cuBLAS for 0.28 ms of weight
bytes (H100). SwiGLU's gate and up projections are two such passes and an elementwise kernel; the op reads both
weights in one launch and writes silu(gate) * up (GeGLU: gelu_tanh(gate) * up; a fused gate_up projection split in
halves: the same, from the weight's two halves).

q, k and v are three linears of one input: ``fusekit::decode_qkv`` reads the three weights in one launch (with
Qwen2's biases: the ``qkv_bias`` rules, whose linears are addmm). Against cuBLAS's three calls (H100): Llama-style
2.27x / 2.18x / 1.93x / 1.21x at 1 / 8 / 16 / 32 rows, Qwen2-style 2.57x at 1 row to 1.37x at 64; at 33-64 rows
through the split-K kernel Llama-style 1.29-1.37x, Qwen2-style 1.41-1.47x. They fire up to 64 rows.

Measured selection. Where the TMA kernel runs (sm_90a builds: weight tiles streamed through a shared-memory ring
by TMA, wgmma, K split over a cluster): every rule, the plain linear included, up to 64 rows (H100, Llama-style,
op alone, cold weights: at 32 rows down 13.4 -> 11.5 us, lm_head 52.0 -> 50.0, gate/up with silu 25.6 -> ~21,
o 6.5 -> 6.7; at 1-8 rows o 6.3 -> 5.7-5.9). Elsewhere (benchmarks/bench_decode_gemm.py): gate/up up to 8 rows
(Llama-style 1.13x / 1.08x cuBLAS + Inductor's silu-mul at 1 / 8 rows, Qwen2-style 1.06x / 1.04x; 0.96-1.05x at
16 and 32); the plain linear only where options={"patterns": [...]} names it (cuBLAS was faster at every
projection, the op 0.43-0.98x), up to 32 rows. A one-weight linear with no activation fires only up to N = 4096
(narrow_weight: on an H200 wider ones, a fused q/k/v or an LM head, measured 0.86-0.96x cuBLAS at 8-64 rows).
With a bias and GELU the op beats cuBLAS + Inductor's GELU (H200, GPT-NeoX's 2048 -> 8192: 1.04x at 1 and 32 rows)
and matmul_epilogue's tiled GEMM by 2x (12.4 against 25.8 us).

int8 weight-only linears (torchao's Int8WeightOnlyConfig: ``F.linear(x, w.to(x.dtype)) * scales``) take
``fusekit::decode_linear_w8``, which widens the int8 weight in registers; Inductor's own kernel for them
(aten._weight_int8pack_mm) measured 16.6-100x slower at 1-64 rows (H200, benchmarks/RESULTS.md). torchao's float8
dynamic per-row linears (x quantized per row, aten._scaled_mm) take ``fusekit::decode_linear_fp8``, the
quantization included, up to 32 rows (an LM-head-wide one at one row): 1.19-2.02x Inductor's (H200); q/k/v of one x
take ``decode_qkv_fp8`` and gate/up with their product ``decode_gate_up_fp8`` (one launch each, x quantized once).
torchao's int8 dynamic-activation linears (x quantized per row, then aten._int_mm and a kernel for both scales) take
``fusekit::decode_linear_int8dyn`` whole, x's quantization included (q/k/v of one x ``decode_qkv_int8dyn``, gate/up
with their product ``decode_gate_up_int8dyn``; the fp8 ops' kernel with int8 products), up to 32 rows: exact int32
sums, torchao's two roundings, eager's output to the bit. Where those do not fire, the GEMM after Inductor's
quantization of x is ``fusekit::decode_linear_w8a8``. cuBLAS's aten._int_mm refuses 16 rows or fewer (Inductor's step
fails there); at 32 rows the w8a8 op measured 1.32-1.96x Inductor's GEMM and scales kernel, at 64 0.53-1.48x, and the
Llama-style int8 dynamic step with every linear whole 7.85x Inductor's at batch 32 (H200, benchmarks/RESULTS.md).
Past the decode rows (prefill: from 256 rows and 1M outputs) that GEMM is ``fusekit::linear_w8a8``
(``linear_w8a8_tiled``: CUTLASS's tiled s8 GEMM, both scales in its epilogue, sm_90a), where Inductor's aten._int_mm
writes int32 products and a second kernel reads them back: 1.22-2.54x Inductor's linear at 2048 rows (H100,
benchmarks/RESULTS.md).

transformers' RMSNorm before q/k/v or gate/up can go inside their launch (``fusekit::decode_rms_qkv``,
``decode_rms_linear``: each CTA adds up h^2 of the rows it reads and scales its sums) and the residual add after o
or down into decode_linear's epilogue (``linear_residual``): opt-in, measured no faster in a step (RMS_RESIDUAL_RULES).

Rules: the RMSNorm forms, bias + GELU, gate/up (longest first), q/k/v with biases, q/k/v, a linear's bias, the
residual, then the plain linear, each for a 3-D x (HF's [B, S, K], viewed to rows and back) and a 2-D one (the
RMSNorm and residual rules 3-D only). Matched after the batched_matmul family (a linear's bias with ReLU, SiLU or a
residual is that family's first), except bias + GELU, matched before it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true as known

from fusion_backend import guards as G
from fusion_backend.registry import EXACT, Fixtures, Pattern, rand

DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # fp32: CPU only (ops.OPS: the CUDA kernels take 16 bits)
# Rows (batch x new tokens) up to which a rule fires. Where the decode GEMMs' TMA kernel runs (sm_90a builds:
# csrc/decode_gemm/decode_linear_tma.cuh) every rule up to 64: measured faster than cuBLAS (+ Inductor's silu-mul)
# at 1-64 rows on the H100. Elsewhere gate/up measured faster than cuBLAS + Inductor up to 8, q/k/v than cuBLAS's
# three calls up to 64 (bench_decode_gemm.py), and the plain linear (then off by default) up to 32 where named.
MAX_ROWS = {"gate_up_silu": 8, "qkv": 64, "linear": 32, "linear_w8": 64, "linear_fp8": 32, "linear_w8a8": 32,
            "linear_int8dyn": 32, "linear_fp8_weight": 32}
# fp8: the TMA kernel beats Inductor's quantization + aten._scaled_mm at 64 rows too (H200, op alone, Llama-style:
# q 1.26x, gate 1.05x, down 1.57x); the mma.sync kernels at 64 were 0.55-1.13x.
# int8 x int8 (linear_w8a8, an mma.sync kernel on every build): 32 (H200, at 64 rows gate and down 0.53x / 0.93x)
MAX_ROWS_TMA = {"gate_up_silu": 64, "qkv": 64, "linear": 64, "linear_w8": 64, "linear_fp8": 64,
                "linear_w8a8": 32, "linear_int8dyn": 32, "linear_fp8_weight": 64}
# fp8 weight-only (linear_fp8_weight, the int8 weight-only kernels: the TMA kernel's W8 form at 9-64 rows on sm_90a and
# at 1-8 where K >= 4096, else mma.sync): 64 on the W8 form (H200, op alone, Llama-style, cold weights, 64 rows: o 6.8 /
# gate 10.0 / down 12.4 us against Inductor's 12.1 / 16.8 / 19.1, 2026-12-03); elsewhere 32: at 64 rows the mma.sync
# kernel ran at 0.35x cuBLAS on a 16-bit weight (int8, op alone: gate 2048x5632 27.2 us against 9.6)
MAX_PLAIN_N = 4096  # the widest weight a one-weight linear with no activation fires for (narrow_weight)
WIDE_ONE_ROW_K = 4096  # ... except at one row with at least this K (narrow_weight)


def decode_linear_ref(x: Tensor, w: Tensor, w2: Tensor | None = None, act: str = "none",
                      b: Tensor | None = None, r: Tensor | None = None) -> Tensor:
    y = _linear_act(x, w, w2, act, b)
    return y if r is None else y + r  # a residual add after the o or down projection


def _linear_act(x: Tensor, w: Tensor, w2: Tensor | None, act: str, b: Tensor | None) -> Tensor:
    y = F.linear(x, w, b)
    if act == "silu_mul_halves":  # one [2N, K] weight of gate rows then up rows (Phi-3's gate_up_proj)
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if act == "gelu_tanh_mul":  # GeGLU (Gemma)
        return F.gelu(y, approximate="tanh") * F.linear(x, w2)
    if act in ("gelu", "gelu_tanh"):  # an MLP's up projection with its bias (GPT-NeoX, Phi-2, GPT-J)
        return F.gelu(y, approximate="tanh" if act == "gelu_tanh" else "none")
    return y if act == "none" else F.silu(y) * F.linear(x, w2)


def rms_norm_ref(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' RMSNorm (Llama, Mistral, Qwen2/3 and their copies; collective.all_reduce_add_rms_norm's too)."""
    h32 = h.to(torch.float32)
    return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def decode_rms_linear_ref(h: Tensor, norm_w: Tensor, w: Tensor, w2: Tensor | None = None, act: str = "none",
                          b: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """transformers' RMSNorm of h (Llama, Mistral, Qwen2/3), then decode_linear_ref's linear or gate/up of it."""
    return decode_linear_ref(rms_norm_ref(h, norm_w, eps), w, w2, act, b)


def decode_linear_w8_ref(x: Tensor, w: Tensor, scales: Tensor) -> Tensor:
    """An int8 weight-only linear as torchao's Int8WeightOnlyConfig computes it (w int8 [N, K], scales [N])."""
    return F.linear(x, w.to(x.dtype)) * scales


def decode_linear_fp8_weight_ref(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """A float8 weight-only linear as torchao's Float8WeightOnlyConfig computes it (w float8_e4m3fn [N, K], w_scale
    float32 [N, 1]): the transposed weight dequantized to x's dtype, then a 16-bit matmul."""
    return x @ (w.t().float() * w_scale.t()).to(x.dtype)


def _weight_int8pack_mm(x: Tensor, w: Tensor, scales: Tensor) -> Tensor:
    """The same linear as Inductor's woq_int8 lowering leaves it for bfloat16 (fusion_backend/lowered.py)."""
    return torch.ops.aten._weight_int8pack_mm(x, w, scales)


def _weight_int8pack_mm_3d(x: Tensor, w: Tensor, scales: Tensor) -> Tensor:
    """The same linear of an x with more than two dimensions as Inductor's woq_int8 lowering leaves it for bfloat16:
    its rows through aten._weight_int8pack_mm, between two reshapes (x [B, S, K], as the 3-D rule's)."""
    return torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[2]), w, scales).reshape(x.shape[0], x.shape[1], -1)


def _w8_mm_as_mul_sum(x: Tensor, w: Tensor, scales: Tensor) -> Tensor:
    """The same linear at one row under Inductor's coordinate_descent_tuning (torchao's quantize_ turns it on): its mm
    decomposition writes x [1, K] @ w.T as (x[:, :, None] * w.T[None]).sum(1) in float32, the weight's int8 -> 16-bit
    -> float32 casts folded into one (as an H200's post-grad graph of torch 2.11 shows it)."""
    return (x.float().unsqueeze(2) * w.t().float().unsqueeze(0)).sum(1).to(x.dtype) * scales


def _fp8_weight_mm_as_mul_sum(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """decode_linear_fp8_weight_ref at one row under Inductor's coordinate_descent_tuning (torchao's quantize_ turns it
    on): Inductor's mm decomposition (torch/_inductor/decomposition.py, `mm`: CUDA only, x of one row) writes
    x [1, K] @ W as (x[:, :, None] * W[None]).sum(1) in float32. W keeps its rounding to x's dtype (torch 2.13 and
    later: joint_graph's pointless_convert keeps a narrower intermediate)."""
    wd = (w.t().float() * w_scale.t()).to(x.dtype)
    return (x.float().unsqueeze(2) * wd.float().unsqueeze(0)).sum(1).to(x.dtype)


def _fp8_weight_mm_as_mul_sum_folded(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """The same where pointless_convert folds the dequantized weight's float32 -> x's dtype -> float32 casts into
    none (torch 2.11's, as it folds the gate's downcast before SiLU's upcast in the int8 dynamic graphs)."""
    return (x.float().unsqueeze(2) * (w.t().float() * w_scale.t()).unsqueeze(0)).sum(1).to(x.dtype)


def decode_linear_w8a8_ref(xq: Tensor, xs: Tensor, w: Tensor, ws: Tensor,
                           dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype = None) -> Tensor:
    """An int8 x int8 linear after x's per-row quantization, as torchao 0.18's Int8DynamicActivationInt8WeightConfig
    leaves it in a CUDA graph (Int8Tensor's linear: int_scaled_matmul, then the weight's scales): xq int8 [..., K]
    and its float32 row scales xs [..., 1], w int8 [N, K] and its float32 scales ws [N, 1]. The int32 products
    times xs, rounded to `dtype`; times ws, rounded again (torchao's two casts). out_dtype float32: the last
    rounding skipped (the rule's fp32 form: where torch 2.11's pointless_convert folded that cast into a consumer's
    upcast, as SiLU's of SwiGLU's gate)."""
    rows = xq.reshape(-1, xq.shape[-1])
    y = (torch._int_mm(rows, w.t()) * xs.reshape(-1, 1).expand(rows.shape[0], w.shape[0])).to(dtype)
    return (y * ws.flatten()).reshape(xq.shape[:-1] + w.shape[:1]).to(out_dtype or dtype)


def _w8a8_int_mm_cpu(dtype: torch.dtype):
    """The same linear as torchao spells it on a CPU (_int_scaled_matmul_cpu's s8s8 form, taken where AVX512-VNNI
    without AMX does not pick its u8s8 one): the int32 products cast to float32 first, xs not expanded; equal values,
    float32(int32) * xs either way."""
    def w8a8_int_mm_cpu(xq: Tensor, xs: Tensor, w: Tensor, ws: Tensor) -> Tensor:
        rows = xq.reshape(-1, xq.shape[-1])
        y = (torch._int_mm(rows, w.t()).to(xs.dtype) * xs.reshape(-1, 1)).to(dtype)
        return (y * ws.flatten()).reshape(xq.shape[:-1] + w.shape[:1]).to(dtype)

    return w8a8_int_mm_cpu


INT8_DIV = 127.5  # torchao's symmetric int8 scale: max |x| / ((127 - -128) / 2)
INT8_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps: torchao's floor of the scale


def _int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """torchao 0.18's dynamic per-row symmetric int8 quantization of x, as its graph spells it (choose_qparams_affine
    SYMMETRIC, then quantize_affine): max(-min(amin, 0), max(amax, 0)) / 127.5 in x's dtype, floored at eps in
    float32, back to x's dtype, as float32; x * (1 / s) in float32, rounded half to even, clamped, int8."""
    amin, amax = x.amin(x.dim() - 1, keepdim=True), x.amax(x.dim() - 1, keepdim=True)  # (the graph's dim)
    top = torch.maximum(-torch.minimum(amin, torch.zeros_like(amin)), torch.maximum(amax, torch.zeros_like(amax)))
    s = (top / INT8_DIV).float().clamp_min(INT8_EPS).to(x.dtype).float()
    return (x * (1.0 / s)).round().clamp(-128, 127).to(torch.int8), s


def decode_linear_int8dyn_ref(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """torchao's int8 dynamic per-row linear (Int8DynamicActivationInt8WeightConfig) whole: x quantized per row
    (_int8_rows), then decode_linear_w8a8_ref's int8 GEMM and torchao's two roundings (its CUDA spelling)."""
    xq, s = _int8_rows(x)
    return decode_linear_w8a8_ref(xq, s, w, w_scale, x.dtype)


def _int8dyn_cpu(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """The same with torchao's CPU spelling of the GEMM (_w8a8_int_mm_cpu)."""
    xq, s = _int8_rows(x)
    return _w8a8_int_mm_cpu(x.dtype)(xq, s, w, w_scale)


def decode_qkv_int8dyn_ref(x: Tensor, wq: Tensor, sq: Tensor, wk: Tensor, sk: Tensor, wv: Tensor,
                           sv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v as three int8 dynamic per-row linears of one x (each quantizes x alike: the op does it once)."""
    return tuple(decode_linear_int8dyn_ref(x, w, s) for w, s in ((wq, sq), (wk, sk), (wv, sv)))


def _int8dyn_qkv_cpu(x: Tensor, wq: Tensor, sq: Tensor, wk: Tensor, sk: Tensor, wv: Tensor,
                     sv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(_int8dyn_cpu(x, w, s) for w, s in ((wq, sq), (wk, sk), (wv, sv)))


def decode_gate_up_int8dyn_ref(x: Tensor, wg: Tensor, sg: Tensor, wu: Tensor, su: Tensor,
                               act: str = "silu_mul") -> Tensor:
    """SwiGLU's (act "silu_mul") or GeGLU's ("gelu_tanh_mul") gate and up as int8 dynamic per-row linears of x."""
    return _gated(act, decode_linear_int8dyn_ref(x, wg, sg), decode_linear_int8dyn_ref(x, wu, su))


def _int8dyn_gate_up_forms(act: str) -> tuple:
    """The gate/up rule's other spellings: torchao's CPU GEMM (a variant), and the graph torch 2.11 leaves on CUDA
    (a graph form), where pointless_convert folds the gate's last rounding into the activation's upcast: the gate's
    float32 product times its scales goes into act unrounded (the op rounds it, as eager)."""
    def cpu(x, wg, sg, wu, su):
        return _gated(act, _int8dyn_cpu(x, wg, sg), _int8dyn_cpu(x, wu, su))

    def folded(x, wg, sg, wu, su):
        xq, s = _int8_rows(x)
        gate = decode_linear_w8a8_ref(xq, s, wg, sg, x.dtype, torch.float32)
        g = F.silu(gate) if act == "silu_mul" else F.gelu(gate, approximate="tanh")
        return g.to(x.dtype) * decode_linear_w8a8_ref(xq, s, wu, su, x.dtype)

    tag = "" if act == "silu_mul" else "_" + act
    cpu.__name__, folded.__name__ = f"_int8dyn_gate_up_cpu{tag}", f"_int8dyn_gate_up_folded{tag}"
    return (cpu,), (folded,)


FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _fp8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """torchao's dynamic per-row float8 quantization of x (_choose_scale_float8, _quantize_affine_float8): the row's
    max |x| / 448 in x's dtype, then float32; x / scale in float32, clamped to +-448, cast to e4m3."""
    s = (x.abs().amax(x.dim() - 1, keepdim=True) / FP8_MAX).float()
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s


def decode_linear_fp8_ref(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """A float8 dynamic per-row linear (torchao's Float8DynamicActivationFloat8WeightConfig(PerRow)): x quantized per
    row, the e4m3 products summed in float32, times the row's and the weight row's scales (w e4m3 [N, K], w_scale
    float32 [N, 1]); the fp8 GEMM spelled in float32, as eager on a CPU (aten._scaled_mm is the CUDA graph's form)."""
    xq, s = _fp8_rows(x)
    return ((xq.float() @ w.float().t()) * s * w_scale.float().reshape(1, -1)).to(x.dtype)


def _scaled_mm_of(x: Tensor, w: Tensor, w_scale: Tensor, fast_accum: bool, unsqueeze: bool) -> Tensor:
    xq, s = _fp8_rows(x)
    s = s.unsqueeze(-1) if unsqueeze else s
    y = torch._scaled_mm(xq.reshape(-1, x.shape[-1]), w.t(), s.reshape(-1, 1), w_scale.t(), out_dtype=x.dtype,
                         use_fast_accum=fast_accum)
    return y.reshape(x.shape[:-1] + w.shape[:1])


def _fp8_scaled_mm(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """The same linear as torchao 0.18 writes it for aten._scaled_mm (Float8Tensor's _float8_addmm_impl: rows
    flattened, the scale reshaped to [M, 1], the weight and its scales transposed views; use_fast_accum, its
    default), as a decoder layer's linear of one row leaves it in the graph (the scale's unsqueeze folded away)."""
    return _scaled_mm_of(x, w, w_scale, True, False)


def _fp8_scaled_mm_unsqueezed(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """The same with the scale unsqueezed before its reshape, as a decoder layer's linear of several rows (or a lone
    nn.Linear) leaves it."""
    return _scaled_mm_of(x, w, w_scale, True, True)


def _fp8_scaled_mm_precise(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """Float8MMConfig(use_fast_accum=False): the CUDA kernel's float32 sums serve both."""
    return _scaled_mm_of(x, w, w_scale, False, False)


def _fp8_scaled_mm_precise_unsqueezed(x: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    return _scaled_mm_of(x, w, w_scale, False, True)


def decode_qkv_fp8_ref(x: Tensor, wq: Tensor, sq: Tensor, wk: Tensor, sk: Tensor, wv: Tensor,
                       sv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v as three float8 dynamic per-row linears of one x (each quantizes x alike: the op does it once)."""
    return decode_linear_fp8_ref(x, wq, sq), decode_linear_fp8_ref(x, wk, sk), decode_linear_fp8_ref(x, wv, sv)


def _gated(act: str, gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU's (act "silu_mul") or GeGLU's ("gelu_tanh_mul") product of the gate and up projections."""
    return (F.silu(gate) if act == "silu_mul" else F.gelu(gate, approximate="tanh")) * up


def decode_gate_up_fp8_ref(x: Tensor, wg: Tensor, sg: Tensor, wu: Tensor, su: Tensor, act: str = "silu_mul") -> Tensor:
    """SwiGLU's (act "silu_mul") or GeGLU's ("gelu_tanh_mul") gate and up as float8 dynamic per-row linears of x."""
    return _gated(act, decode_linear_fp8_ref(x, wg, sg), decode_linear_fp8_ref(x, wu, su))


def _fp8_multi_forms(act: str | None) -> tuple:
    """The graph forms of the q/k/v (`act` None) or gate/up rule: each linear in torchao's _scaled_mm spelling
    (_scaled_mm_of: use_fast_accum True and False; the scale unsqueezed or not, as rows past one leave it)."""
    def form(fast: bool, unsqueeze: bool):
        if act is None:
            def qkv(x, wq, sq, wk, sk, wv, sv):
                return tuple(_scaled_mm_of(x, w, s, fast, unsqueeze) for w, s in ((wq, sq), (wk, sk), (wv, sv)))
            fn = qkv
        else:
            def gate_up(x, wg, sg, wu, su):
                return _gated(act, _scaled_mm_of(x, wg, sg, fast, unsqueeze), _scaled_mm_of(x, wu, su, fast, unsqueeze))
            fn = gate_up
        fn.__name__ = (f"_fp8_{fn.__name__}_scaled_mm{'' if fast else '_precise'}{'_unsqueezed' if unsqueeze else ''}"
                       f"{'' if act in (None, 'silu_mul') else '_' + act}")
        return fn

    return tuple(form(fast, unsqueeze) for fast in (True, False) for unsqueeze in (False, True))


def _up_times_silu_gate(x: Tensor, w: Tensor) -> Tensor:
    """The halves rule as Phi-3 writes it: up * silu(gate) (operands of two computed values are not commuted)."""
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return up * F.silu(gate)


def decode_qkv_ref(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, bq: Tensor | None = None,
                   bk: Tensor | None = None, bv: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)


def decode_rms_qkv_ref(h: Tensor, norm_w: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, bq: Tensor | None = None,
                       bk: Tensor | None = None, bv: Tensor | None = None,
                       eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """transformers' RMSNorm of h, then q, k and v of it (a decoder layer's input_layernorm and projections)."""
    return decode_qkv_ref(rms_norm_ref(h, norm_w, eps), wq, wk, wv, bq, bk, bv)


# ---- checks ----------------------------------------------------------------------------------------
def weight_operands(x: str, *weights: str, one_shape: bool = True, halves: bool = False) -> G.Guard:
    """Can fire: plain int sizes; x [..., K] contiguous; each weight a contiguous [N, K] (nn.Linear's), one
    shape for all unless not `one_shape`; K and every N (with `halves`, N / 2: the weight is read as two) multiples
    of 8 and every tensor 16-byte aligned (the kernel's 16-byte loads)."""
    def check(s: G.Site) -> str | None:
        tx, tws = s.tensor(x), [s.tensor(w) for w in weights]
        sizes = [*tx.shape, *tx.stride(), tx.storage_offset()] + [v for t in tws for v in (*t.shape, *t.stride(),
                                                                                          t.storage_offset())]
        if not all(isinstance(v, int) for v in sizes):
            return "symbolic sizes or strides"
        if tx.dim() < 2 or not tx.is_contiguous():
            return f"{x} {tuple(tx.shape)} must be contiguous rows (strides {tx.stride()})"
        k = tx.shape[-1]
        for name, t in zip(weights, tws):
            if t.dim() != 2 or t.shape[1] != k or (one_shape and tuple(t.shape) != tuple(tws[0].shape)) \
                    or not t.is_contiguous():
                return f"{name} {tuple(t.shape)} (strides {t.stride()}) is not a contiguous [N, {k}] weight"
        ns = sorted({t.shape[0] // 2 if halves else t.shape[0] for t in tws})
        if k % 8 or any(n % 8 for n in ns) or k == 0 or (halves and any(t.shape[0] % 2 for t in tws)):
            return f"K={k} and N={'/'.join(map(str, ns))} must be positive multiples of 8"
        if any(t.storage_offset() % 8 for t in (tx, *tws)):
            return "a storage offset is not a multiple of 8 elements (16 bytes)"
        return None

    return G.Guard(f"weight_operands({x}, {', '.join(weights)})", check)


def weight8_operands(x: str, w: str, scales: str, wdtype: torch.dtype = torch.int8,
                     row_scales: bool | None = None) -> G.Guard:
    """Can fire: static sizes; x [..., K] contiguous, K a positive multiple of 16 (a lane reads 16 8-bit weights at
    once); w a contiguous [N, K] of `wdtype` (int8, or float8_e4m3fn); scales N contiguous values: a [N] vector (int8
    weight-only: torchao's scales) or, `row_scales` (default: not int8), float32 [N] / [N, 1] (fp8 and int8 dynamic:
    torchao's per-row weight scales); x and w 16-byte aligned."""
    row_scales = wdtype != torch.int8 if row_scales is None else row_scales

    def check(s: G.Site) -> str | None:
        tx, tw, ts = s.tensor(x), s.tensor(w), s.tensor(scales)
        sizes = [v for t in (tx, tw, ts) for v in (*t.shape, *t.stride(), t.storage_offset())]
        if not all(isinstance(v, int) for v in sizes):
            return "symbolic sizes or strides"
        k = tx.shape[-1]
        if tx.dim() < 2 or not tx.is_contiguous() or k == 0 or k % 16:
            return f"{x} {tuple(tx.shape)} must be contiguous rows with K a multiple of 16"
        if tw.dtype != wdtype or tw.dim() != 2 or tw.shape[1] != k or not tw.is_contiguous():
            return f"{w} {tw.dtype} {tuple(tw.shape)} is not a contiguous {wdtype} [N, {k}] weight"
        n = tw.shape[0]
        shapes = ((n,), (n, 1)) if row_scales else ((n,),)
        if tuple(ts.shape) not in shapes or not ts.is_contiguous() or (row_scales and ts.dtype != torch.float32):
            return f"{scales} {ts.dtype} {tuple(ts.shape)} is not a contiguous {' or '.join(map(str, shapes))} vector"
        if tx.storage_offset() % 8 or tw.storage_offset() % 16:
            return "x or w does not start on 16 bytes"
        return None

    return G.Guard(f"weight8_operands({x}, {w}, {scales})", check)


def one_n(*weights: str) -> G.Guard:
    """Can fire: the weights have one N (gate and up: the kernel reads the same columns of both)."""
    def check(s: G.Site) -> str | None:
        ns = [s.tensor(w).shape[0] for w in weights]
        return None if len(set(ns)) == 1 else f"{'/'.join(weights)} have N {'/'.join(map(str, ns))}, not one"

    return G.Guard(f"one_n({', '.join(weights)})", check)


def splits_in_halves(w: str) -> G.Guard:
    """Can fire: the product is split in two halves of `w`'s rows (chunk(2)): the search pattern takes any split
    size, the op splits at N / 2."""
    def check(s: G.Site) -> str | None:
        n = s.tensor(w).shape[0]
        for node in s.match.nodes:
            if node.target is torch.ops.aten.split.Tensor and node.args[1] * 2 != n:
                return f"split at {node.args[1]} of {n} rows, not in halves"
            if node.target is torch.ops.aten.split_with_sizes.default and list(node.args[1]) != [n // 2, n // 2]:
                return f"split into {list(node.args[1])} of {n} rows, not in halves"
        return None

    return G.Guard(f"splits_in_halves({w})", check)


def has_tma_kernel(arch: str | None) -> bool:
    """Whether kernels built for `arch` hold the TMA decode GEMM (sm_90a only: wgmma and the bulk tensor copy)."""
    return arch == "9.0a"


def _rows(t: Tensor):
    """The rows of x [..., K] (batch x new tokens; symbolic where the shape is)."""
    return t.numel() // t.shape[-1] if known(t.shape[-1] > 0) else t.numel()


def few_rows(x: str, rule: str) -> G.Guard:
    """Policy: at most MAX_ROWS_TMA[rule] rows where the TMA kernel runs, else MAX_ROWS[rule] (read at each check:
    a benchmark may change them). Above it cuBLAS's tiled GEMMs reuse each weight tile across enough rows that the
    pass over the weight is no longer the whole cost."""
    def check(s: G.Site) -> str | None:
        rows = _rows(s.tensor(x))
        limit = (MAX_ROWS_TMA if has_tma_kernel(s.kernel_arch()) else MAX_ROWS)[rule]
        return None if known(rows <= limit) else f"{rows} rows (> {limit}): not a decode step's linear"

    return G.Guard(f"few_rows({x})", check, policy=True)


def narrow_weight(x: str, w: str) -> G.Guard:
    """Policy: a one-weight linear with no activation to fuse fires only where N <= MAX_PLAIN_N, or at one row of
    K >= WIDE_ONE_ROW_K where the TMA kernel runs. Wider weights (a fused q/k/v, an LM head) measured slower than cuBLAS
    at 8-64 rows (H200, op alone, cold weights: GPT-NeoX's query_key_value N=6144 0.90-0.92x, LM heads N=32000 / 50304
    0.86-0.96x but 1.01-1.02x at 8-16 for 50304), narrow ones faster (N=2048: 1.00-1.26x at 1-64 rows). At one row
    with K = 4544 (Falcon-7B widths, 8 layers; H200, CUDA graphs, position 512 of 2048, two calls) naming the rule
    for its N = 4544-65024 linears took the step from 1.314 to 1.211 ms."""
    def check(s: G.Site) -> str | None:
        n, k = s.tensor(w).shape
        if known(n <= MAX_PLAIN_N):
            return None
        if known(_rows(s.tensor(x)) == 1) and known(k >= WIDE_ONE_ROW_K) and has_tma_kernel(s.kernel_arch()):
            return None
        return f"N={n} (> {MAX_PLAIN_N}): a wide linear with no epilogue measured slower than cuBLAS"

    return G.Guard(f"narrow_weight({w})", check, policy=True)


MAX_FP8_WIDE_N = 8192  # an fp8 linear wider than this (an LM head) fires at one row only (wide_fp8_one_row)


def wide_fp8_one_row(x: str, w: str) -> G.Guard:
    """Policy: an fp8 linear with N > MAX_FP8_WIDE_N fires at one row only, except where the TMA kernel runs (sm_90a
    builds). H200, op alone, cold weights, against Inductor's Triton quantization + aten._scaled_mm: the mma.sync
    kernels ran the 2048 -> 32000 LM head 1.19x at 1 row, 0.77-0.88x at 8-32 (N <= 5632 1.19-2.02x at 1-32 rows,
    0.55-1.13x at 64); the TMA kernel 1.45x at 1 row, 1.06x at 8, 1.13x at 32, 1.06x at 64 (N <= 5632: 1.05-2.60x
    at 1-64)."""
    def check(s: G.Site) -> str | None:
        rows, n = _rows(s.tensor(x)), s.tensor(w).shape[0]
        return None if known(n <= MAX_FP8_WIDE_N) or known(rows <= 1) or has_tma_kernel(s.kernel_arch()) else \
            f"N={n} (> {MAX_FP8_WIDE_N}) at {rows} rows: a wide fp8 linear measured slower than _scaled_mm past one row"

    return G.Guard(f"wide_fp8_one_row({x}, {w})", check, policy=True)


def wide_int8_few_rows(x: str, w: str) -> G.Guard:
    """Policy: an int8 dynamic linear with N > MAX_FP8_WIDE_N (an LM head) fires only up to 16 rows, where Inductor's
    aten._int_mm cannot run at all; past that its speed against cuBLAS's int8 GEMM has not been measured."""
    def check(s: G.Site) -> str | None:
        rows, n = _rows(s.tensor(x)), s.tensor(w).shape[0]
        return None if known(n <= MAX_FP8_WIDE_N) or known(rows <= 16) else \
            f"N={n} (> {MAX_FP8_WIDE_N}) at {rows} rows: a wide int8 linear is left to cuBLAS past 16 rows"

    return G.Guard(f"wide_int8_few_rows({x}, {w})", check, policy=True)


def tma_default(dtype: torch.dtype, arch: str | None) -> bool:
    """The plain linear's CUDA default (Pattern.cuda_default): on where the TMA kernel runs; elsewhere opt-in, since
    fusekit's other decode GEMM kernels were slower than cuBLAS at every plain projection (0.43-0.98x, H100)."""
    return has_tma_kernel(arch)


# ---- test inputs: case = (*rows, K, N) with rows [B, S] (3-D x) or [M] (2-D) -------------------------
def _inputs(gated: bool, halves: bool = False, bias: bool = False):
    def make(case, dt, dev):
        *rows, k, n = case
        if halves:  # gate and up in one weight
            return rand((*rows, k), dt, dev), rand((2 * n, k), dt, dev, scale=k ** -0.5)
        ws = [rand((n, k), dt, dev, scale=k ** -0.5) for _ in range(2 if gated else 1)]
        return (rand((*rows, k), dt, dev), *ws, *((rand((n,), dt, dev),) if bias else ()))

    return make


def _bad_layout(make, case):
    """N = 20, not a multiple of 8: the kernel's 16-byte weight rows need K and N multiples of 8."""
    return lambda dt, dev: make((*case[:-1], 20), dt, dev)


# Llama-style (hidden 2048, 16/4 heads of 128, MLP 5632) and Qwen2-style (1536, 12/2, 8960) decode shapes,
# awkward ones (K not a multiple of 32, N of 16, one row, rows over one and two 16-row tiles); the first case
# is compiled by the GPU tests, so it fires (8 rows at most)
GPU_CASES = {3: ((8, 1, 2048, 512), (1, 1, 1536, 8960), (8, 2, 2048, 2048), (3, 1, 72, 200), (40, 1, 264, 136)),
             2: ((4, 2048, 5632), (1, 1536, 256), (17, 5632, 2048), (64, 1032, 24))}


def _gelu_new_of_linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """The tanh-GELU bias rule as HF's NewGELUActivation (GPT-J, Phi-2's gelu_new) spells the activation out."""
    y = F.linear(x, w, b)
    return 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y ** 3)))


def _rule(name: str, gated: bool, rank: int, halves: bool = False, act: str = "silu_mul",
          bias: bool = False, residual: bool = False) -> Pattern:
    """A decode_linear rule: gated (two weights, or one in halves) with `act`'s gated epilogue, or one weight,
    with a bias and `act` ("none", "gelu", "gelu_tanh") where `bias`, or a residual added where `residual`."""
    static = {"act": "silu_mul_halves", "w2": None} if halves else {"act": act} if gated else \
        {"act": act if bias else "none", "w2": None}
    if not bias:
        static["b"] = None
    if not residual:
        static["r"] = None
    weights = ("w", "w2") if gated and not halves else ("w",)
    make = _residual_inputs(_inputs(gated, halves, bias)) if residual else _inputs(gated, halves, bias)
    trace_case = (2, 1, 16, 24) if rank == 3 else (2, 16, 24)
    pid = f"decode_gemm.{name}{'' if rank == 3 else '_2d'}"
    variants = (_up_times_silu_gate,) if halves else (_gelu_new_of_linear,) if bias and act == "gelu_tanh" else ()
    return Pattern(
        pid, reference=decode_linear_ref, op="decode_linear",
        static=static, dtypes=DTYPES, inputs=make, trace="inductor", trace_case=trace_case,
        cuda_default=False if residual else True if gated else tma_default, variants=variants,
        guards=(G.same_dtype("x", *weights, *(("b",) if bias else ()), *(("r",) if residual else ())),
                weight_operands("x", *weights, halves=halves), *((splits_in_halves("w"),) if halves else ()),
                *((vectors("w", "b"),) if bias else ()), *((residual_like("r", "x", "w"),) if residual else ()),
                few_rows("x", "gate_up_silu" if gated else "linear"),
                *((narrow_weight("x", "w"),) if not gated and static["act"] == "none" else ())),
        fixtures=Fixtures(cases=((1, 1, 32, 40), (2, 3, 16, 24)) if rank == 3 else ((5, 32, 40), (3, 16, 24)),
                          gpu_cases=GPU_CASES[rank], bad_layout=_bad_layout(make, trace_case),
                          bad_reason="multiples of 8"),
    )


def _residual_inputs(make):
    """x, w and a residual r [*rows, N] (the output's shape)."""
    def with_r(case, dt, dev):
        *rows, _, n = case
        return (*make(case, dt, dev), rand((*rows, n), dt, dev))

    return with_r


def residual_like(r: str, x: str, w: str) -> G.Guard:
    """Can fire: the residual is a contiguous tensor of the output's shape [..., N] (static sizes): the kernel adds
    r[row, col] to each output element."""
    def check(s: G.Site) -> str | None:
        tr, tx, tw = s.tensor(r), s.tensor(x), s.tensor(w)
        want = (*tx.shape[:-1], tw.shape[0])
        if not all(isinstance(v, int) for v in (*tr.shape, *tr.stride())):
            return "symbolic sizes or strides"
        if tuple(tr.shape) != tuple(want) or not tr.is_contiguous():
            return f"{r} {tuple(tr.shape)} (strides {tr.stride()}) is not a contiguous tensor of the output's shape {want}"
        return None

    return G.Guard(f"residual_like({r})", check)


def norm_weight(h: str, nw: str) -> G.Guard:
    """Can fire: the RMSNorm weight is a contiguous [K] of h's K starting on 16 bytes (the kernels read 8 of it at
    once, beside h's)."""
    def check(s: G.Site) -> str | None:
        th, tn = s.tensor(h), s.tensor(nw)
        if tn.dim() != 1 or not known(tn.shape[0] == th.shape[-1]) or not tn.is_contiguous():
            return f"{nw} {tuple(tn.shape)} (strides {tn.stride()}) is not a contiguous [{th.shape[-1]}] norm weight"
        if not isinstance(tn.storage_offset(), int) or tn.storage_offset() % 8:
            return f"{nw} does not start on 16 bytes"
        return None

    return G.Guard(f"norm_weight({nw})", check)


def _is_wait(n) -> bool:
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and \
        n.target is torch.ops._c10d_functional.wait_tensor.default


def not_after_all_reduce(h: str) -> G.Guard:
    """Policy: an RMSNorm of an all-reduce's sum (with or without the residual add) is left to
    collective.all_reduce_add_rms_norm, which takes the sum, the add and the norm in one kernel (a tensor-parallel
    step: benchmarks/RESULTS.md); the q/k/v and gate/up rules then take the linears after it."""
    def check(s: G.Site) -> str | None:
        n = s.match.kwargs[h]
        if _is_wait(n) or (isinstance(n, torch.fx.Node) and n.target is torch.ops.aten.add.Tensor
                           and any(_is_wait(a) for a in n.args)):
            return f"{h} is an all-reduce's sum: collective.all_reduce_add_rms_norm takes its RMSNorm"
        return None

    return G.Guard(f"not_after_all_reduce({h})", check, policy=True)


def _rms_inputs(make):
    """h for x and an RMSNorm weight [K] after it (the rule's (h, norm_w, weights...))."""
    def with_norm(case, dt, dev):
        h, *rest = make(case, dt, dev)
        return (h, (1.0 + rand((h.shape[-1],), torch.float32, dev, scale=0.2)).to(dt), *rest)

    return with_norm


# Where an RMSNorm rule does not fire, Inductor's kernel for the norm may round an element of the normalized row
# differently from eager's two roundings (fp16: 1.3e-3 off eager at one output of the CPU tests)
RMS_INDUCTOR_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (5e-3, 1e-2), torch.bfloat16: (4e-2, 5e-2)}


def _rms_guards(rule: str, *weights: str, bias: tuple[str, ...] = ()) -> tuple[G.Guard, ...]:
    return (G.same_dtype("h", "norm_w", *weights, *bias), weight_operands("h", *weights, one_shape=len(weights) != 3),
            norm_weight("h", "norm_w"), *(vectors(w, b) for w, b in zip(weights, bias)), few_rows("h", rule),
            not_after_all_reduce("h"))


# The RMSNorm rules and linear_residual are opt-in (options={"enable": [...]}; RMS_RESIDUAL_RULES names all four).
# Together they take the add + RMSNorm kernel between a layer's linears out of a decode step (Llama-style: 10.8 ->
# 8.8 kernels a layer), but measured no faster (H200, torch 2.11, CUDA graphs, position 1024 of 4096; the TMA
# kernel with the residual's loads ahead of the cluster barrier): batch 1 0.482 ms with and without them, batch 32
# 0.693 against 0.692. In the step's profile at batch 1 (means a layer) gate/up with the norm took 17.0 us (the
# plain kernel 16.4 and Inductor's add + RMSNorm 2.3), q/k/v 9.1 (7.4 + 2.3), but the down projection after the
# normed gate/up ends ~2 us later than after the plain one, residual prefetched or not (benchmarks/RESULTS.md).
RMS_RESIDUAL_RULES = ("decode_gemm.rms_qkv", "decode_gemm.rms_qkv_bias", "decode_gemm.rms_gate_up_silu",
                      "decode_gemm.linear_residual")


def _rms_gate_up_rule() -> Pattern:
    """transformers' RMSNorm (post_attention_layernorm) and SwiGLU's gate and up after it: one launch, the norm
    computed by each CTA from the rows it reads (csrc/decode_gemm/decode_rms_linear.cu). Opt-in (above)."""
    trace_case = (2, 1, 16, 24)
    make = _rms_inputs(_inputs(True))
    return Pattern(
        "decode_gemm.rms_gate_up_silu", reference=decode_rms_linear_ref, op="decode_rms_linear",
        static={"act": "silu_mul", "b": None}, literals=("eps",), dtypes=DTYPES, inputs=make, trace="inductor",
        trace_case=trace_case, cuda_default=False, guards=_rms_guards("gate_up_silu", "w", "w2"),
        fixtures=Fixtures(cases=((1, 1, 32, 40), (2, 3, 16, 24)), gpu_cases=GPU_CASES[3],
                          inductor_tol=RMS_INDUCTOR_TOL, bad_layout=_bad_layout(make, trace_case),
                          bad_reason="multiples of 8"),
    )


def _rms_qkv_rule(bias: bool) -> Pattern:
    """transformers' RMSNorm (input_layernorm) and q, k, v after it (with Qwen2's biases: bias): one launch. Opt-in."""
    trace_case = (2, 1, 16, 24, 8)
    make = _rms_inputs(_qkv_inputs(bias))
    return Pattern(
        f"decode_gemm.rms_qkv{'_bias' if bias else ''}", reference=decode_rms_qkv_ref, op="decode_rms_qkv",
        static={} if bias else {"bq": None, "bk": None, "bv": None}, literals=("eps",), dtypes=DTYPES, inputs=make,
        trace="inductor", trace_case=trace_case, exclusive=("wq", "wk", "wv"), cuda_default=False,
        guards=_rms_guards("qkv", "wq", "wk", "wv", bias=("bq", "bk", "bv") if bias else ()),
        fixtures=Fixtures(cases=((1, 1, 32, 40, 16), (2, 3, 16, 24, 8)), gpu_cases=QKV_GPU_CASES[3],
                          inductor_tol=RMS_INDUCTOR_TOL, bad_reason="multiples of 8",
                          bad_layout=lambda dt, dev: make((*trace_case[:-2], 20, 8), dt, dev)),
    )


# q/k/v: case = (*rows, K, Nq, Nkv); Llama-style, Qwen2-style, MHA (one N), awkward sizes as above
QKV_GPU_CASES = {3: ((8, 1, 2048, 2048, 512), (1, 1, 1536, 1536, 256), (2, 3, 1024, 1024, 1024), (3, 1, 72, 200, 8),
                     (40, 1, 264, 136, 24)),
                 2: ((4, 2048, 2048, 512), (1, 1536, 1536, 256), (17, 1032, 24, 8), (70, 64, 8, 16))}


def _qkv_inputs(bias: bool):
    def make(case, dt, dev):
        *rows, k, nq, nkv = case
        ns = (nq, nkv, nkv)
        return (rand((*rows, k), dt, dev), *(rand((n, k), dt, dev, scale=k ** -0.5) for n in ns),
                *((rand((n,), dt, dev) for n in ns) if bias else ()))

    return make


def vectors(w: str, b: str) -> G.Guard:
    """Can fire: the bias `b` is a contiguous [N] of its weight `w`'s N (the kernel reads b[col])."""
    def check(s: G.Site) -> str | None:
        tw, tb = s.tensor(w), s.tensor(b)
        if tb.dim() != 1 or tb.shape[0] != tw.shape[0] or not tb.is_contiguous():
            return f"{b} {tuple(tb.shape)} (strides {tb.stride()}) is not a contiguous [{tw.shape[0]}] bias of {w}"
        return None

    return G.Guard(f"vectors({b} of {w})", check)


def _qkv_rule(rank: int, bias: bool) -> Pattern:
    trace_case = (2, 1, 16, 24, 8) if rank == 3 else (2, 16, 24, 8)
    make = _qkv_inputs(bias)
    tensors = ("x", "wq", "wk", "wv", *(("bq", "bk", "bv") if bias else ()))
    return Pattern(
        f"decode_gemm.qkv{'_bias' if bias else ''}{'' if rank == 3 else '_2d'}", reference=decode_qkv_ref,
        op="decode_qkv", static={} if bias else {"bq": None, "bk": None, "bv": None},
        dtypes=DTYPES, inputs=make, trace="inductor", trace_case=trace_case, exclusive=("wq", "wk", "wv"),
        guards=(G.same_dtype(*tensors), weight_operands("x", "wq", "wk", "wv", one_shape=False),
                *((vectors("wq", "bq"), vectors("wk", "bk"), vectors("wv", "bv")) if bias else ()),
                few_rows("x", "qkv")),
        fixtures=Fixtures(
            cases=((1, 1, 32, 40, 16), (2, 3, 16, 24, 8)) if rank == 3 else ((5, 32, 40, 16), (3, 16, 24, 8)),
            gpu_cases=QKV_GPU_CASES[rank], bad_layout=lambda dt, dev: make((*trace_case[:-2], 20, 8), dt, dev),
            bad_reason="multiples of 8"),
    )


# the 8-bit rules' (int8 weight-only, fp8) test shapes: K a multiple of 16; on the GPU Llama- and Qwen2-style
# decode shapes, K not a multiple of the 64-wide chunk, N not of the column tile, rows over one and four 16-row tiles
W8_CASES = {3: ((1, 1, 32, 40), (2, 3, 16, 24)), 2: ((5, 32, 40), (3, 16, 24))}
W8_GPU_CASES = {3: ((8, 1, 2048, 512), (1, 1, 1536, 8960), (3, 1, 80, 200), (40, 1, 272, 136)),
                2: ((4, 2048, 5632), (1, 1536, 256), (17, 5632, 2048), (64, 1040, 24))}


def _w8_inputs(case, dt, dev):
    *rows, k, n = case
    return (rand((*rows, k), dt, dev), torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8),
            (torch.rand(n, device=dev) * 0.02 / k ** 0.5 + 1e-4).to(dt))


def _w8_rule(rank: int) -> Pattern:
    """torchao's int8 weight-only linear (w8a16) of a decode step: the int8 weight widened inside the GEMM."""
    trace_case = (2, 1, 16, 24) if rank == 3 else (2, 16, 24)
    return Pattern(
        f"decode_gemm.linear_w8{'' if rank == 3 else '_2d'}", reference=decode_linear_w8_ref, op="decode_linear_w8",
        dtypes=DTYPES, inputs=_w8_inputs, trace="inductor", trace_case=trace_case,
        graph_forms=(_weight_int8pack_mm, _w8_mm_as_mul_sum) if rank == 2 else (_weight_int8pack_mm_3d,),
        guards=(G.same_dtype("x", "scales"), weight8_operands("x", "w", "scales"), few_rows("x", "linear_w8")),
        fixtures=Fixtures(
            cases=W8_CASES[rank], gpu_cases=W8_GPU_CASES[rank],
            bad_layout=lambda dt, dev: _w8_inputs((*trace_case[:-2], 24, 8), dt, dev), bad_reason="multiple of 16"),
    )


def _fp8_weight_inputs(case, dt, dev):
    *rows, k, n = case
    w = (torch.randn(n, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    return rand((*rows, k), dt, dev), w, torch.rand(n, 1, device=dev) * 0.02 / k ** 0.5 + 1e-4


def _fp8_weight_rule(rank: int) -> Pattern:
    """torchao's float8 weight-only linear of a decode step: each e4m3 weight scaled and rounded inside the GEMM
    (Inductor writes the dequantized 16-bit weight, then reads it in a cuBLAS GEMM)."""
    trace_case = (2, 1, 16, 24) if rank == 3 else (2, 16, 24)
    return Pattern(
        f"decode_gemm.linear_fp8_weight{'' if rank == 3 else '_2d'}", reference=decode_linear_fp8_weight_ref,
        op="decode_linear_fp8_weight", dtypes=DTYPES, inputs=_fp8_weight_inputs, trace="inductor",
        trace_case=trace_case,
        graph_forms=(_fp8_weight_mm_as_mul_sum, _fp8_weight_mm_as_mul_sum_folded) if rank == 2 else (),
        guards=(weight8_operands("x", "w", "w_scale", torch.float8_e4m3fn), few_rows("x", "linear_fp8_weight")),
        fixtures=Fixtures(
            cases=W8_CASES[rank], gpu_cases=W8_GPU_CASES[rank],
            bad_layout=lambda dt, dev: _fp8_weight_inputs((*trace_case[:-2], 24, 8), dt, dev),
            bad_reason="multiple of 16"),
    )


def int8_operands(xq: str, xs: str, w: str, ws: str) -> G.Guard:
    """Can fire: static sizes; xq an int8 [..., K] of contiguous rows, K a positive multiple of 16 (a lane reads 16
    of each row at once); xs its float32 row scales (one per row, contiguous); w a contiguous int8 [N, K]; ws its
    float32 scales (N contiguous values); xq and w 16-byte aligned."""
    def check(s: G.Site) -> str | None:
        tq, tx, tw, tws = (s.tensor(n) for n in (xq, xs, w, ws))
        sizes = [v for t in (tq, tx, tw, tws) for v in (*t.shape, *t.stride(), t.storage_offset())]
        if not all(isinstance(v, int) for v in sizes):
            return "symbolic sizes or strides"
        k = tq.shape[-1]
        if tq.dtype != torch.int8 or tq.dim() < 2 or not tq.is_contiguous() or k == 0 or k % 16:
            return f"{xq} {tq.dtype} {tuple(tq.shape)} must be contiguous int8 rows with K a multiple of 16"
        if tw.dtype != torch.int8 or tw.dim() != 2 or tw.shape[1] != k or not tw.is_contiguous():
            return f"{w} {tw.dtype} {tuple(tw.shape)} is not a contiguous int8 [N, {k}] weight"
        for name, t, n in ((xs, tx, tq.numel() // k), (ws, tws, tw.shape[0])):
            if t.dtype != torch.float32 or t.numel() != n or not t.is_contiguous():
                return f"{name} {t.dtype} {tuple(t.shape)} is not {n} contiguous float32 scales"
        if tq.storage_offset() % 16 or tw.storage_offset() % 16:
            return f"{xq} or {w} does not start on 16 bytes"
        return None

    return G.Guard(f"int8_operands({xq}, {xs}, {w}, {ws})", check)


def _w8a8_inputs(case, dt, dev):
    """xq, xs, w, ws for case (*rows, K, N); `dt` is the rule's first-tensor dtype (int8)."""
    *rows, k, n = case
    return (torch.randint(-128, 128, (*rows, k), device=dev, dtype=torch.int8),
            (torch.rand(*rows, 1, device=dev) * 0.05 + 1e-3).to(torch.bfloat16).float(),  # torchao's: bf16-valued
            *_int8_weight(n, k, dev))


def _tile_columns(w: str) -> G.Guard:
    """Can fire: N a multiple of 8 (the tiled GEMM's output rows are stored 16 bytes at a time)."""
    def check(s: G.Site) -> str | None:
        n = s.tensor(w).shape[0]
        return None if n % 8 == 0 else f"N={n} is not a multiple of 8"

    return G.Guard(f"tile_columns({w})", check)


# Where the tiled GEMM fires by default: at least TILED_MIN_ROWS rows and TILED_MIN_OUTPUTS outputs. H100, torch 2.11,
# Llama-style linears compiled whole (x's quantization included), us, Inductor -> fusekit: at 2048 rows every one faster
# (q 43.6 -> 25.0, k/v 23.2 -> 19.0, gate 103.5 -> 47.4, down 98.9 -> 61.3, LM head 522.3 -> 205.9); at 256 rows gate
# (1.4M outputs) 21.5 -> 13.5 and the LM head 75.9 -> 36.2, but q, k/v and down (0.1-0.5M) 0-4% slower; at 64 rows
# every one 5-10% slower (cuBLAS's int8 GEMM and Inductor's scales kernel; benchmarks/RESULTS.md).
TILED_MIN_ROWS, TILED_MIN_OUTPUTS = 256, 1 << 20


def _tiled_rows(xq: str, w: str) -> G.Guard:
    """Policy: at least TILED_MIN_ROWS rows and TILED_MIN_OUTPUTS outputs (rows x N)."""
    def check(s: G.Site) -> str | None:
        tq, n = s.tensor(xq), s.tensor(w).shape[0]
        rows = tq.numel() // tq.shape[-1]
        if rows >= TILED_MIN_ROWS and rows * n >= TILED_MIN_OUTPUTS:
            return None
        return (f"{rows} rows x N={n}: under {TILED_MIN_ROWS} rows or {TILED_MIN_OUTPUTS} outputs, cuBLAS's int8 GEMM "
                f"and Inductor's scales kernel measured as fast")

    return G.Guard(f"tiled_rows({xq}, {w})", check, policy=True)


# test shapes (*rows, K, N): one and several 128-row tiles, K not a multiple of the 128-wide k tile, N not of the
# 128-wide column tile; the CPU cases at the policy's edge (256 rows x 4096 outputs) and past it
W8A8_CASES = {3: ((2, 128, 32, 4096), (1, 300, 48, 4104)), 2: ((256, 32, 4096), (300, 16, 4104))}
W8A8_GPU_CASES = {3: ((4, 512, 2048, 512), (2, 200, 1552, 2824)), 2: ((2048, 5632, 2048), (300, 2048, 5632),
                                                                      (257, 80, 4096))}


def _w8a8_rule(rank: int, out: torch.dtype, tiled: bool = False) -> Pattern:
    """torchao's int8 dynamic-activation int8-weight linear after x's quantization (by Inductor's kernel): the int8
    products and both scales in one launch (Inductor: aten._int_mm, then an epilogue kernel). At a decode step's
    rows (up to 32) ``decode_linear_w8a8``; `tiled`: past them, by default only at prefill sizes (_tiled_rows), the
    tiled GEMM ``linear_w8a8``, matched after the decode rule."""
    rows = 40 if tiled else 1  # traced past the decode rows, or at one
    trace_case = (2, rows, 16, 24) if rank == 3 else (2 * rows, 16, 24)
    name, op = ("linear_w8a8_tiled", "linear_w8a8") if tiled else ("linear_w8a8", "decode_linear_w8a8")
    policy = (_tile_columns("w"), _tiled_rows("xq", "w")) if tiled else (few_rows("xq", "linear_w8a8"),)
    return Pattern(
        f"decode_gemm.{name}_{str(out)[6:]}{'' if rank == 3 else '_2d'}", reference=decode_linear_w8a8_ref,
        op=op, static={"dtype": out, "out_dtype": None}, dtypes=(torch.int8,), inputs=_w8a8_inputs,
        trace="inductor", trace_case=trace_case, variants=(_w8a8_int_mm_cpu(out),), tol=EXACT,
        output_casts=(torch.float32,), cast_any_user=True,
        guards=(int8_operands("xq", "xs", "w", "ws"), *policy),
        fixtures=Fixtures(
            cases=(W8A8_CASES if tiled else W8_CASES)[rank],
            gpu_cases=(W8A8_GPU_CASES if tiled else W8_GPU_CASES)[rank],
            bad_layout=lambda dt, dev: _w8a8_inputs((*trace_case[:-2], 24, 8), dt, dev), bad_reason="multiple of 16"),
    )


def _int8_weight(n: int, k: int, dev) -> tuple[Tensor, Tensor]:
    """An int8 [n, k] weight and its float32 [n, 1] per-row scales (torchao's Int8Tensor of a weight)."""
    return (torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8),
            torch.rand(n, 1, device=dev) * 1e-3 / k ** 0.5 + 1e-5)


def _int8dyn_inputs(case, dt, dev):
    *rows, k, n = case
    return rand((*rows, k), dt, dev), *_int8_weight(n, k, dev)


def _int8dyn_qkv_inputs(case, dt, dev):
    *rows, k, nq, nkv = case
    return rand((*rows, k), dt, dev), *_int8_weight(nq, k, dev), *_int8_weight(nkv, k, dev), *_int8_weight(nkv, k, dev)


def _int8dyn_gate_up_inputs(case, dt, dev):
    *rows, k, n = case
    return rand((*rows, k), dt, dev), *_int8_weight(n, k, dev), *_int8_weight(n, k, dev)


# The int8 dynamic rules' CPU test shapes: the first of several rows (torch 2.13's Inductor, which the tests that
# must not fire compare with eager, returns garbage for aten._int_mm of one row on a CPU), then one row (the rule).
INT8DYN_CASES = {3: ((2, 1, 32, 40), (2, 3, 16, 24), (1, 1, 32, 40)), 2: ((5, 32, 40), (3, 16, 24), (1, 32, 40))}
INT8DYN_QKV_CASES = {3: ((2, 1, 32, 48, 16), (2, 3, 16, 32, 16), (1, 1, 32, 48, 16)),
                     2: ((5, 32, 48, 16), (3, 16, 32, 16), (1, 32, 48, 16))}
# Inductor quantizes x as x * (1 / 127.5) where eager divides: an int8 of x may move by one, the output by that
# step times a weight (a few 1e-3 at the tests' scales)
INT8DYN_INDUCTOR_TOL = {torch.float16: (1e-2, 5e-2), torch.bfloat16: (2e-2, 5e-2)}


def _int8dyn_guards(x: str, *weights: tuple[str, str]) -> tuple[G.Guard, ...]:
    return (*(weight8_operands(x, w, s, torch.int8, row_scales=True) for w, s in weights),
            few_rows(x, "linear_int8dyn"), wide_int8_few_rows(x, weights[0][0]))


def _int8dyn_rule(rank: int) -> Pattern:
    """torchao's int8 dynamic per-row linear of a decode step whole: x's quantization, the int8 GEMM and both scales
    in one launch (Inductor: a Triton quantization, aten._int_mm, a scales kernel). Matched before linear_w8a8 (the
    same linear after x's quantization: where this rule's guards fail, that one may still fire)."""
    trace_case = (2, 1, 16, 32) if rank == 3 else (2, 16, 32)
    return Pattern(
        f"decode_gemm.linear_int8dyn{'' if rank == 3 else '_2d'}", reference=decode_linear_int8dyn_ref,
        op="decode_linear_int8dyn", dtypes=(torch.float16, torch.bfloat16), inputs=_int8dyn_inputs, trace="inductor",
        trace_case=trace_case, variants=(_int8dyn_cpu,), tol=EXACT, guards=_int8dyn_guards("x", ("w", "w_scale")),
        fixtures=Fixtures(
            cases=INT8DYN_CASES[rank], gpu_cases=W8_GPU_CASES[rank], inductor_tol=INT8DYN_INDUCTOR_TOL,
            bad_layout=lambda dt, dev: _int8dyn_inputs((*trace_case[:-2], 24, 8), dt, dev), bad_reason="multiple of 16"),
    )


def _int8dyn_qkv_rule(rank: int) -> Pattern:
    """torchao's int8 dynamic q, k and v of one x: three linears, one launch, x quantized once."""
    trace_case = (2, 1, 16, 32, 16) if rank == 3 else (2, 16, 32, 16)
    return Pattern(
        f"decode_gemm.qkv_int8dyn{'' if rank == 3 else '_2d'}", reference=decode_qkv_int8dyn_ref,
        op="decode_qkv_int8dyn", dtypes=(torch.float16, torch.bfloat16), inputs=_int8dyn_qkv_inputs, trace="inductor",
        trace_case=trace_case, variants=(_int8dyn_qkv_cpu,), tol=EXACT, exclusive=("wq", "wk", "wv"),
        guards=_int8dyn_guards("x", ("wq", "sq"), ("wk", "sk"), ("wv", "sv")),
        fixtures=Fixtures(
            cases=INT8DYN_QKV_CASES[rank], gpu_cases=FP8_QKV_GPU_CASES[rank], inductor_tol=INT8DYN_INDUCTOR_TOL,
            bad_layout=lambda dt, dev: _int8dyn_qkv_inputs((*trace_case[:-3], 24, 16, 8), dt, dev),
            bad_reason="multiple of 16"),
    )


def _int8dyn_gate_up_rule(rank: int, act: str) -> Pattern:
    """torchao's int8 dynamic gate and up of one x with SwiGLU's / GeGLU's product: one launch."""
    trace_case = (2, 1, 16, 32) if rank == 3 else (2, 16, 32)
    name = "gate_up_silu_int8dyn" if act == "silu_mul" else "gate_up_gelu_tanh_int8dyn"
    cpu, folded = _int8dyn_gate_up_forms(act)
    return Pattern(
        f"decode_gemm.{name}{'' if rank == 3 else '_2d'}", reference=decode_gate_up_int8dyn_ref,
        op="decode_gate_up_int8dyn", static={"act": act}, dtypes=(torch.float16, torch.bfloat16),
        inputs=_int8dyn_gate_up_inputs, trace="inductor", trace_case=trace_case, variants=cpu, graph_forms=folded,
        guards=(*_int8dyn_guards("x", ("wg", "sg"), ("wu", "su")), one_n("wg", "wu")),
        fixtures=Fixtures(
            cases=INT8DYN_CASES[rank], gpu_cases=W8_GPU_CASES[rank], inductor_tol=INT8DYN_INDUCTOR_TOL,
            bad_layout=lambda dt, dev: _int8dyn_gate_up_inputs((*trace_case[:-2], 24, 8), dt, dev),
            bad_reason="multiple of 16"),
    )


def _fp8_weight(n: int, k: int, dev) -> tuple[Tensor, Tensor]:
    """An e4m3 [n, k] weight spread over e4m3's range as torchao's are (clamped: past 464 the cast gives NaN), and
    its float32 [n, 1] scales."""
    w = (torch.randn(n, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    return w, torch.rand(n, 1, device=dev) * 0.01 / k ** 0.5 + 1e-4


def _fp8_inputs(case, dt, dev):
    *rows, k, n = case
    return rand((*rows, k), dt, dev), *_fp8_weight(n, k, dev)


def _fp8_rule(rank: int) -> Pattern:
    """torchao's float8 dynamic per-row linear of a decode step: x's quantization inside the fp8 GEMM's op. The trace
    case's K and N are multiples of 16: aten._scaled_mm (a graph form) refuses others on CUDA."""
    trace_case = (2, 1, 16, 32) if rank == 3 else (2, 16, 32)
    return Pattern(
        f"decode_gemm.linear_fp8{'' if rank == 3 else '_2d'}", reference=decode_linear_fp8_ref,
        op="decode_linear_fp8", dtypes=(torch.float16, torch.bfloat16), inputs=_fp8_inputs, trace="inductor",
        trace_case=trace_case,
        graph_forms=(_fp8_scaled_mm, _fp8_scaled_mm_unsqueezed, _fp8_scaled_mm_precise, _fp8_scaled_mm_precise_unsqueezed),
        guards=(weight8_operands("x", "w", "w_scale", torch.float8_e4m3fn), few_rows("x", "linear_fp8"),
                wide_fp8_one_row("x", "w")),
        fixtures=Fixtures(
            cases=W8_CASES[rank], gpu_cases=W8_GPU_CASES[rank],
            bad_layout=lambda dt, dev: _fp8_inputs((*trace_case[:-2], 24, 8), dt, dev), bad_reason="multiple of 16"),
    )


def _fp8_qkv_inputs(case, dt, dev):
    *rows, k, nq, nkv = case
    return rand((*rows, k), dt, dev), *_fp8_weight(nq, k, dev), *_fp8_weight(nkv, k, dev), *_fp8_weight(nkv, k, dev)


def _fp8_gate_up_inputs(case, dt, dev):
    *rows, k, n = case
    return rand((*rows, k), dt, dev), *_fp8_weight(n, k, dev), *_fp8_weight(n, k, dev)


FP8_QKV_GPU_CASES = {3: ((8, 1, 2048, 2048, 512), (1, 1, 1536, 1536, 256), (3, 1, 80, 200, 8), (40, 1, 272, 136, 24)),
                     2: ((4, 2048, 2048, 512), (1, 1536, 1536, 256), (17, 1040, 24, 8), (64, 64, 8, 16))}


def _fp8_qkv_rule(rank: int) -> Pattern:
    """torchao's float8 dynamic per-row q, k and v of one x: three linears, one launch, x quantized once. Before the
    one-weight rule in the table (its entries are tried first where both anchor)."""
    trace_case = (2, 1, 16, 32, 16) if rank == 3 else (2, 16, 32, 16)
    return Pattern(
        f"decode_gemm.qkv_fp8{'' if rank == 3 else '_2d'}", reference=decode_qkv_fp8_ref, op="decode_qkv_fp8",
        dtypes=(torch.float16, torch.bfloat16), inputs=_fp8_qkv_inputs, trace="inductor", trace_case=trace_case,
        graph_forms=_fp8_multi_forms(None), exclusive=("wq", "wk", "wv"),
        guards=(*(weight8_operands("x", w, s, torch.float8_e4m3fn) for w, s in (("wq", "sq"), ("wk", "sk"), ("wv", "sv"))),
                few_rows("x", "linear_fp8"), wide_fp8_one_row("x", "wq")),
        fixtures=Fixtures(
            cases=((1, 1, 32, 48, 16), (2, 3, 16, 32, 16)) if rank == 3 else ((5, 32, 48, 16), (3, 16, 32, 16)),
            gpu_cases=FP8_QKV_GPU_CASES[rank],
            bad_layout=lambda dt, dev: _fp8_qkv_inputs((*trace_case[:-3], 24, 16, 8), dt, dev),
            bad_reason="multiple of 16"),
    )


def _fp8_gate_up_rule(rank: int, act: str) -> Pattern:
    """torchao's float8 dynamic per-row gate and up of one x with SwiGLU's / GeGLU's product: one launch."""
    trace_case = (2, 1, 16, 32) if rank == 3 else (2, 16, 32)
    name = "gate_up_silu_fp8" if act == "silu_mul" else "gate_up_gelu_tanh_fp8"
    return Pattern(
        f"decode_gemm.{name}{'' if rank == 3 else '_2d'}", reference=decode_gate_up_fp8_ref, op="decode_gate_up_fp8",
        static={"act": act}, dtypes=(torch.float16, torch.bfloat16), inputs=_fp8_gate_up_inputs, trace="inductor",
        trace_case=trace_case, graph_forms=_fp8_multi_forms(act),
        guards=(weight8_operands("x", "wg", "sg", torch.float8_e4m3fn),
                weight8_operands("x", "wu", "su", torch.float8_e4m3fn), one_n("wg", "wu"),
                few_rows("x", "linear_fp8"), wide_fp8_one_row("x", "wg")),
        fixtures=Fixtures(
            cases=W8_CASES[rank], gpu_cases=W8_GPU_CASES[rank],
            bad_layout=lambda dt, dev: _fp8_gate_up_inputs((*trace_case[:-2], 24, 8), dt, dev),
            bad_reason="multiple of 16"),
    )


# A linear's bias and GELU (GPT-NeoX, Falcon, Phi-2, GPT-J MLPs' up projection; gelu_new as the tanh form): matched
# before the matmul epilogues (patterns/__init__.py), which take the same chain at any row count; here only a decode
# step's few rows (few_rows), where the pass over the weight is the cost.
EPILOGUES = [_rule(f"linear_bias_{act}", False, rank, act=act, bias=True)
             for act in ("gelu", "gelu_tanh") for rank in (3, 2)]

PATTERNS = [  # the RMSNorm before q/k/v or gate/up inside their launch (opt-in), before the rules of those alone
            _rms_gate_up_rule(), _rms_qkv_rule(True), _rms_qkv_rule(False),
            _rule("gate_up_silu", True, 3), _rule("gate_up_silu", True, 2),
            # GeGLU's gate and up (Gemma: gelu_pytorch_tanh), the same kernel with its tanh-GELU epilogue
            _rule("gate_up_gelu_tanh", True, 3, act="gelu_tanh_mul"),
            _rule("gate_up_gelu_tanh", True, 2, act="gelu_tanh_mul"),
            # gate and up as one linear, then chunk (Phi-3's gate_up_proj): the op reads the weight's two halves
            _rule("gate_up_silu_halves", True, 3, halves=True), _rule("gate_up_silu_halves", True, 2, halves=True),
            _qkv_rule(3, True), _qkv_rule(2, True),
            _qkv_rule(3, False), _qkv_rule(2, False),
            # a linear's bias (GPT-NeoX's query_key_value and dense layers) before the plain linear, its suffix
            _rule("linear_bias", False, 3, act="none", bias=True), _rule("linear_bias", False, 2, act="none", bias=True),
            # the residual add after the o or down projection in its epilogue (opt-in; the RMSNorm rules above then
            # read the sum it writes: the add + RMSNorm kernel between the layers' linears is gone)
            _rule("linear_residual", False, 3, residual=True),
            # float8 weight-only (torchao's Float8WeightOnlyConfig): the weight's dequantization feeds the mm
            _fp8_weight_rule(3), _fp8_weight_rule(2),
            # int8 weight-only (torchao's Int8WeightOnlyConfig): Inductor's bf16 form is aten._weight_int8pack_mm
            # where its woq_int8 lowering fires; where it does not, the mm of the widened weight, which the plain
            # linear below would take without the scales
            _w8_rule(3), _w8_rule(2),
            _rule("linear", False, 3), _rule("linear", False, 2),
            # int8 dynamic activation + int8 weight (torchao's Int8DynamicActivationInt8WeightConfig): x's
            # quantization, aten._int_mm and the scales' epilogue; gate/up and q/k/v of one x before the one-weight
            # linear; then the one-weight linear after x's quantization (Inductor's), where those do not fire
            _int8dyn_gate_up_rule(3, "silu_mul"), _int8dyn_gate_up_rule(2, "silu_mul"),
            _int8dyn_gate_up_rule(3, "gelu_tanh_mul"), _int8dyn_gate_up_rule(2, "gelu_tanh_mul"),
            _int8dyn_qkv_rule(3), _int8dyn_qkv_rule(2), _int8dyn_rule(3), _int8dyn_rule(2),
            *[_w8a8_rule(rank, out) for out in (torch.bfloat16, torch.float16) for rank in (3, 2)],
            *[_w8a8_rule(rank, out, tiled=True) for out in (torch.bfloat16, torch.float16) for rank in (3, 2)],
            # float8 dynamic per-row (torchao's Float8DynamicActivationFloat8WeightConfig(PerRow)): aten._scaled_mm;
            # gate/up and q/k/v of one x before the one-weight linear
            _fp8_gate_up_rule(3, "silu_mul"), _fp8_gate_up_rule(2, "silu_mul"),
            _fp8_gate_up_rule(3, "gelu_tanh_mul"), _fp8_gate_up_rule(2, "gelu_tanh_mul"),
            _fp8_qkv_rule(3), _fp8_qkv_rule(2), _fp8_rule(3), _fp8_rule(2)]
