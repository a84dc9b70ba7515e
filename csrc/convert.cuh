// Device conversions between float and the 16-bit types, rounding to nearest even: CUDA's __half and
// __nv_bfloat16 (the tensor-core kernels) and c10::Half / c10::BFloat16 (the elementwise and quantize kernels,
// which round as eager PyTorch does).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fusekit {

// explicit conversions: torch's extension flags disable the implicit half/bfloat16 <-> float ones
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two 16-bit values of one word (the first in the low half) as floats, exactly (bf16: the high half of a float32).
template <typename T>
__device__ __forceinline__ float2 to_float2(uint32_t v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  } else {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
  }
}

// float -> T, round to nearest even (to), and the float value that rounding gives (rnd). bfloat16 rounds one
// value with integer ops: a lone F2F conversion makes bf16 kernels slower (on an H200, bias + ReLU in bf16 at
// 50M elements: 0.070 ms this way, 0.081 ms with __float2bfloat16_rn). rnd2 rounds two values with one packed
// conversion, which is faster than both (static INT8 in bf16: 0.066 -> 0.058 ms).
__device__ __forceinline__ float bf16_round(float f) {
  if (isnan(f)) return f;
  const unsigned u = __float_as_uint(f);
  return __uint_as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
template <typename T>
__device__ __forceinline__ T to(float f) { return static_cast<T>(f); }
template <>
__device__ __forceinline__ c10::BFloat16 to<c10::BFloat16>(float f) {
  return c10::BFloat16(static_cast<unsigned short>(__float_as_uint(bf16_round(f)) >> 16), c10::BFloat16::from_bits());
}
template <typename T>
__device__ __forceinline__ float rnd(float f) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return bf16_round(f);
  else return static_cast<float>(static_cast<T>(f));
}
template <typename T>
__device__ __forceinline__ void rnd2(float& a, float& b) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    // unpacked with a shift and a mask: __bfloat1622float2 spends a PRMT and a shift on the high half
    const __nv_bfloat162 h = __float22bfloat162_rn(make_float2(a, b));
    const uint32_t w = *reinterpret_cast<const uint32_t*>(&h);
    a = __uint_as_float(w << 16), b = __uint_as_float(w & 0xffff0000u);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    const float2 f = __half22float2(__float22half2_rn(make_float2(a, b)));
    a = f.x, b = f.y;
  }
}
template <typename T>
__device__ __forceinline__ float2 rnd2(float2 v) {
  rnd2<T>(v.x, v.y);
  return v;
}

}  // namespace fusekit
