// fusekit::dyn_quant_i8 -- dynamic per-token INT8 in one pass over x: per-row absmax -> scale -> quantize.
//
//   def dyn_quant_i8_ref(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
//       xf = x.float()
//       s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 127.0
//       return torch.clamp(torch.round(xf / s), -128, 127).to(torch.int8), s
//
// Contract: x [..., K] CUDA, contiguous, float32/float16/bfloat16; returns q int8 like x and the fp32
// scales [..., 1]. Bit-exact with eager CUDA (s = amax * (1/127) as eager's scalar divide does; x / s is
// a true division; round half to even).
#include "rowquant.cuh"

namespace fusekit {
namespace {

// NOTE (exact and fast): eager computes x / s with a true division. x * (1/s) is within 2 ulp of it, so
// it can only round differently next to a .5 boundary; there (rare) the true division is recomputed.
struct ToI8 {
  static constexpr float kMax = 127.0f;
  __device__ int8_t operator()(float x, float s, float r) const {
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: t + kMagic rounds t to an integer, half to even
    float t = x * r;
    if (fabsf(fabsf(t - ((t + kMagic) - kMagic)) - 0.5f) < 1e-4f) t = __fdiv_rn(x, s);  // near a tie
    // |t| <= 127 here, so the rounded integer sits in the low mantissa bits: no conversion instruction
    // (F2I runs at a quarter rate and bounded the fp16 kernel). NaN -> 0, as eager's float -> int8 cast.
    const int v = __float_as_int(t + kMagic) - 0x4b400000;
    return isnan(t) ? int8_t(0) : static_cast<int8_t>(max(-128, min(127, v)));
  }
};

std::tuple<at::Tensor, at::Tensor> dyn_quant_i8_cuda(const at::Tensor& x, double eps) {
  return dyn_quant(x, eps, at::kChar, ToI8{});
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("dyn_quant_i8", &fusekit::dyn_quant_i8_cuda); }
