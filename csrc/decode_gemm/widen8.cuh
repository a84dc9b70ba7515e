// 8-bit weights widened to 16-bit MMA operands in registers, shared by the 8-bit weight-only decode kernels:
// decode_linear_w8.cuh's mma.sync kernel (widen16) and decode_linear_tma.cuh's W8 form (widen_rows2: wgmma's A
// fragments). int8 values become 16-bit exactly (fp16: the 0x6400 exponent trick, no conversion instruction; bf16:
// through float32's 0x4B000000); e4m3 values go through half (exact) times the weight row's float32 scale, rounded
// once, as torchao's dequantization does.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace fusekit {
namespace decode_w8 {

// Four int8 (one word) -> two words of two 16-bit values each, exact.
template <typename T>
__device__ __forceinline__ void widen4(uint32_t b, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = b ^ 0x80808080u;  // biased: byte + 128 in [0, 255]
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64XX is the half 1024 + XX: subtract 1152 (1024 + the bias)
    const uint32_t h01 = __byte_perm(u, 0x64646464u, 0x4140), h23 = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __half2half2(__ushort_as_half(0x6480));
    const __half2 r01 = __hsub2(*reinterpret_cast<const __half2*>(&h01), bias);
    const __half2 r23 = __hsub2(*reinterpret_cast<const __half2*>(&h23), bias);
    lo = *reinterpret_cast<const uint32_t*>(&r01);
    hi = *reinterpret_cast<const uint32_t*>(&r23);
  } else {
    // 0x4B0000XX is the float 2^23 + XX: subtract 2^23 + 128; integers of 8 bits are exact in bfloat16
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 + i)) - 8388736.f;
    const __nv_bfloat162 r01 = __floats2bfloat162_rn(f[0], f[1]), r23 = __floats2bfloat162_rn(f[2], f[3]);
    lo = *reinterpret_cast<const uint32_t*>(&r01);
    hi = *reinterpret_cast<const uint32_t*>(&r23);
  }
}

// Two e4m3 (the low 16 bits of b) times the weight row's float32 scale, each rounded once to T: one word.
// e4m3 -> half is exact (cvt), half -> float too: the product and its rounding are (w.float() * s).to(T)'s.
template <typename T>
__device__ __forceinline__ uint32_t dequant2(uint32_t b, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b & 0xFFFFu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(f.x * s, f.y * s);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * s, f.y * s);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Four e4m3 (one word) of one weight row times its scale: two words of two values.
template <typename T>
__device__ __forceinline__ void dequant4(uint32_t b, float s, uint32_t& lo, uint32_t& hi) {
  lo = dequant2<T>(b, s), hi = dequant2<T>(b >> 16, s);
}

// Two 8-bit weights of each of two rows (bytes 0-1 row a, 2-3 row b) -> one word per row: int8 exactly, e4m3
// times the row's scale (sa, sb) rounded once. The TMA kernel's W8 register form (an A fragment's two rows).
template <typename T, bool FP8>
__device__ __forceinline__ void widen_rows2(uint32_t b, float sa, float sb, uint32_t& ra, uint32_t& rb) {
  if constexpr (FP8) {
    ra = dequant2<T>(b, sa), rb = dequant2<T>(b >> 16, sb);
  } else {
    widen4<T>(b, ra, rb);
  }
}

// 16 8-bit weights -> k [0, 8) and [8, 16) as two fragments of 8 16-bit values: int8 widened exactly, e4m3
// dequantized with the row's scale s
template <typename T, bool FP8>
__device__ __forceinline__ void widen16(const uint4& q, float s, uint4& a, uint4& b) {
  if constexpr (FP8) {
    dequant4<T>(q.x, s, a.x, a.y);
    dequant4<T>(q.y, s, a.z, a.w);
    dequant4<T>(q.z, s, b.x, b.y);
    dequant4<T>(q.w, s, b.z, b.w);
  } else {
    widen4<T>(q.x, a.x, a.y);
    widen4<T>(q.y, a.z, a.w);
    widen4<T>(q.z, b.x, b.y);
    widen4<T>(q.w, b.z, b.w);
  }
}

}  // namespace decode_w8
}  // namespace fusekit
