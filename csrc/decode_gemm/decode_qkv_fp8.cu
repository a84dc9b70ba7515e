// fusekit::decode_qkv_fp8 -- q, k and v of a decode step as torchao's float8 dynamic per-row linears of one x: the
// three weights read in one launch, x quantized once.
//
//   def decode_qkv_fp8_ref(x, wq, sq, wk, sk, wv, sv):   # x [..., K] 16-bit, w* [N*, K] e4m3, s* [N*, 1] float32
//       return tuple(decode_linear_fp8_ref(x, w, s) for w, s in ((wq, sq), (wk, sk), (wv, sv)))
//
// Why: torchao quantizes x once per linear and Inductor keeps the three (a Triton kernel and aten._scaled_mm each):
// six launches for three passes over small weights (Llama-style k and v: 1 MB each). Here one launch with the three
// weights' column tiles side by side in its grid (decode_qkv's layout), above 8 rows after one quantize_rows.
//
// Contract: x [..., K] float16 or bfloat16, contiguous, 16-byte aligned, K a multiple of 16; each weight a contiguous,
// 16-byte aligned float8_e4m3fn [N*, K] with its contiguous float32 [N*] / [N*, 1] scales. Returns three [..., N*]
// contiguous tensors of x's dtype, each as decode_linear_fp8 computes it (decode_linear_fp8.cuh).
#include <torch/library.h>

#include <tuple>

#include "decode_gemm/decode_linear_fp8.cuh"

namespace fusekit {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_qkv_fp8_cuda(
    const at::Tensor& x, const at::Tensor& wq, const at::Tensor& sq, const at::Tensor& wk, const at::Tensor& sk,
    const at::Tensor& wv, const at::Tensor& sv) {
  return decode_fp8::qkv_op<false>(x, wq, sq, wk, sk, wv, sv, "decode_qkv_fp8");
}

}  // namespace
}  // namespace fusekit

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("decode_qkv_fp8", &fusekit::decode_qkv_fp8_cuda); }
