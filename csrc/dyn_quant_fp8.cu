// fusekit::dyn_quant_fp8 -- dynamic per-token FP8 e4m3 in one pass over x.
//
//   def dyn_quant_fp8_ref(x: Tensor, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
//       xf = x.float()
//       s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 448.0
//       return (xf / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s
//
// Contract: x [..., K] CUDA, contiguous, float32/float16/bfloat16; returns q float8_e4m3fn like x and the
// fp32 scales [..., 1]; saturating, bit-exact with eager CUDA.
#include "rowquant.cuh"

namespace fusekit {
namespace {

// NOTE (exact and fast): x * (1/s) is within 2 ulp of eager's true division x / s; when both ends of a
// 4-ulp window around it round to one e4m3 value, that value is the answer; otherwise divide truly.
struct ToE4M3 {
  static constexpr float kMax = 448.0f;
  __device__ static uint8_t cvt(float t) {
    if (!isnan(t)) t = fminf(fmaxf(t, -448.0f), 448.0f);
    return to_e4m3(t);
  }
  __device__ uint8_t operator()(float x, float s, float r) const {
    const float t = x * r, d = 4.0f * fabsf(t) * 1.1920929e-7f;
    const uint8_t lo = cvt(t - d), hi = cvt(t + d);
    return lo == hi ? lo : cvt(__fdiv_rn(x, s));
  }
};

std::tuple<at::Tensor, at::Tensor> dyn_quant_fp8_cuda(const at::Tensor& x, double eps) {
  return dyn_quant(x, eps, at::kFloat8_e4m3fn, ToE4M3{});
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("dyn_quant_fp8", &fusekit::dyn_quant_fp8_cuda); }
