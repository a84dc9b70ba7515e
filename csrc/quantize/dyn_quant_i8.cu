// fusekit::dyn_quant_i8 -- dynamic per-token INT8 in one pass over x: per-row absmax -> scale -> quantize.
//
//   def dyn_quant_i8_ref(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
//       xf = x.float()
//       s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 127.0
//       return torch.clamp(torch.round(xf / s), -128, 127).to(torch.int8), s
//
// Contract: x [..., K] CUDA, contiguous, float32/float16/bfloat16; returns q int8 like x and the fp32
// scales [..., 1]. Bit-exact with eager CUDA (s = amax * (1/127) as eager's scalar divide does; x / s is
// eager's true division, from 1/s and two FMA corrections or bracketed by two FMAs, see rowquant.cuh;
// round half to even).
#include <torch/library.h>

#include <tuple>

#include "quant_round.cuh"  // kRoundMagic, round_bits, pack_low_bytes, round_to_i8
#include "rowquant.cuh"

namespace fusekit {
namespace {

struct ToI8 {
  using Out = int8_t;
  static constexpr float kMax = 127.0f;
  __device__ static int8_t quotient(float t) { return round_to_i8(t, -128.0f, 127.0f); }
  __device__ static int8_t one(float t) { return static_cast<int8_t>(round_bits(t) & 0xffu); }
  // V eager quotients t (|t| <= kMax * (1 + 2^-22)), four int8s to a word
  template <int V>
  __device__ static void pack(const float (&t)[V], uint32_t (&w)[V / 4]) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      w[j / 4] = pack_low_bytes(round_bits(t[j]), round_bits(t[j + 1]), round_bits(t[j + 2]), round_bits(t[j + 3]));
  }
  // fma(x, r, kRoundMagic) rounds x * r half to even; its low byte is the int8 (|x * r| < 128: no clamp).
  // The whole words compare equal exactly when the int8s do. Bytes packed with PRMT.
  template <int V>
  __device__ static bool bracket(const float (&x)[V], float rlo, float rhi, uint32_t (&w)[V / 4]) {
    uint32_t b[V];
    bool same = true;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      b[j] = __float_as_uint(fmaf(x[j], rhi, kRoundMagic));
      same &= b[j] == __float_as_uint(fmaf(x[j], rlo, kRoundMagic));
    }
#pragma unroll
    for (int j = 0; j < V; j += 4) w[j / 4] = pack_low_bytes(b[j], b[j + 1], b[j + 2], b[j + 3]);
    return same;
  }
};

std::tuple<at::Tensor, at::Tensor> dyn_quant_i8_cuda(const at::Tensor& x, double eps) {
  return dyn_quant<ToI8>(x, eps, at::kChar);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("dyn_quant_i8", &fusekit::dyn_quant_i8_cuda); }
