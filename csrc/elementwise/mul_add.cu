// fusekit::mul_add -- q * k + v in one pass (eager: 2 kernels, 5 tensor passes; fused: 4).
//
//   def mul_add_ref(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
//       return q * k + v
//
// Contract: q, k, v CUDA, contiguous, one shape, one dtype in {float32, float16, bfloat16}. Returns a new
// contiguous tensor. Computes q * k + v in float32 with one rounding (an FMA).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "elementwise_engine.cuh"

namespace fusekit {
namespace {

struct MulAdd {
  static constexpr bool kFloat2 = true;
  __device__ float2 operator()(const float2 (&v)[3]) const {
    return map2([](float q, float k, float x) { return fmaf(q, k, x); }, v[0], v[1], v[2]);
  }
};

at::Tensor mul_add_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  FK_CHECK_CUDA(q);
  FK_CHECK_FLOATING(q);
  FK_CHECK_SAME(q, k);
  FK_CHECK_SAME(q, v);
  FK_CHECK_CONTIGUOUS(q);
  FK_CHECK_CONTIGUOUS(k);
  FK_CHECK_CONTIGUOUS(v);
  c10::cuda::CUDAGuard guard(q.device());
  auto out = at::empty_like(q, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "mul_add", [&] {
    launch_elementwise<3>(MulAdd{}, out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(),
                          k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), q.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("mul_add", &fusekit::mul_add_cuda); }
