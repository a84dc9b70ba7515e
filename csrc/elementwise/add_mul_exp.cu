// fusekit::add_mul_exp -- exp((x + y) * c) in one pass.
//
//   def add_mul_exp_ref(x: Tensor, y: Tensor, c: float = 2.0) -> Tensor:
//       return torch.exp((x + y) * c)
//
// Contract: x, y CUDA, contiguous, one shape, one dtype in {float32, float16, bfloat16}; c a float or a
// 0-dim float tensor (c_t). Returns a new contiguous tensor of x's shape and dtype. Computes in float32
// and rounds once (eager rounds after each op), so half-precision results are at least as accurate.
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

struct AddMulExp {
  static constexpr bool kFloat2 = true;
  ScalarArg c;
  __device__ float2 operator()(const float2 (&v)[2]) const {
    const float cv = c.get();
    return map2([cv](float x, float y) { return expf((x + y) * cv); }, v[0], v[1]);
  }
};

at::Tensor add_mul_exp_cuda(const at::Tensor& x, const at::Tensor& y, double c,
                            const std::optional<at::Tensor>& c_t) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_SAME(x, y);
  FK_CHECK_CONTIGUOUS(x);
  FK_CHECK_CONTIGUOUS(y);
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto cs = scalar_arg("c", c, c_t, x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_mul_exp", [&] {
    launch_elementwise<2>(AddMulExp{cs}, out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                          y.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), x.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("add_mul_exp", &fusekit::add_mul_exp_cuda); }
