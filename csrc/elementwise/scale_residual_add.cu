// fusekit::scale_residual_add -- residual + x * scale in one pass (scaled residual connections).
//
//   def scale_residual_add_ref(x: Tensor, residual: Tensor, scale: float = 0.5) -> Tensor:
//       return residual + x * scale
//
// Contract: x, residual CUDA, contiguous, one shape, one dtype in {float32, float16, bfloat16}; scale a
// float or a 0-dim float tensor (scale_t). Returns a new contiguous tensor. Float32 math (one FMA).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "checks.h"
#include "elementwise_engine.cuh"
#include "scalar_args.cuh"

namespace fusekit {
namespace {

struct ScaleResidualAdd {
  static constexpr bool kFloat2 = true;
  ScalarArg scale;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    const float s = scale.get();
    return map2([s](float x, float r) { return fmaf(x, s, r); }, v[0], v[1]);
  }
};

at::Tensor scale_residual_add_cuda(const at::Tensor& x, const at::Tensor& residual, double scale,
                                   const std::optional<at::Tensor>& scale_t) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_SAME(x, residual);
  FK_CHECK_CONTIGUOUS(x);
  FK_CHECK_CONTIGUOUS(residual);
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto s = scalar_arg("scale", scale, scale_t, x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scale_residual_add", [&] {
    launch_elementwise<2>(ScaleResidualAdd{s}, out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                          residual.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), x.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("scale_residual_add", &fusekit::scale_residual_add_cuda); }
