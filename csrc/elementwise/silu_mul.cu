// fusekit::silu_mul -- SwiGLU's silu(g) * u in one pass.
//
//   def silu_mul_ref(g: Tensor, u: Tensor) -> Tensor:
//       return F.silu(g) * u
//
// Contract: g, u CUDA, contiguous, one shape, one dtype in {float32, float16, bfloat16}. Returns a new
// contiguous tensor. Float32 math; silu(g) is rounded to the dtype before the product, as in eager.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "activations.cuh"
#include "checks.h"
#include "convert.cuh"  // rnd2
#include "elementwise_engine.cuh"

namespace fusekit {
namespace {

template <typename T>
struct SiluMul {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    // eager rounds silu(g) to T before the product
    const float2 s = rnd2<T>(map2([](float g) { return silu_for<T>(g); }, v[0]));
    return map2([](float x, float u) { return x * u; }, s, v[1]);
  }
};

at::Tensor silu_mul_cuda(const at::Tensor& g, const at::Tensor& u) {
  FK_CHECK_CUDA(g);
  FK_CHECK_FLOATING(g);
  FK_CHECK_SAME(g, u);
  FK_CHECK_CONTIGUOUS(g);
  FK_CHECK_CONTIGUOUS(u);
  c10::cuda::CUDAGuard guard(g.device());
  auto out = at::empty_like(g, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "silu_mul", [&] {
    launch_elementwise<2>(SiluMul<scalar_t>{}, out.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
                          u.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), g.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("silu_mul", &fusekit::silu_mul_cuda); }
