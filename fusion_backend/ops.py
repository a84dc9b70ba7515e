"""fusekit's op surface: every ``torch.ops.fusekit.*`` schema, its fake (the shape contract), and the
typed Python wrappers.

Schemas and fakes live here, in Python, so the pattern engine can trace replacements and CPU CI can run
everything with no extension. The CPU kernel of each op is the unfused reference function of the
pattern(s) that use it (registered by ``registry.register_cpu_references``); the CUDA kernel is bound
from ``csrc/<family>/<op>.cu`` with ``TORCH_LIBRARY_IMPL(fusekit, CUDA, m)`` when the extension is built.

NOTE (tensor scalars): a float parameter ``s`` comes with a keyword-only companion ``Tensor? s_t`` (except
the pattern's ``literals``, such as an eps, which must be Python numbers). After
a recompile Dynamo turns a Python float into a 0-dim tensor graph input; the replacement then passes
that tensor as ``s_t`` (and ``s`` is ignored). A 0-dim tensor the user passed is handled the same way.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

LIB = torch.library.Library("fusekit", "DEF")
HALF = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op: its schema and what its kernels take."""

    schema: str
    # The kernels read strided inputs: no contiguous copies forced before the op. Otherwise the op is tagged
    # needs_contiguous_strides (Inductor hands it contiguous inputs, copying if needed; the rules' guards keep it
    # from firing where that copy would cost more than the fusion saves).
    any_strides: bool = False
    out_like_first: bool = False  # the output takes the layout of the first input (the fake's empty_like)
    cuda_dtypes: tuple[torch.dtype, ...] | None = None  # where the CUDA kernel takes fewer dtypes than the rules


