// fusekit::quant_i8 -- static per-tensor INT8 quantize, bit-exact with eager PyTorch on CUDA.
//
//   def quant_i8_ref(x: Tensor, scale: float = 0.05, zp: float = 3.0, qmin: int = -128,
//                    qmax: int = 127) -> Tensor:
//       return torch.clamp(torch.round(x / scale + zp), qmin, qmax).to(torch.int8)
//
// Contract: x CUDA, contiguous, float32/float16/bfloat16; -128 <= qmin <= qmax <= 127; scale and zp floats
// or 0-dim float tensors (scale_t, zp_t). Returns a new contiguous int8 tensor of x's shape.
//
// NOTE (exactness): eager divides by a host scalar as x * (1/scale) in float32 (div_true_kernel_cuda's
// reciprocal path) but by a device tensor with a true division, after casting that tensor to x's dtype;
// it rounds to x's dtype after the division and after the add; torch.round is round-half-to-even
// (rintf). Each step is mirrored here (tests/test_kernels_gpu.py checks all three scalar forms).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>

#include "quant_round.cuh"  // i8_bits, pack2_low_bytes
#include "checks.h"
#include "convert.cuh"  // rnd, rnd2
#include "elementwise_engine.cuh"
#include "scalar_args.cuh"

namespace fusekit {
namespace {

// kDevice: scale or zp is a device tensor. Both host scalars (the common case) compile to a kernel with
// no pointer branches or scalar reloads between the elements (bf16: 91-96% of copy bandwidth, 83-86% with
// them).
template <typename T, bool kDevice>
struct QuantI8 {
  ScalarArg scale, zp;
  float qmin, qmax;
  float inv;  // host scale: 1 / scale in float32, computed on the host as eager does
  // A device tensor operand is first cast to x's dtype (TensorIterator's common dtype); a host scalar
  // is read as a float. Host scale: multiply by the float reciprocal, as eager does; device: divide.
  __device__ float div(float x, float s) const {
    if constexpr (!kDevice) return x * inv;
    else return scale.ptr ? __fdiv_rn(x, s) : x * (1.0f / s);
  }
  __device__ float s() const {
    if constexpr (!kDevice) return scale.value;
    else return scale.ptr ? rnd<T>(scale.get()) : scale.get();
  }
  __device__ float z() const {
    if constexpr (!kDevice) return zp.value;
    else return zp.ptr ? rnd<T>(zp.get()) : zp.get();
  }
  __device__ int8_t operator()(const T (&v)[1]) const {
    float t = rintf(rnd<T>(rnd<T>(div(static_cast<float>(v[0]), s())) + z()));
    if (!isnan(t)) t = fminf(fmaxf(t, qmin), qmax);  // eager's clamp lets NaN through
    return static_cast<int8_t>(t);
  }
  // bf16: two values per rounding (rnd2), two bytes per word (pack2_low_bytes). On an H200 at 50M elements:
  // bf16 0.066 -> 0.058 ms with the pairs; fp16 is slower this way (0.043 -> 0.048 ms), so it keeps the
  // one-element path.
  static constexpr bool kPairs = std::is_same_v<T, c10::BFloat16>;
  __device__ uint16_t pair(const float2 (&v)[1]) const {
    const float sc = s(), zc = z();
    float a = div(v[0].x, sc), b = div(v[0].y, sc);
    rnd2<T>(a, b);
    a += zc, b += zc;
    rnd2<T>(a, b);
    return pack2_low_bytes(i8_bits(a, qmin, qmax), i8_bits(b, qmin, qmax));
  }
};

at::Tensor quant_i8_cuda(const at::Tensor& x, double scale, double zp, int64_t qmin, int64_t qmax,
                         const std::optional<at::Tensor>& scale_t, const std::optional<at::Tensor>& zp_t) {
  FK_CHECK_CUDA(x);
  FK_CHECK_FLOATING(x);
  FK_CHECK_CONTIGUOUS(x);
  TORCH_CHECK(-128 <= qmin && qmin <= qmax && qmax <= 127, "fusekit: quant_i8 needs -128 <= qmin <= qmax <= 127, got [",
              qmin, ", ", qmax, "]");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(x.sizes(), x.options().dtype(at::kChar));
  auto s = scalar_arg("scale", scale, scale_t, x.device());
  auto z = scalar_arg("zp", zp, zp_t, x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "quant_i8", [&] {
    const auto* none = static_cast<const scalar_t*>(nullptr);
    if (s.ptr || z.ptr)
      launch_elementwise<1>(QuantI8<scalar_t, true>{s, z, float(qmin), float(qmax), 0.f}, out.data_ptr<int8_t>(),
                            x.data_ptr<scalar_t>(), none, none, x.numel());
    else
      launch_elementwise<1>(QuantI8<scalar_t, false>{s, z, float(qmin), float(qmax), 1.0f / s.value},
                            out.data_ptr<int8_t>(), x.data_ptr<scalar_t>(), none, none, x.numel());
  });
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("quant_i8", &fusekit::quant_i8_cuda); }
