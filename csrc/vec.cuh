// What a thread loads with one 16-byte access: Vec (V elements), pairs of elements as float2 (load2, store2),
// and Held, a loaded vector read back as elements or as float pairs (the elementwise engine and the quantize
// kernels).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fusekit {

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// Two neighbouring elements as a float2, and a float2 rounded to two of them (one packed conversion for 16 bits).
template <typename T>
__device__ __forceinline__ float2 load2(const T* p) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  else if constexpr (std::is_same_v<T, c10::Half>) return __half22float2(*reinterpret_cast<const __half2*>(p));
  else return make_float2(static_cast<float>(p[0]), static_cast<float>(p[1]));
}
template <typename T>
__device__ __forceinline__ void store2(T* p, float2 r) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) *reinterpret_cast<__nv_bfloat162*>(p) = __float22bfloat162_rn(r);
  else if constexpr (std::is_same_v<T, c10::Half>) *reinterpret_cast<__half2*>(p) = __float22half2_rn(r);
  else p[0] = static_cast<T>(r.x), p[1] = static_cast<T>(r.y);
}

// What a thread holds of one vector load, read back as elements or as float pairs. bf16 is held as 32-bit
// words (bf16 pairs) and split where used: held as 16-bit elements, each load is unpacked (PRMT, which waits
// for it) before the next load issues, so the loads run one after another (static INT8 and bias + ReLU in
// bf16). fp16 needs no unpacking (HADD2.F32 reads either half).
template <typename T, int V, typename = void>
struct Held {
  Vec<T, V> x;
  __device__ __forceinline__ void load(const T* p, int64_t i) { x = reinterpret_cast<const Vec<T, V>*>(p)[i]; }
  __device__ __forceinline__ T elem(int j) const { return x.v[j]; }
  __device__ __forceinline__ float2 pair(int j) const { return load2(&x.v[j]); }
};
template <int V>
struct Held<c10::BFloat16, V, std::enable_if_t<V % 2 == 0>> {
  Vec<uint32_t, V / 2> w;
  __device__ __forceinline__ void load(const c10::BFloat16* p, int64_t i) {
    w = reinterpret_cast<const Vec<uint32_t, V / 2>*>(p)[i];
  }
  __device__ __forceinline__ c10::BFloat16 elem(int j) const {
    return c10::BFloat16(static_cast<unsigned short>(w.v[j / 2] >> (16 * (j % 2))), c10::BFloat16::from_bits());
  }
  __device__ __forceinline__ float2 pair(int j) const {  // j even
    return make_float2(__uint_as_float(w.v[j / 2] << 16), __uint_as_float(w.v[j / 2] & 0xffff0000u));
  }
};

// A held vector as V floats, converted pair by pair (bf16: a shift and a mask per pair of elements).
template <typename T, int V>
__device__ __forceinline__ void to_floats(const Held<T, V>& v, float (&xf)[V]) {
  if constexpr (V % 2 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      const float2 f = v.pair(j);
      xf[j] = f.x, xf[j + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) xf[j] = static_cast<float>(v.elem(j));
  }
}

}  // namespace fusekit