OPS = {
    # elementwise
    "add_mul_exp": OpSpec("add_mul_exp(Tensor x, Tensor y, float c, *, Tensor? c_t=None) -> Tensor"),
    "mul_add": OpSpec("mul_add(Tensor q, Tensor k, Tensor v) -> Tensor"),
    "gelu": OpSpec("gelu(Tensor x, str approximate) -> Tensor"),
    "bias_gelu": OpSpec("bias_gelu(Tensor x, Tensor bias, str approximate) -> Tensor"),
    "silu_mul": OpSpec("silu_mul(Tensor g, Tensor u) -> Tensor"),
    "gelu_mul": OpSpec("gelu_mul(Tensor g, Tensor u, str approximate) -> Tensor"),
    "bias_relu": OpSpec("bias_relu(Tensor x, Tensor bias) -> Tensor"),
    "scale_residual_add": OpSpec(
        "scale_residual_add(Tensor x, Tensor residual, float scale, *, Tensor? scale_t=None) -> Tensor"),
    # quantize
    "quant_i8": OpSpec("quant_i8(Tensor x, float scale, float zp, int qmin, int qmax, *, "
                       "Tensor? scale_t=None, Tensor? zp_t=None) -> Tensor"),
    "quant_i8_channel": OpSpec("quant_i8_channel(Tensor x, Tensor scale, Tensor zp, int qmin, int qmax) -> Tensor"),
    "dequant_i8": OpSpec("dequant_i8(Tensor q, float scale, float zp, ScalarType dtype, *, Tensor? scale_t=None, "
                         "Tensor? zp_t=None) -> Tensor"),
    "dyn_quant_i8": OpSpec("dyn_quant_i8(Tensor x, float eps) -> (Tensor, Tensor)"),
    "quant_fp8": OpSpec("quant_fp8(Tensor x, float scale, *, Tensor? scale_t=None) -> Tensor"),
    "dyn_quant_fp8": OpSpec("dyn_quant_fp8(Tensor x, float eps) -> (Tensor, Tensor)"),
    # silu(gate) * up quantized per row as torchao's float8 dynamic per-row config does (scale max|h| / 448 rounded to
    # the dtype): the e4m3 rows and their float32 scales [..., 1]
    "silu_mul_fp8_rows": OpSpec("silu_mul_fp8_rows(Tensor gate, Tensor up) -> (Tensor, Tensor)", cuda_dtypes=HALF),
    # tensor-core GEMM + epilogue: (act(matmul(a, b) * scale + bias) + residual).to(out_dtype); linear: b is
    # [.., N, K]; act in none/gelu/gelu_tanh/relu/silu; out_dtype None (a's dtype) or float32
    "matmul_epilogue": OpSpec(
        "matmul_epilogue(Tensor a, Tensor b, Tensor? bias, Tensor? residual, float? scale, str act, "
        "bool linear, ScalarType? out_dtype=None, *, Tensor? scale_t=None) -> Tensor", any_strides=True),
    # attention: softmax(q @ k^T * scale + mask) @ v; safe=True zeroes fully masked rows (SDPA's math
    # backend), safe=False leaves them NaN (a plain softmax)
    "attention": OpSpec("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool safe) -> Tensor",
                        any_strides=True, out_like_first=True),
    # attention of a few query rows against a KV cache of grouped heads: q [B,Hq,Lq,D], k/v [B,Hkv,S,D]
    "decode_attention": OpSpec("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor",
                               any_strides=True, out_like_first=True, cuda_dtypes=HALF),
    # the same with soft-capped scores (Gemma-2): softcap * tanh(q @ k^T * scale / softcap) + mask
    "decode_attention_softcap": OpSpec("decode_attention_softcap(Tensor q, Tensor k, Tensor v, Tensor? mask, "
                                       "float scale, float softcap) -> Tensor",
                                       any_strides=True, out_like_first=True, cuda_dtypes=HALF),
    # the same attention for many query rows (a prompt): grouped KV heads read as they are, no repeat_kv copy
    "gqa_attention": OpSpec("gqa_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor",
                            any_strides=True, out_like_first=True, cuda_dtypes=HALF),
    # the linears of a few rows: x [..., K] @ w[N, K]^T; act "silu_mul": silu(x w^T) * (x w2^T); "gelu_tanh_mul":
    # gelu_tanh(x w^T) * (x w2^T); "silu_mul_halves": w [2N, K] holds gate then up rows, silu(x w[:N]^T) * (x w[N:]^T);
    # "none", "gelu", "gelu_tanh": act(x w^T + b), b None or [N]; r None or a residual added to the result
    "decode_linear": OpSpec("decode_linear(Tensor x, Tensor w, Tensor? w2, str act, Tensor? b=None, "
                            "Tensor? r=None) -> Tensor", cuda_dtypes=HALF),
    # q, k and v of one input in one launch: x [..., K] @ wq/wk/wv[N*, K]^T (+ bq/bk/bv [N*])
    "decode_qkv": OpSpec("decode_qkv(Tensor x, Tensor wq, Tensor wk, Tensor wv, Tensor? bq=None, Tensor? bk=None, "
                         "Tensor? bv=None) -> (Tensor, Tensor, Tensor)", cuda_dtypes=HALF),
    # the same two of transformers' RMSNorm of h [..., K] (weight norm_w [K], eps): the norm inside the launch
    "decode_rms_linear": OpSpec("decode_rms_linear(Tensor h, Tensor norm_w, Tensor w, Tensor? w2, str act, "
                                "Tensor? b, float eps) -> Tensor", cuda_dtypes=HALF),
    "decode_rms_qkv": OpSpec("decode_rms_qkv(Tensor h, Tensor norm_w, Tensor wq, Tensor wk, Tensor wv, Tensor? bq, "
                             "Tensor? bk, Tensor? bv, float eps) -> (Tensor, Tensor, Tensor)", cuda_dtypes=HALF),
    # an int8 weight-only linear (w8a16) of a few rows: x [..., K] @ w.to(x.dtype)[N, K]^T * scales [N], rounded once
    # (aten._weight_int8pack_mm's contract; torchao's Int8WeightOnlyConfig)
    "decode_linear_w8": OpSpec("decode_linear_w8(Tensor x, Tensor w, Tensor scales) -> Tensor", cuda_dtypes=HALF),
    # a float8 (e4m3) weight-only linear of a few rows: x [..., K] @ (w.float() * w_scale).to(x.dtype)[N, K]^T, w_scale
    # N float32 ([N] or [N, 1]) (torchao's Float8WeightOnlyConfig)
    "decode_linear_fp8_weight": OpSpec("decode_linear_fp8_weight(Tensor x, Tensor w, Tensor w_scale) -> Tensor",
                                       cuda_dtypes=HALF),
    # int8 x (its float32 row scales xs) against an int8 weight (float32 scales ws): ((xq @ w.T) * xs).to(dtype) * ws,
    # rounded to dtype (float16 or bfloat16), or stored as out_dtype float32 unrounded
    "decode_linear_w8a8": OpSpec("decode_linear_w8a8(Tensor xq, Tensor xs, Tensor w, Tensor ws, ScalarType dtype, "
                                 "ScalarType? out_dtype=None) -> Tensor"),
    # the same linear at many rows (prefill): a tiled tensor-core GEMM (CUTLASS, sm_90a), both scales in its epilogue
    "linear_w8a8": OpSpec("linear_w8a8(Tensor xq, Tensor xs, Tensor w, Tensor ws, ScalarType dtype, "
                          "ScalarType? out_dtype=None) -> Tensor"),
    # a float8 dynamic per-row linear of a few rows, x's quantization included: x [..., K] quantized per row to e4m3
    # (scale max|x| / 448), @ w[N, K]^T (e4m3), times both scales (w_scale [N, 1] float32); torchao's
    # Float8DynamicActivationFloat8WeightConfig(PerRow) as aten._scaled_mm computes it
    "decode_linear_fp8": OpSpec("decode_linear_fp8(Tensor x, Tensor w, Tensor w_scale) -> Tensor", cuda_dtypes=HALF),
    # q, k and v as float8 dynamic per-row linears of one x (decode_linear_fp8 of each weight, x quantized once)
    "decode_qkv_fp8": OpSpec("decode_qkv_fp8(Tensor x, Tensor wq, Tensor sq, Tensor wk, Tensor sk, Tensor wv, "
                             "Tensor sv) -> (Tensor, Tensor, Tensor)", cuda_dtypes=HALF),
    # gate and up as float8 dynamic per-row linears of one x, then act(gate) * up; act "silu_mul" or "gelu_tanh_mul"
    "decode_gate_up_fp8": OpSpec("decode_gate_up_fp8(Tensor x, Tensor wg, Tensor sg, Tensor wu, Tensor su, str act) "
                                 "-> Tensor", cuda_dtypes=HALF),
    # torchao's int8 dynamic per-row linears (Int8DynamicActivationInt8WeightConfig), x's quantization included: x
    # [..., K] to int8 per row (scale max|x| / 127.5 in x's dtype, floored at 2**-23; round(x * (1 / s))), the int32
    # products times s rounded to x's dtype, times w_scale [N, 1] float32, rounded again; q/k/v and gate/up as fp8's
    "decode_linear_int8dyn": OpSpec("decode_linear_int8dyn(Tensor x, Tensor w, Tensor w_scale) -> Tensor",
                                    cuda_dtypes=HALF),
    "decode_qkv_int8dyn": OpSpec("decode_qkv_int8dyn(Tensor x, Tensor wq, Tensor sq, Tensor wk, Tensor sk, Tensor wv, "
                                 "Tensor sv) -> (Tensor, Tensor, Tensor)", cuda_dtypes=HALF),
    "decode_gate_up_int8dyn": OpSpec("decode_gate_up_int8dyn(Tensor x, Tensor wg, Tensor sg, Tensor wu, Tensor su, "
                                     "str act) -> Tensor", cuda_dtypes=HALF),
    # verification (options={"verify": True}): returns copies of `outs` after checking them once
    "verify": OpSpec("verify(Tensor[] outs, Tensor?[] tensors, float[] floats, str pattern, str site) -> Tensor[]"),
}
for _name, _spec in OPS.items():
    LIB.define(_spec.schema, tags=() if _spec.any_strides else (torch.Tag.needs_contiguous_strides,))


