// Float math of fusekit's kernels that needs neither torch nor CUTLASS, so that the GEMM epilogue, the
// elementwise and quantize kernels, and torch-free builds of them share one definition.
#pragma once

#include <cuda_runtime.h>

namespace fusekit {

// GELU and SiLU on the SFU (one MUFU.EX2 and one MUFU.RCP each, flushing subnormals) instead of
// libdevice's erff/tanhf/expf and IEEE division (elementwise/activations.cuh's gelu_erf, gelu_tanh, silu), for
// results rounded to 16 bits: the errors stay far below a 16-bit half ulp (~1e-6 relative in float32 math),
// and libdevice makes GELU instruction-bound (GEMM epilogues at K = 64; elementwise GELU in fp16/bf16 at
// 51-80% of copy bandwidth; fp16 GELU(erf) on the SFU: 96%).
//   erf: Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7;  tanh as a sigmoid, below.
// Limits as eager's: erf(+-inf) = +-1, tanh -> +-1, silu(-inf) = NaN, NaN stays NaN.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// 0.5 x (1 + erf(x / sqrt 2)), with 1/sqrt 2 folded into the constants (13 instructions, 2 on the SFU).
__device__ __forceinline__ float fast_gelu_erf(float x) {
  const float t = rcp_approx(fmaf(0.3275911f * 0.70710678118654752f, fabsf(x), 1.0f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f),
                                      -0.284496736f), 0.254829592f);
  const float erf = copysignf(1.0f - poly * ex2_approx((-0.5f * kLog2e * x) * x), x);
  const float h = 0.5f * x;
  return fmaf(h, erf, h);
}
// 0.5 x (1 + tanh(u)) = x (1 - 1 / (1 + e^(2u))), u = sqrt(2/pi) (x + 0.044715 x^3), constants folded.
// x = inf -> inf, x = -inf -> NaN: eager's values.
__device__ __forceinline__ float fast_gelu_tanh(float x) {
  constexpr float k0 = 2.0f * kLog2e * 0.79788456080286536f, k1 = k0 * 0.044715f;
  const float e = ex2_approx(x * fmaf(k1, x * x, k0));
  return x * (1.0f - rcp_approx(1.0f + e));
}
__device__ __forceinline__ float fast_silu(float x) { return x * rcp_approx(1.0f + ex2_approx(-kLog2e * x)); }
__device__ __forceinline__ float relu(float x) { return isnan(x) ? x : fmaxf(x, 0.0f); }  // NaN stays NaN

// x / s rounded to nearest even (IEEE, as __fdiv_rn) with the divisor's work done once: div_rn_recip(s)
// is the refined reciprocal of CUDA's div.rn fast path (MUFU.RCP and one Newton step) and div_rn_by its
// per-element part (a product and one correcting FMA), the same instructions __fdiv_rn runs when its
// range check (FCHK) passes. __fdiv_rn repeats the reciprocal and the check per element; a kernel dividing
// many elements by one scale is instruction-bound on it (per-channel INT8).
// Valid where every intermediate is a normal float: div_rn_divisor_ok(s) and |x| in [2^-60, 2^60] or 0
// (quant_i8_channel.cu's quant_vec says when an int8 result needs only |x| <= 2^60); elsewhere __fdiv_rn.
__device__ __forceinline__ float div_rn_recip(float s) {
  const float r = rcp_approx(s);
  return fmaf(r, fmaf(-s, r, 1.0f), r);
}
__device__ __forceinline__ float div_rn_by(float x, float s, float recip) {
  const float q = x * recip;
  return fmaf(fmaf(-s, q, x), recip, q);
}
__device__ __forceinline__ bool div_rn_divisor_ok(float s) {  // |s| in [2^-60, 2^60]
  const float a = fabsf(s);
  return a >= 0x1p-60f && a <= 0x1p60f;
}

}  // namespace fusekit
