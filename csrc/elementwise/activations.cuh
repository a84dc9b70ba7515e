// The activations of the elementwise GELU/SiLU ops: eager's float32 formulas (libdevice) for float32 results,
// fast_math.cuh's SFU forms for results rounded to 16 bits; and GELU's `approximate` argument.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <string>
#include <type_traits>

#include "fast_math.cuh"

namespace fusekit {

// Eager's formulas, evaluated in float32.
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// The activation for a result of dtype T: eager's libdevice math for float32, the SFU forms for 16 bits.
template <typename T>
constexpr bool is_16bit = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
template <typename T>
__device__ __forceinline__ float gelu_for(float x, bool tanh) {
  if constexpr (is_16bit<T>) return tanh ? fast_gelu_tanh(x) : fast_gelu_erf(x);
  else return tanh ? gelu_tanh(x) : gelu_erf(x);
}
template <typename T>
__device__ __forceinline__ float silu_for(float x) {
  if constexpr (is_16bit<T>) return fast_silu(x);
  else return silu(x);
}

// "none" / "tanh", as F.gelu's approximate argument
inline bool tanh_gelu(const std::string& approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh",
              "fusekit: approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

}  // namespace fusekit
