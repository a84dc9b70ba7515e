// fusekit::bias_gelu -- GELU(x + bias), bias broadcast along the last dimension (a GEMM epilogue that
// Inductor runs as mm + a pointwise kernel).
//
//   def bias_gelu_ref(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
//       return F.gelu(x + bias, approximate=approximate)
//
// Contract: x [..., N] CUDA, contiguous, float32/float16/bfloat16; bias [N], same dtype and device,
// contiguous; approximate in {"none", "tanh"}. Returns a new contiguous tensor like x. Float32 math.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "activations.cuh"
#include "checks.h"
#include "elementwise_engine.cuh"

namespace fusekit {
namespace {

template <typename T, bool TANH>
struct BiasGelu {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    // x + bias stays in float32 (eager rounds it to T first; Inductor does not): one rounding, closer to
    // the float64 reference, and the bf16/fp16 kernels are instruction-bound enough that it shows.
    return map2([](float x, float b) { return gelu_for<T>(x + b, TANH); }, v[0], v[1]);
  }
};

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_bias(x, bias);
  const bool tanh = tanh_gelu(std::string(approximate));
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu", [&] {
    const scalar_t* none = nullptr;
    auto* o = out.data_ptr<scalar_t>();
    auto* xp = x.data_ptr<scalar_t>();
    auto* bp = bias.data_ptr<scalar_t>();
    if (tanh) launch_elementwise<2, 0b10>(BiasGelu<scalar_t, true>{}, o, xp, bp, none, x.numel(), bias.numel());
    else launch_elementwise<2, 0b10>(BiasGelu<scalar_t, false>{}, o, xp, bp, none, x.numel(), bias.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("bias_gelu", &fusekit::bias_gelu_cuda); }