def cuda_kernel_takes(op: str, dtype: torch.dtype) -> bool:
    """Whether fusekit::op's CUDA kernel takes `dtype` (its rules may take more: they also run on CPU)."""
    dts = OPS[op].cuda_dtypes
    return dts is None or dtype in dts


def _same(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _broadcast(*ts: Tensor) -> Tensor:
    shape = torch.broadcast_shapes(*(t.shape for t in ts))
    return ts[0].new_empty(shape)


# ---- fakes: the shape and dtype contract of each op ------------------------------------------------
@torch.library.register_fake("fusekit::add_mul_exp")
def _(x, y, c, *, c_t=None):
    torch._check(x.dtype == y.dtype, lambda: f"add_mul_exp: dtypes differ ({x.dtype}, {y.dtype})")
    return _broadcast(x, y)


@torch.library.register_fake("fusekit::mul_add")
def _(q, k, v):
    torch._check(q.dtype == k.dtype == v.dtype, lambda: "mul_add: q, k, v must share a dtype")
    return _broadcast(q, k, v)


@torch.library.register_fake("fusekit::gelu")
def _(x, approximate):
    return _same(x)


@torch.library.register_fake("fusekit::bias_gelu")
def _(x, bias, approximate):
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"bias_gelu: bias {tuple(bias.shape)} must be [x.shape[-1]={x.shape[-1]}]")
    return _same(x)


