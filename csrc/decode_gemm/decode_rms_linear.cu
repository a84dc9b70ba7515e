// fusekit::decode_rms_linear -- transformers' RMSNorm and the linear (or SwiGLU's gate and up) after it, of a
// decode step's few rows, in one launch: the RMSNorm's kernel is gone.
//
//   def decode_rms_linear_ref(h, norm_w, w, w2=None, act="none", b=None, eps=1e-6):
//       h32 = h.float()                                          # h [..., K], norm_w [K]
//       x = norm_w * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
//       return decode_linear_ref(x, w, w2, act, b)               # decode_linear.cu
//
// Contract: decode_linear's for x = h (any act; no residual), and norm_w a contiguous, 16-byte aligned [K] of h's
// dtype and device, K > 0. Computed as rsqrt(mean(h^2) + eps) * linear(T(h * norm_w), w) in float32 (one rounding
// of the normalized row where eager has two: at most as far from the exact value as eager's).
//
// The kernels: decode_linear.cuh (RMSNorm section), decode_linear_tma.cuh (NORM); host side decode_linear_ops.cuh.
#include <torch/library.h>

#include "decode_linear_ops.cuh"

namespace fusekit {
namespace {

at::Tensor decode_rms_linear_cuda(const at::Tensor& h, const at::Tensor& norm_w, const at::Tensor& w,
                                  const std::optional<at::Tensor>& w2, c10::string_view act,
                                  const std::optional<at::Tensor>& b, double eps) {
  return decode_gemm::linear_op<true>("decode_rms_linear", h, w, w2, act, b, std::nullopt, &norm_w, eps);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_rms_linear", &fusekit::decode_rms_linear_cuda); }
