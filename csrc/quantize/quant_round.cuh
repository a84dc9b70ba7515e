// float -> int8 and float -> float8_e4m3fn as eager's conversions round, for the quantize kernels: int8 by the
// magic-number trick (no F2I or FRND, both on the conversion pipe), bytes packed into words with PRMT.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fusekit {

// 1.5 * 2^23: for |t| < 2^22, t + kRoundMagic (or fma(x, r, kRoundMagic)) rounds t half to even into the
// low mantissa bits, whose low byte is then the int8: no F2I or FRND, both on the conversion pipe.
constexpr float kRoundMagic = 12582912.0f;
__device__ __forceinline__ uint32_t round_bits(float t) { return __float_as_uint(t + kRoundMagic); }
// Four int8s from the low bytes of four round_bits words, byte k from b_k (PRMT).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// torch.round then clamp to [qmin, qmax] (integers, so the two commute) then .to(int8), for |t| finite or
// not. NaN -> 0, as eager's float -> int8 conversion on CUDA.
__device__ __forceinline__ int8_t round_to_i8(float t, float qmin, float qmax) {
  if (isnan(t)) return 0;
  return static_cast<int8_t>(round_bits(fminf(fmaxf(t, qmin), qmax)) & 0xffu);
}
// The same as a word whose low byte is the int8, for packing (pack2_low_bytes). A select rather than an
// early return: in static INT8's bf16 pairs, the branch makes ptxas predicate the clamp and reload qmin/qmax
// per element. (The per-row kernels keep round_to_i8 in their rare exact path: with i8_bits there, ptxas
// schedules their main loop differently and bf16 dyn_quant_i8 is ~5% slower at 50M elements.)
__device__ __forceinline__ uint32_t i8_bits(float t, float qmin, float qmax) {
  const uint32_t b = round_bits(fminf(fmaxf(t, qmin), qmax));
  return isnan(t) ? 0u : b;
}
// Two int8s (the low bytes of i8_bits words a, b) as one 16-bit value, a in the low byte.
__device__ __forceinline__ uint16_t pack2_low_bytes(uint32_t a, uint32_t b) {
  return static_cast<uint16_t>(__byte_perm(a, b, 0x0040));
}

// float -> float8_e4m3fn with round-to-nearest-even, as c10::Float8_e4m3fn does for |v| <= 448 (callers
// clamp first, as the patterns do); NaN stays NaN.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace fusekit
