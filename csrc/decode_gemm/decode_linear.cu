// fusekit::decode_linear -- the linears of a decode step: a few rows of activations against a weight
// matrix that is read once, straight from HBM, by as many thread blocks as fill the GPU.
//
//   def decode_linear_ref(x, w, w2=None, act="none"):
//       y = F.linear(x, w)                                       # x [..., K], w [N, K]
//       return y if act == "none" else F.silu(y) * F.linear(x, w2)   # "silu_mul": SwiGLU's gate and up
//
// Contract: x [..., K] contiguous, w (and w2) [N, K] contiguous, one CUDA device, one dtype in {float16,
// bfloat16}, K and N multiples of 8, 16-byte aligned data. Any number of rows M (the product of x's leading
// dims); the kernel is built for few (decode: M = batch x new tokens). Returns [..., N] contiguous, x's dtype.
// Float32 accumulation; "silu_mul" rounds the two products, silu(gate) and the result to x's dtype, as eager.
//
// The kernel, why it is shaped so and what it measured: decode_linear.cuh.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "decode_linear_splitk.cuh"  // launch_decode_linear, check_x, check_weight, rows, out_like
#include "checks.h"                  // describe
#include "dtype_dispatch.cuh"

namespace fusekit {
namespace {

using namespace decode_gemm;

at::Tensor decode_linear_cuda(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& w2,
                              c10::string_view act) {
  constexpr const char* kOp = "decode_linear";
  check_x(x, kOp);
  TORCH_CHECK(act == "none" || act == "silu_mul", "fusekit: decode_linear: act must be 'none' or 'silu_mul', got '",
              std::string(act), "'");
  const bool gated = act == "silu_mul";
  TORCH_CHECK(gated == w2.has_value(), "fusekit: decode_linear: w2 is needed by act='silu_mul' and only by it");
  check_weight(x, w, kOp, "w");
  if (gated) {
    check_weight(x, *w2, kOp, "w2");
    TORCH_CHECK(w2->size(0) == w.size(0), "fusekit: decode_linear: w and w2 must have one shape; got ", describe(w),
                ", ", describe(*w2));
  }
  const int64_t K = x.size(-1), N = w.size(0), M = rows(x, kOp);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = out_like(x, N);
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  Params p{};
  p.x = x.data_ptr(), p.w[0] = w.data_ptr(), p.w[1] = gated ? w2->data_ptr() : nullptr, p.out[0] = out.data_ptr();
  p.n[0] = static_cast<int>(N), p.parts = 1;
  p.m = static_cast<int>(M), p.k = static_cast<int>(K);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto dispatch = [&](auto tag) {
    using T = decltype(tag);
    if (gated) return launch_decode_linear<T, 2>(p, stream);
    launch_decode_linear<T, 1>(p, stream);
  };
  dispatch_half_bf16(x.scalar_type(), dispatch);
  return out;
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_linear", &fusekit::decode_linear_cuda); }
