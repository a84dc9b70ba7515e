// fusekit::decode_rms_qkv -- transformers' RMSNorm and the q, k and v projections after it, of a decode step's few
// rows, in one launch: the RMSNorm's kernel is gone.
//
//   def decode_rms_qkv_ref(h, norm_w, wq, wk, wv, bq=None, bk=None, bv=None, eps=1e-6):
//       h32 = h.float()                                          # h [..., K], norm_w [K]
//       x = norm_w * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
//       return decode_qkv_ref(x, wq, wk, wv, bq, bk, bv)         # decode_qkv.cu
//
// Contract: decode_qkv's for x = h, and norm_w a contiguous, 16-byte aligned [K] of h's dtype and device, K > 0.
// Computed as rsqrt(mean(h^2) + eps) * linear(T(h * norm_w), w) (+ b) in float32, as decode_rms_linear.
//
// The kernels: decode_linear.cuh (RMSNorm section), decode_linear_tma.cuh (NORM); host side decode_linear_ops.cuh.
#include <torch/library.h>

#include "decode_linear_ops.cuh"

namespace fusekit {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_rms_qkv_cuda(const at::Tensor& h, const at::Tensor& norm_w,
                                                                   const at::Tensor& wq, const at::Tensor& wk,
                                                                   const at::Tensor& wv,
                                                                   const std::optional<at::Tensor>& bq,
                                                                   const std::optional<at::Tensor>& bk,
                                                                   const std::optional<at::Tensor>& bv, double eps) {
  return decode_gemm::qkv_op<true>("decode_rms_qkv", h, wq, wk, wv, bq, bk, bv, &norm_w, eps);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_rms_qkv", &fusekit::decode_rms_qkv_cuda); }
