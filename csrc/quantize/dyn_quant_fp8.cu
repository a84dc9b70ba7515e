// fusekit::dyn_quant_fp8 -- dynamic per-token FP8 e4m3 in one pass over x.
//
//   def dyn_quant_fp8_ref(x: Tensor, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
//       xf = x.float()
//       s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 448.0
//       return (xf / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s
//
// Contract: x [..., K] CUDA, contiguous, float32/float16/bfloat16; returns q float8_e4m3fn like x and the
// fp32 scales [..., 1]; saturating, bit-exact with eager CUDA.
#include <cuda_fp8.h>
#include <torch/library.h>

#include <tuple>

#include "quant_round.cuh"  // to_e4m3
#include "rowquant.cuh"

namespace fusekit {
namespace {

struct ToE4M3 {
  using Out = uint8_t;
  static constexpr float kMax = 448.0f;
  __device__ static uint8_t quotient(float t) {
    if (!isnan(t)) t = fminf(fmaxf(t, -448.0f), 448.0f);
    return to_e4m3(t);
  }
  __device__ static uint8_t one(float t) { return to_e4m3(t); }
  // V eager quotients t (finite), four e4m3s to a word
  template <int V>
  __device__ static void pack(const float (&t)[V], uint32_t (&w)[V / 4]) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      w[j / 4] = uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(t[j], t[j + 1]), __NV_SATFINITE, __NV_E4M3)) |
                 uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(t[j + 2], t[j + 3]), __NV_SATFINITE, __NV_E4M3)) << 16;
  }
  // Two elements per conversion (cvt.rn.satfinite.e4m3x2.f32; saturating to +-448 is the pattern's clamp),
  // two pairs to a word; one comparison per word.
  template <int V>
  __device__ static bool bracket(const float (&x)[V], float rlo, float rhi, uint32_t (&w)[V / 4]) {
    bool same = true;
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      uint32_t hi = 0, lo = 0;
#pragma unroll
      for (int k = 0; k < 4; k += 2) {
        hi |= uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(x[j + k] * rhi, x[j + k + 1] * rhi), __NV_SATFINITE,
                                                __NV_E4M3)) << (8 * k);
        lo |= uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(x[j + k] * rlo, x[j + k + 1] * rlo), __NV_SATFINITE,
                                                __NV_E4M3)) << (8 * k);
      }
      same &= hi == lo;
      w[j / 4] = hi;
    }
    return same;
  }
};

std::tuple<at::Tensor, at::Tensor> dyn_quant_fp8_cuda(const at::Tensor& x, double eps) {
  return dyn_quant<ToE4M3>(x, eps, at::kFloat8_e4m3fn);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("dyn_quant_fp8", &fusekit::dyn_quant_fp8_cuda); }
