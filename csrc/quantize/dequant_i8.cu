// fusekit::dequant_i8 -- INT8 -> float32/float16/bfloat16 in one pass, bit-exact with eager CUDA.
//
//   def dequant_i8_ref(q: Tensor, scale: float = 0.05, zp: float = 3.0,
//                      dtype: torch.dtype = torch.float16) -> Tensor:
//       return ((q.to(torch.float32) - zp) * scale).to(dtype)
//
// Contract: q int8 CUDA, contiguous; scale and zp floats or 0-dim float tensors (scale_t, zp_t); dtype in
// {float32, float16, bfloat16}. Returns a new contiguous tensor of q's shape in `dtype`.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "checks.h"
#include "convert.cuh"  // to
#include "elementwise_engine.cuh"
#include "scalar_args.cuh"

namespace fusekit {
namespace {

template <typename Out>
struct DequantI8 {
  ScalarArg scale, zp;
  __device__ Out operator()(const int8_t (&v)[1]) const {
    return to<Out>(__fmul_rn(__fsub_rn(static_cast<float>(v[0]), zp.get()), scale.get()));
  }
};

at::Tensor dequant_i8_cuda(const at::Tensor& q, double scale, double zp, at::ScalarType dtype,
                           const std::optional<at::Tensor>& scale_t, const std::optional<at::Tensor>& zp_t) {
  FK_CHECK_CUDA(q);
  FK_CHECK_CONTIGUOUS(q);
  TORCH_CHECK(q.scalar_type() == at::kChar, "fusekit: q must be int8, got ", c10::toString(q.scalar_type()));
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "fusekit: dtype must be float32, float16 or bfloat16, got ", c10::toString(dtype));
  c10::cuda::CUDAGuard guard(q.device());
  auto out = at::empty(q.sizes(), q.options().dtype(dtype));
  auto s = scalar_arg("scale", scale, scale_t, q.device());
  auto z = scalar_arg("zp", zp, zp_t, q.device());
  const int8_t* none = nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "dequant_i8", [&] {
    launch_elementwise<1>(DequantI8<scalar_t>{s, z}, out.data_ptr<scalar_t>(), q.data_ptr<int8_t>(), none, none,
                          q.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("dequant_i8", &fusekit::dequant_i8_cuda); }
