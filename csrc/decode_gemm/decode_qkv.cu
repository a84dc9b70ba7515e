// fusekit::decode_qkv -- the q, k and v projections of a decode step: three linears of one input, the three
// weights read in one launch.
//
//   def decode_qkv_ref(x, wq, wk, wv, bq=None, bk=None, bv=None):
//       return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)   # x [..., K], w* [N*, K], b* [N*]
//
// Contract: x [..., K] contiguous, wq, wk, wv [N*, K] contiguous (each its own N), biases none or [N*]
// contiguous (each optional), one CUDA device, one dtype in {float16, bfloat16}, K and every N multiples of 8,
// 16-byte aligned x and weights. Any number of rows M; built for few (decode). Returns three [..., N*]
// contiguous tensors of x's dtype; float32 accumulation, the bias added in float32, each output rounded once,
// as eager's mm / addmm.
//
// Why: at a decode step's few rows each projection is one pass over its weight, and cuBLAS takes one launch
// per projection, each too small to fill an H100 (Llama-style k/v: 2 MB in 5.6 us, 13% of the copy
// bandwidth). One launch with the three weights' column tiles side by side in its grid streams all of them
// at once. The kernel is decode_linear's (decode_linear.cuh); at 33-64 rows the split-K one
// (decode_linear_splitk.cuh, launch_decode_linear's selection). Host side: decode_linear_ops.cuh.
#include <torch/library.h>

#include "decode_linear_ops.cuh"

namespace fusekit {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_qkv_cuda(const at::Tensor& x, const at::Tensor& wq,
                                                               const at::Tensor& wk, const at::Tensor& wv,
                                                               const std::optional<at::Tensor>& bq,
                                                               const std::optional<at::Tensor>& bk,
                                                               const std::optional<at::Tensor>& bv) {
  return decode_gemm::qkv_op<false>("decode_qkv", x, wq, wk, wv, bq, bk, bv);
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_qkv", &fusekit::decode_qkv_cuda); }
