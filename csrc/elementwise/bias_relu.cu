// fusekit::bias_relu -- ReLU(x + bias), bias broadcast along the last dimension.
//
//   def bias_relu_ref(x: Tensor, bias: Tensor) -> Tensor:
//       return F.relu(x + bias)
//
// Contract: x [..., N] CUDA, contiguous, float32/float16/bfloat16; bias [N], same dtype and device,
// contiguous. Returns a new contiguous tensor like x. NaN stays NaN, as in eager.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "elementwise_engine.cuh"
#include "fast_math.cuh"  // relu

namespace fusekit {
namespace {

// Eager rounds x + bias to T before the ReLU; rounding is monotone and keeps the sign, so rounding once
// after the ReLU gives the same value.
struct BiasRelu {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    return map2([](float x, float b) { return relu(x + b); }, v[0], v[1]);
  }
};

at::Tensor bias_relu_cuda(const at::Tensor& x, const at::Tensor& bias) {
  check_bias(x, bias);
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_relu", [&] {
    launch_elementwise<2, 0b10>(BiasRelu{}, out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                bias.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), x.numel(),
                                bias.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("bias_relu", &fusekit::bias_relu_cuda); }
