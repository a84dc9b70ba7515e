// torchao's dynamic per-row float8 quantization of a 16-bit x, value by value, for the kernels that quantize x
// themselves (quantize_rows and the mma.sync kernel in decode_linear_fp8.cuh, the TMA kernel's in-kernel form in
// decode_linear_tma.cuh):
//
//   s = (x.abs().amax(-1, keepdim=True) / 448.0).float()              # the division rounded to x's dtype
//   xq = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
//
// the quotient correctly rounded, e4m3 round-to-nearest-even with +-448 saturation, NaN kept (clamp + cast).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "convert.cuh"  // to_float, from_float

namespace fusekit {
namespace decode_fp8 {

constexpr float kFp8Max = 448.f;  // torch.finfo(torch.float8_e4m3fn).max

// x / s correctly rounded from r = 1/s (rounded): one Newton step on the quotient (the residual exact by fma)
__device__ __forceinline__ float div_rn(float x, float s, float r) {
  const float q = __fmul_rn(x, r);
  return __fmaf_rn(__fmaf_rn(-q, s, x), r, q);
}

template <typename T>
__device__ __forceinline__ float2 to_float2(uint32_t v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  } else {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
  }
}

// 2 values of x (one word of T) quantized with the row's s (and r = 1/s) -> two e4m3, the first in the low byte
template <typename T>
__device__ __forceinline__ __nv_fp8x2_storage_t quantize2(uint32_t v, float s, float r) {
  const float2 f = to_float2<T>(v);
  // satfinite: beyond +-448 -> +-448 (the clamp), NaN stays NaN (as clamp then cast)
  return __nv_cvt_float2_to_fp8x2(make_float2(div_rn(f.x, s, r), div_rn(f.y, s, r)), __NV_SATFINITE, __NV_E4M3);
}

// 8 values of x (one uint4 of T) -> 8 e4m3 in memory order
template <typename T>
__device__ __forceinline__ uint2 quantize8_bytes(const uint4& v, float s, float r) {
  const auto pair = [&](uint32_t lo, uint32_t hi) {
    return static_cast<uint32_t>(quantize2<T>(lo, s, r)) | (static_cast<uint32_t>(quantize2<T>(hi, s, r)) << 16);
  };
  return make_uint2(pair(v.x, v.y), pair(v.z, v.w));
}

// max |x| of 8 values (one uint4 of T), as a float (exact: the max of 16-bit values); fmaxf drops a NaN (see
// decode_linear_fp8_kernel: the row's output is NaN either way)
template <typename T>
__device__ __forceinline__ float amax8(const uint4& v, float a) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2<T>(w[i]);
    a = fmaxf(a, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return a;
}

// the row's scale from its max |x|: amax / 448 rounded to x's dtype (as eager divides a T tensor), as a float
template <typename T>
__device__ __forceinline__ float row_scale(float amax) { return to_float(from_float<T>(__fdiv_rn(amax, kFp8Max))); }

}  // namespace decode_fp8
}  // namespace fusekit
