// fusekit::quant_fp8 -- static per-tensor FP8 e4m3, saturating, bit-exact with eager CUDA.
//
//   def quant_fp8_ref(x: Tensor, scale: float = 0.05) -> Tensor:
//       return (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
//
// Contract: x CUDA, contiguous, float32/float16/bfloat16; scale a float or a 0-dim float tensor (scale_t).
// Returns a new contiguous float8_e4m3fn tensor like x. As eager: a host scale divides as x * (1/scale),
// a device scale (cast to x's dtype) divides truly; the quotient is rounded to x's dtype first.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp8.h>
#include <torch/library.h>

#include <optional>

#include "quant_round.cuh"  // to_e4m3
#include "checks.h"
#include "convert.cuh"  // rnd, rnd2
#include "elementwise_engine.cuh"
#include "scalar_args.cuh"

namespace fusekit {
namespace {

template <typename T>
struct QuantFp8 {
  ScalarArg scale;
  __device__ float div(float x) const {
    return scale.ptr ? __fdiv_rn(x, rnd<T>(scale.get())) : x * (1.0f / scale.get());
  }
  __device__ uint8_t operator()(const T (&v)[1]) const {
    float t = rnd<T>(div(static_cast<float>(v[0])));
    if (!isnan(t)) t = fminf(fmaxf(t, -448.0f), 448.0f);
    return to_e4m3(t);
  }
  // Two values per rounding and per e4m3 conversion; saturating to +-448 is the clamp (NaN stays NaN).
  static constexpr bool kPairs = true;
  __device__ uint16_t pair(const float2 (&v)[1]) const {
    float a = div(v[0].x), b = div(v[0].y);
    rnd2<T>(a, b);
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);  // a in the low byte
  }
};

at::Tensor quant_fp8_cuda(const at::Tensor& x, double scale, const std::optional<at::Tensor>& scale_t) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  auto s = scalar_arg("scale", scale, scale_t, x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "quant_fp8", [&] {
    const scalar_t* none = nullptr;
    launch_elementwise<1>(QuantFp8<scalar_t>{s}, reinterpret_cast<uint8_t*>(out.data_ptr()),
                          x.data_ptr<scalar_t>(), none, none, x.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("quant_fp8", &fusekit::quant_fp8_cuda); }
