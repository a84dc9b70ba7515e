// fusekit::gelu_mul -- GeGLU's gelu(g) * u in one pass, erf or tanh form.
//
//   def gelu_mul_ref(g: Tensor, u: Tensor, approximate: str = "none") -> Tensor:
//       return F.gelu(g, approximate=approximate) * u
//
// Contract: g, u CUDA, contiguous, one shape, one dtype in {float32, float16, bfloat16}; approximate in
// {"none", "tanh"}. Returns a new contiguous tensor. gelu(g) is rounded to the dtype before the product.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "activations.cuh"
#include "checks.h"
#include "convert.cuh"  // rnd2
#include "elementwise_engine.cuh"

namespace fusekit {
namespace {

template <typename T, bool TANH>
struct GeluMul {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    // eager rounds gelu(g) to T before the product
    const float2 a = rnd2<T>(map2([](float g) { return gelu_for<T>(g, TANH); }, v[0]));
    return map2([](float x, float u) { return x * u; }, a, v[1]);
  }
};

at::Tensor gelu_mul_cuda(const at::Tensor& g, const at::Tensor& u, c10::string_view approximate) {
  FK_CHECK_CUDA(g);
  FK_CHECK_FLOATING(g);
  FK_CHECK_SAME(g, u);
  FK_CHECK_CONTIGUOUS(g);
  FK_CHECK_CONTIGUOUS(u);
  const bool tanh = tanh_gelu(std::string(approximate));
  c10::cuda::CUDAGuard guard(g.device());
  auto out = at::empty_like(g, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "gelu_mul", [&] {
    const scalar_t* none = nullptr;
    if (tanh) launch_elementwise<2>(GeluMul<scalar_t, true>{}, out.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), none, g.numel());
    else launch_elementwise<2>(GeluMul<scalar_t, false>{}, out.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), none, g.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("gelu_mul", &fusekit::gelu_mul_cuda); }
