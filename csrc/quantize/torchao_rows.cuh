// torchao's dynamic per-row activation scales and the e4m3 quotients, as its eager code rounds them: shared by the
// float8 / int8 dynamic decode GEMMs (decode_gemm/decode_linear_fp8.cuh) and the prefill producers that quantize
// their own output (quantize/silu_mul_fp8_rows.cu).
//
//   s = (x.abs().amax(-1, keepdim=True) / 448.0).float()              # the division rounded to x's dtype
//   xq = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
//
// T is CUDA's __half or __nv_bfloat16 (convert.cuh's to_float2).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "convert.cuh"  // to_float, from_float, to_float2

namespace fusekit {

constexpr float kFp8Max = 448.f;                    // torch.finfo(torch.float8_e4m3fn).max
constexpr float kInt8Div = 127.5f;                  // torchao's symmetric int8 range: (127 - -128) / 2
constexpr float kInt8Eps = 1.1920928955078125e-07f;  // torch.finfo(torch.float32).eps, torchao's scale floor

// x / s correctly rounded from r = 1/s (rounded): one Newton step on the quotient (the residual exact by fma)
__device__ __forceinline__ float div_rn(float x, float s, float r) {
  const float q = __fmul_rn(x, r);
  return __fmaf_rn(__fmaf_rn(-q, s, x), r, q);
}

// 2 values of x (one word of T) quantized with the row's s (and r = 1/s) -> two e4m3, the first in the low byte
template <typename T>
__device__ __forceinline__ __nv_fp8x2_storage_t quantize2(uint32_t v, float s, float r) {
  const float2 f = to_float2<T>(v);
  // satfinite: beyond +-448 -> +-448 (the clamp), NaN stays NaN (as clamp then cast)
  return __nv_cvt_float2_to_fp8x2(make_float2(div_rn(f.x, s, r), div_rn(f.y, s, r)), __NV_SATFINITE, __NV_E4M3);
}

// max of two values >= 0 (or NaN with its sign cleared): NANP keeps a NaN as torch's amax does (as bits, a positive
// NaN is above infinity), else fmaxf, which drops it
template <bool NANP>
__device__ __forceinline__ float amax2(float a, float b) {
  return NANP ? __uint_as_float(max(__float_as_uint(a), __float_as_uint(b))) : fmaxf(a, b);
}

// the row's scale from its max |x|: amax / 448 rounded to x's dtype (as eager divides a T tensor), as a float
// I8: amax / 127.5 rounded to x's dtype, floored at float32's eps, rounded to x's dtype again (eps is exact in both);
// a NaN amax (I8 keeps it: warp_amax NANP) stays NaN through the floor, as torch's clamp_min: the row's output NaN
template <typename T, bool I8 = false>
__device__ __forceinline__ float row_scale(float amax) {
  if constexpr (I8) {
    const float s = to_float(from_float<T>(__fdiv_rn(amax, kInt8Div)));
    return to_float(from_float<T>(s != s ? s : fmaxf(s, kInt8Eps)));
  } else {
    return to_float(from_float<T>(__fdiv_rn(amax, kFp8Max)));
  }
}

}  // namespace fusekit