@torch.library.register_fake("fusekit::silu_mul")
def _(g, u):
    torch._check(g.shape == u.shape, lambda: "silu_mul: g and u must have one shape")
    return _same(g)


@torch.library.register_fake("fusekit::gelu_mul")
def _(g, u, approximate):
    torch._check(g.shape == u.shape, lambda: "gelu_mul: g and u must have one shape")
    return _same(g)


@torch.library.register_fake("fusekit::bias_relu")
def _(x, bias):
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"bias_relu: bias {tuple(bias.shape)} must be [x.shape[-1]={x.shape[-1]}]")
    return _same(x)


@torch.library.register_fake("fusekit::scale_residual_add")
def _(x, residual, scale, *, scale_t=None):
    torch._check(x.shape == residual.shape, lambda: "scale_residual_add: x and residual shapes differ")
    return _same(x)


@torch.library.register_fake("fusekit::quant_i8_channel")
def _(x, scale, zp, qmin, qmax):
    torch._check(x.dim() == 2, lambda: "quant_i8_channel: x must be [M, N]")
    return torch.empty_like(x, dtype=torch.int8, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusekit::dequant_i8")
def _(q, scale, zp, dtype, *, scale_t=None, zp_t=None):
    torch._check(q.dtype == torch.int8, lambda: f"dequant_i8: q must be int8, got {q.dtype}")
    return torch.empty_like(q, dtype=dtype, memory_format=torch.contiguous_format)


def _rowwise(x, qdtype):
    q = torch.empty_like(x, dtype=qdtype, memory_format=torch.contiguous_format)
    return q, x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.register_fake("fusekit::dyn_quant_i8")
def _(x, eps):
    return _rowwise(x, torch.int8)


@torch.library.register_fake("fusekit::quant_fp8")
def _(x, scale, *, scale_t=None):
    return torch.empty_like(x, dtype=torch.float8_e4m3fn, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusekit::dyn_quant_fp8")
def _(x, eps):
    return _rowwise(x, torch.float8_e4m3fn)


@torch.library.register_fake("fusekit::silu_mul_fp8_rows")
def _(gate, up):
    return _rowwise(gate, torch.float8_e4m3fn)


@torch.library.register_fake("fusekit::quant_i8")
def _(x, scale, zp, qmin, qmax, *, scale_t=None, zp_t=None):
    torch._check(-128 <= qmin <= qmax <= 127, lambda: "quant_i8: need -128 <= qmin <= qmax <= 127")
    return torch.empty_like(x, dtype=torch.int8, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusekit::matmul_epilogue")
def _(a, b, bias, residual, scale, act, linear, out_dtype=None, *, scale_t=None):
    bt = b.transpose(-1, -2) if linear else b
    torch._check(a.shape[-1] == bt.shape[-2] and (bt.dim() == 2 or (a.dim() == bt.dim() and
                                                                     tuple(a.shape[:-2]) == tuple(bt.shape[:-2]))),
                 lambda: f"matmul_epilogue: bad shapes {tuple(a.shape)} @ {tuple(bt.shape)}")
    torch._check(out_dtype in (None, a.dtype, torch.float32),
                 lambda: f"matmul_epilogue: out_dtype must be None, a's dtype or float32, got {out_dtype}")
    return a.new_empty((*a.shape[:-1], bt.shape[-1]), dtype=out_dtype or a.dtype)  # contiguous


@torch.library.register_fake("fusekit::attention")
def _(q, k, v, mask, scale, safe):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                 lambda: f"attention: q, k, v must be 4-D, got {q.dim()}, {k.dim()}, {v.dim()}")
    torch._check(q.shape[-1] == v.shape[-1], lambda: "attention: q and v head dims differ")
    # q's layout (a head-transposed q gives a head-transposed output, which the model's
    # transpose + reshape back to [B, S, H*D] then reads as a view)
    return torch.empty_like(q)


def _cache_attention_fake(name: str):
    def fake(q, k, v, mask, scale, softcap=None):
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                     lambda: f"{name}: q, k, v must be 4-D, got {q.dim()}, {k.dim()}, {v.dim()}")
        torch._check(q.shape[-1] == v.shape[-1] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0,
                     lambda: f"{name}: want q [B,Hq,Lq,D], k/v [B,Hkv,S,D], Hq % Hkv == 0; got "
                             f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        return torch.empty_like(q)  # q's layout, as for attention
    return fake


torch.library.register_fake("fusekit::decode_attention")(_cache_attention_fake("decode_attention"))
torch.library.register_fake("fusekit::decode_attention_softcap")(_cache_attention_fake("decode_attention_softcap"))
torch.library.register_fake("fusekit::gqa_attention")(_cache_attention_fake("gqa_attention"))


# Not in OPS (the table's ops are functional; this one mutates its cache): a full sliding window's step, put in by
# kv_cache.py's rewrite.
LIB.define("window_roll(Tensor(a!) cache, Tensor new) -> ()")


@torch.library.register_fake("fusekit::window_roll")
def _window_roll_fake(cache: Tensor, new: Tensor) -> None:
    return None


def window_roll_ref(cache: Tensor, new: Tensor) -> None:
    """cache [B, H, W, D] one slot to the left, new [B, H, 1, D] in its last slot (in place)."""
    cache.copy_(torch.cat([cache[:, :, 1:], new.to(cache.dtype)], dim=2))


torch.library.impl("fusekit::window_roll", "CPU")(window_roll_ref)


# Not in OPS (the table's ops are functional): the decode attention rules' rolling form (Pattern.rolling_op), either
# attention above over a full sliding window that it first moves one slot to the left in place (k and v change; new_k,
# new_v [B,Hkv,1,D] into their last slots; softcap 0: none), put in by kv_cache.py's rewrite, as window_roll is.
LIB.define("decode_attention_roll(Tensor q, Tensor(a!) k, Tensor(b!) v, Tensor new_k, Tensor new_v, Tensor? mask, "
           "float scale, float softcap=0.0) -> Tensor")


@torch.library.register_fake("fusekit::decode_attention_roll")
def _decode_attention_roll_fake(q, k, v, new_k, new_v, mask, scale, softcap=0.0):
    return _cache_attention_fake("decode_attention_roll")(q, k, v, mask, scale)


@torch.library.register_fake("fusekit::decode_linear")
def _decode_linear_fake(x, w, w2, act, b=None, r=None):
    torch._check(w.dim() == 2 and x.shape[-1] == w.shape[1],
                 lambda: f"decode_linear: want x [..., K], w [N, K]; got {tuple(x.shape)}, {tuple(w.shape)}")
    torch._check((act in ("silu_mul", "gelu_tanh_mul")) == (w2 is not None)
                 and act in ("none", "silu_mul", "gelu_tanh_mul", "silu_mul_halves", "gelu", "gelu_tanh"),
                 lambda: f"decode_linear: act {act!r} with w2 {'given' if w2 is not None else 'None'}")
    torch._check(b is None or (act in ("none", "gelu", "gelu_tanh") and tuple(b.shape) == (w.shape[0],)),
                 lambda: f"decode_linear: a bias [N] with act none, gelu or gelu_tanh only; got act {act!r}, "
                         f"w {tuple(w.shape)}, b {tuple(b.shape)}")
    halves = act == "silu_mul_halves"
    torch._check(not halves or w.shape[0] % 2 == 0, lambda: f"decode_linear: {act} needs an even N, got {w.shape[0]}")
    out = x.new_empty((*x.shape[:-1], w.shape[0] // 2 if halves else w.shape[0]))  # contiguous
    torch._check(r is None or tuple(r.shape) == tuple(out.shape),
                 lambda: f"decode_linear: the residual must be shaped as the output {tuple(out.shape)}, got "
                         f"{tuple(r.shape)}")
    return out


def _norm_check(op, h, norm_w):
    torch._check(norm_w.dim() == 1 and norm_w.shape[0] == h.shape[-1],
                 lambda: f"{op}: want norm_w [K] of h [..., K]; got {tuple(norm_w.shape)}, {tuple(h.shape)}")


@torch.library.register_fake("fusekit::decode_rms_linear")
def _(h, norm_w, w, w2, act, b, eps):
    _norm_check("decode_rms_linear", h, norm_w)
    return _decode_linear_fake(h, w, w2, act, b)


@torch.library.register_fake("fusekit::decode_rms_qkv")
def _(h, norm_w, wq, wk, wv, bq, bk, bv, eps):
    _norm_check("decode_rms_qkv", h, norm_w)
    return _decode_qkv_fake(h, wq, wk, wv, bq, bk, bv)


@torch.library.register_fake("fusekit::decode_qkv")
def _decode_qkv_fake(x, wq, wk, wv, bq=None, bk=None, bv=None):
    for w, b in ((wq, bq), (wk, bk), (wv, bv)):
        torch._check(w.dim() == 2 and x.shape[-1] == w.shape[1] and (b is None or tuple(b.shape) == (w.shape[0],)),
                     lambda: f"decode_qkv: want x [..., K], w [N, K], b None or [N]; got {tuple(x.shape)}, "
                             f"{tuple(w.shape)}, {None if b is None else tuple(b.shape)}")
    return tuple(x.new_empty((*x.shape[:-1], w.shape[0])) for w in (wq, wk, wv))  # contiguous


@torch.library.register_fake("fusekit::decode_linear_w8a8")
@torch.library.register_fake("fusekit::linear_w8a8")
def _(xq, xs, w, ws, dtype, out_dtype=None):
    torch._check(xq.dtype == torch.int8 and w.dtype == torch.int8 and w.dim() == 2 and xq.shape[-1] == w.shape[1],
                 lambda: f"(decode_)linear_w8a8: want xq int8 [..., K], w int8 [N, K]; got {xq.dtype} "
                         f"{tuple(xq.shape)}, {w.dtype} {tuple(w.shape)}")
    torch._check(xs.dtype == torch.float32 and ws.dtype == torch.float32 and ws.numel() == w.shape[0],
                 lambda: f"(decode_)linear_w8a8: want float32 scales xs [..., 1], ws [N]; got {xs.dtype} "
                         f"{tuple(xs.shape)}, {ws.dtype} {tuple(ws.shape)}")
    torch._check(dtype in (torch.float16, torch.bfloat16) and out_dtype in (None, dtype, torch.float32),
                 lambda: f"(decode_)linear_w8a8: dtype {dtype}, out_dtype {out_dtype}")
    return xq.new_empty((*xq.shape[:-1], w.shape[0]), dtype=out_dtype or dtype)  # contiguous


@torch.library.register_fake("fusekit::decode_linear_w8")
def _(x, w, scales):
    torch._check(w.dim() == 2 and x.shape[-1] == w.shape[1] and w.dtype == torch.int8,
                 lambda: f"decode_linear_w8: want x [..., K], w int8 [N, K]; got {tuple(x.shape)}, {w.dtype} "
                         f"{tuple(w.shape)}")
    torch._check(tuple(scales.shape) == (w.shape[0],) and scales.dtype == x.dtype,
                 lambda: f"decode_linear_w8: scales must be [N] of x's dtype; got {scales.dtype} {tuple(scales.shape)}")
    return x.new_empty((*x.shape[:-1], w.shape[0]))  # contiguous


@torch.library.register_fake("fusekit::decode_linear_fp8_weight")
def _(x, w, w_scale):
    _weight8_fake("decode_linear_fp8_weight", x, w, w_scale, torch.float8_e4m3fn)
    return x.new_empty((*x.shape[:-1], w.shape[0]))  # contiguous


def _weight8_fake(op: str, x: Tensor, w: Tensor, s: Tensor, wdtype: torch.dtype) -> None:
    torch._check(w.dim() == 2 and x.shape[-1] == w.shape[1] and w.dtype == wdtype,
                 lambda: f"{op}: want x [..., K], w {wdtype} [N, K]; got {tuple(x.shape)}, {w.dtype} {tuple(w.shape)}")
    torch._check(s.numel() == w.shape[0] and s.dtype == torch.float32,
                 lambda: f"{op}: a weight's scales must be N float32; got {s.dtype} {tuple(s.shape)}")


def _register_8bit_fakes(suffix: str, wdtype: torch.dtype) -> None:
    """The fakes of decode_linear_<suffix>, decode_qkv_<suffix> and decode_gate_up_<suffix> (fp8, int8dyn)."""
    @torch.library.register_fake(f"fusekit::decode_linear_{suffix}")
    def _(x, w, w_scale):
        _weight8_fake(f"decode_linear_{suffix}", x, w, w_scale, wdtype)
        return x.new_empty((*x.shape[:-1], w.shape[0]))  # contiguous

    @torch.library.register_fake(f"fusekit::decode_qkv_{suffix}")
    def _(x, wq, sq, wk, sk, wv, sv):
        for w, s in ((wq, sq), (wk, sk), (wv, sv)):
            _weight8_fake(f"decode_qkv_{suffix}", x, w, s, wdtype)
        return tuple(x.new_empty((*x.shape[:-1], w.shape[0])) for w in (wq, wk, wv))  # contiguous

    @torch.library.register_fake(f"fusekit::decode_gate_up_{suffix}")
    def _(x, wg, sg, wu, su, act):
        for w, s in ((wg, sg), (wu, su)):
            _weight8_fake(f"decode_gate_up_{suffix}", x, w, s, wdtype)
        torch._check(wg.shape[0] == wu.shape[0], lambda: f"decode_gate_up_{suffix}: wg and wu must have one N; got "
                                                         f"{tuple(wg.shape)}, {tuple(wu.shape)}")
        torch._check(act in ("silu_mul", "gelu_tanh_mul"), lambda: f"decode_gate_up_{suffix}: act {act!r}")
        return x.new_empty((*x.shape[:-1], wg.shape[0]))  # contiguous


_register_8bit_fakes("fp8", torch.float8_e4m3fn)
_register_8bit_fakes("int8dyn", torch.int8)


@torch.library.register_fake("fusekit::verify")
def _(outs, tensors, floats, pattern, site):
    return [torch.empty_like(o) for o in outs]


# ---- typed wrappers ----------------------------------------------------------------------------
def add_mul_exp(x: Tensor, y: Tensor, c: float | Tensor) -> Tensor:
    """``exp((x + y) * c)`` in one pass. Returns a tensor of x's dtype."""
    if isinstance(c, Tensor):
        return torch.ops.fusekit.add_mul_exp(x, y, 0.0, c_t=c)
    return torch.ops.fusekit.add_mul_exp(x, y, float(c))


def mul_add(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``q * k + v`` in one pass."""
    return torch.ops.fusekit.mul_add(q, k, v)


def quant_i8(x: Tensor, scale: float, zp: float = 0.0, qmin: int = -128, qmax: int = 127) -> Tensor:
    """Static per-tensor INT8: ``clamp(round(x / scale + zp), qmin, qmax).to(int8)``, rounding half to
    even exactly as eager PyTorch does."""
    return torch.ops.fusekit.quant_i8(x, float(scale), float(zp), int(qmin), int(qmax))


__all__ = ["OPS", "OpSpec", "cuda_kernel_takes", "add_mul_exp", "mul_add", "quant_i8"]
