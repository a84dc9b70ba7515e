// fusekit::gelu -- GELU, erf or tanh form, in one pass.
//
//   def gelu_ref(x: Tensor, approximate: str = "none") -> Tensor:
//       return F.gelu(x, approximate=approximate)
//
// Contract: x CUDA, contiguous, float32/float16/bfloat16; approximate in {"none", "tanh"}. Returns a new
// contiguous tensor like x. Float32 math, one rounding.
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
struct Gelu {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[1]) const {
    return map2([](float x) { return gelu_for<T>(x, TANH); }, v[0]);
  }
};

at::Tensor gelu_cuda(const at::Tensor& x, c10::string_view approximate) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  const bool tanh = tanh_gelu(std::string(approximate));
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu", [&] {
    const scalar_t* none = nullptr;
    if (tanh) launch_elementwise<1>(Gelu<scalar_t, true>{}, out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), none, none, x.numel());
    else launch_elementwise<1>(Gelu<scalar_t, false>{}, out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), none, none, x.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("gelu", &fusekit::gelu_cuda); }
